// The profiler's call-begin mark (quant/call_mark.cu, launched by sched/exec/pipeline.cpp) over the
// simulated machine: with the profiler's call hooks installed every FP8 call launches exactly one,
// over NCCL's transport and over a direct one; without them none; and a mark that fails to launch
// leaves the call's result as it was (the mark only informs the profiler).
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "common/log.hpp"
#include "sched/engine/accounting.hpp"
#include "tests/sched/sim_job.hpp"

using namespace fp8wire;
using namespace fp8wire::simtest;

namespace {
const CallHooks kHooks{[](const CallRecord&) {}, [](const CallRecord&) {}};

// Codec launches each rank made in its first call.
std::vector<int> codec_launches(const Outcome& o) {
  std::vector<int> n;
  for (size_t r = 0; r < o.after_calls.size(); ++r)
    n.push_back(o.after_calls[r][static_cast<size_t>(sim::Site::codec)] -
                o.after_setup[r][static_cast<size_t>(sim::Site::codec)]);
  return n;
}
}  // namespace

TEST_CASE("call-begin mark: one per FP8 call while the profiler's hooks are in, none without; its failure is harmless") {
  log_set_level(LogLevel::error);
  for (DirectMode mode : {DirectMode::off, DirectMode::host_memory}) {
    for (Path path : {Path::one_shot, Path::two_shot}) {
      CAPTURE(to_string(path));
      CAPTURE(static_cast<int>(mode));
      Run cfg;
      cfg.config.direct_transport = mode;
      cfg.config.direct_assume_one_host = true;  // simulated ranks are separate hosts to NCCL
      cfg.config.direct_window_bytes = 1 << 20;
      const Spec spec{Collective::all_reduce, path, DataType::bf16, ReduceOp::sum, 4099, 5};
      const auto inputs = inputs_for(spec, 3);
      const Outcome plain = run(cfg, spec, inputs);
      REQUIRE(check_clean(cfg, spec, inputs, plain) == "");
      set_call_hooks(&kHooks);
      const Outcome marked = run(cfg, spec, inputs);
      set_call_hooks(nullptr);
      REQUIRE(check_clean(cfg, spec, inputs, marked) == "");
      const Carrier want = mode == DirectMode::off ? Carrier::nccl : Carrier::host_memory;
      for (size_t r = 0; r < inputs.size(); ++r) {
        CHECK(marked.transports[r] == want);
        CHECK(codec_launches(marked)[r] == codec_launches(plain)[r] + 1);
      }
      // The mark is the call's first launch: fail it on rank 0; every rank still ends right.
      Run faulty = cfg;
      faulty.fault = {.rank = 0, .site = sim::Site::codec,
                      .index = marked.after_setup[0][static_cast<size_t>(sim::Site::codec)]};
      set_call_hooks(&kHooks);
      const Outcome lost = run(faulty, spec, inputs);
      set_call_hooks(nullptr);
      CHECK(check_clean(faulty, spec, inputs, lost) == "");
      CHECK(codec_launches(lost)[0] == codec_launches(marked)[0]);  // tried, failed, counted
    }
  }
}
