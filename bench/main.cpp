// fp8wire-bench: sweeps of plain NCCL against fp8wire's FP8 paths, crossovers and the threshold
// profile (sweep), an alpha-beta model for fabrics not present (model), and the codec kernels
// against the copy-bandwidth ceiling (kernels).
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <cuda_runtime_api.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/command_line.hpp"
#include "common/commands.hpp"
#include "common/output_folder.hpp"
#include "common/output_file.hpp"
#include "common/rank_launcher.hpp"
#include "bench/host/hierarchy_model.hpp"
#include "bench/host/model_report.hpp"
#include "bench/host/planner_check.hpp"
#include "bench/host/profile.hpp"
#include "bench/host/results.hpp"
#include "bench/host/units.hpp"
#include "bench/sweep.hpp"

#if FP8WIRE_BENCH_HAVE_KERNELS && __has_include("bench/kernel_bench.hpp")
#include "bench/kernel_bench.hpp"
#define FP8WIRE_BENCH_KERNELS 1
#else
#define FP8WIRE_BENCH_KERNELS 0
#endif

namespace fb = fp8wire::bench;
using fp8wire::Collective;
using fp8wire::Path;

namespace {

// Parses the textual sweep options into SweepOptions; returns an error naming the argument.
struct SweepArgs {
  std::string collectives = "all", dtypes = "bf16", paths = "passthrough,two_shot,one_shot,ring";
  std::string min = "4KiB", max = "1GiB";
  std::string out_dir = ".", json, profile;
  std::string gather_transport = "auto";
  std::string transport = "nccl";
  bool no_check = false;
};

std::string parse_sweep(const SweepArgs& a, fb::SweepOptions& o) {
  o.collectives.clear();
  if (a.collectives == "all") {
    o.collectives.assign(std::begin(fb::kCollectives), std::end(fb::kCollectives));
  } else {
    for (const auto& s : fb::split_list(a.collectives)) {
      const auto c = fb::parse_collective(s);
      if (!c) return fmt::format("--collectives '{}': expected all_reduce, reduce_scatter, all_gather, all_to_all, send_recv or all", s);
      o.collectives.push_back(*c);
    }
  }
  o.dtypes.clear();
  for (const auto& s : fb::split_list(a.dtypes)) {
    const auto d = fb::parse_dtype(s);
    if (!d) return fmt::format("--dtypes '{}': expected bf16, fp16 or fp32", s);
    o.dtypes.push_back(*d);
  }
  o.paths = {Path::passthrough};  // the baseline every speedup refers to
  for (const auto& s : fb::split_list(a.paths)) {
    const auto p = fb::parse_path(s);
    if (!p) return fmt::format("--paths '{}': expected passthrough, two_shot, one_shot or ring", s);
    if (*p != Path::passthrough) o.paths.push_back(*p);
  }
  if (o.collectives.empty()) return "--collectives: empty list";
  if (o.dtypes.empty()) return "--dtypes: empty list";
  const auto min = fb::parse_bytes(a.min);
  if (!min || *min == 0) return fmt::format("--min '{}': expected a size > 0 such as 4KiB, 64MiB, 1GiB or plain bytes", a.min);
  const auto max = fb::parse_bytes(a.max);
  if (!max) return fmt::format("--max '{}': expected a size such as 4KiB, 64MiB, 1GiB or plain bytes", a.max);
  if (*max < *min) return fmt::format("--max '{}' is below --min '{}'", a.max, a.min);
  o.min_bytes = *min;
  o.max_bytes = *max;
  if (!(o.step > 1.0)) return fmt::format("--step {}: expected a growth factor > 1 (2 doubles the size each step)", o.step);
  if (o.repeats < 1 || o.repeats > fb::kMaxRepeats) return fmt::format("--repeats {}: expected 1..{}", o.repeats, fb::kMaxRepeats);
  if (o.iters < 1) return fmt::format("--iters {}: expected >= 1", o.iters);
  if (o.warmup < 0) return fmt::format("--warmup {}: expected >= 0", o.warmup);
  if (o.buffers < 1 || o.buffers > 64) return fmt::format("--buffers {}: expected 1..64", o.buffers);
  if (o.emulate_ranks < 0 || o.emulate_ranks == 1 || o.emulate_ranks > 64)
    return fmt::format("--emulate-ranks {}: expected 2..64 (0 = one rank per GPU)", o.emulate_ranks);
  if (o.ranks_per_host < 0 || (o.ranks_per_host > 0 && o.emulate_ranks > 0))
    return fmt::format("--ranks-per-host {}: expected a positive number of GPUs per host, with one rank per GPU "
                       "(not --emulate-ranks; there FP8WIRE_HIERARCHY_RANKS_PER_HOST forces fp8wire's map)",
                       o.ranks_per_host);
  if (o.fabric != "auto" && o.fabric != "both" && !fb::parse_fabric(o.fabric))
    return fmt::format("--fabric '{}': expected auto, nvlink, pcie, net or both", o.fabric);
  // auto leaves the loaded configuration alone (FP8WIRE_GATHER_TRANSPORT, or the planner's choice).
  const auto gather = fb::parse_gather_transport_option(a.gather_transport);
  if (!gather)
    return fmt::format("--gather-transport '{}': expected auto, allgather, sendrecv or both", a.gather_transport);
  o.gather_transports = *gather;
  if (a.transport != "nccl" && a.transport != "direct" && a.transport != "peer_memory" && a.transport != "host_memory" &&
      a.transport != "both")
    return fmt::format("--transport '{}': expected nccl, direct, peer_memory, host_memory or both", a.transport);
  o.transport = a.transport;
  if (!(o.timeout_s >= 0)) return fmt::format("--timeout {}: expected seconds >= 0", o.timeout_s);
  if (!(o.bootstrap_timeout_s > 0)) return fmt::format("--bootstrap-timeout {}: expected seconds > 0", o.bootstrap_timeout_s);
  o.check = !a.no_check;
  o.json_path = a.json.empty() ? a.out_dir + "/fp8wire-sweep.json" : a.json;
  o.profile_path = a.profile.empty() ? a.out_dir + "/fp8wire-profile.toml" : a.profile;
  return {};
}

// Creates the folders of the sweep's JSON and profile before any rank starts: a sweep can run for
// many minutes, and its results must not be lost at the end to a folder that does not exist. Done
// once the sweep can run at all, and taken back (fail_sweep) when it ends without results, so a
// sweep that fails leaves no empty folder behind.
std::string make_output_folders(const fb::SweepOptions& o, std::vector<fp8wire::OutputFolder>& made) {
  for (const std::string* path : {&o.json_path, &o.profile_path}) {
    const std::filesystem::path dir = std::filesystem::path(*path).parent_path();
    if (dir.empty()) continue;
    std::string error;
    if (!made.emplace_back().create(dir, error)) return fmt::format("{} (for '{}')", error, *path);
  }
  return {};
}

int fail_sweep(const std::vector<fp8wire::OutputFolder>& made) {
  for (auto it = made.rbegin(); it != made.rend(); ++it) it->remove_if_empty();
  return 2;
}

std::string self_exe() {
  char buf[PATH_MAX];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return {};
  buf[n] = 0;
  return buf;
}


// Launcher: one round of ranks per fabric; "both" adds a side-by-side report and a merged profile.
int launch_sweep(const fb::SweepOptions& o, const SweepArgs& a, const std::vector<std::string>& argv) {
  int nranks = o.emulate_ranks;
  // Asked here, once, rather than by every rank: without a GPU each would say so and fail.
  int ndev = 0;
  if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
    std::fprintf(stderr, "fp8wire-bench sweep: no CUDA device visible; a sweep measures collectives on GPUs (%s "
                         "predicts without one)\n", fp8wire::tool_command("bench", "model --hierarchy").c_str());
    return 2;
  }
  if (nranks == 0) {
    nranks = ndev;
    if (nranks < 2) {
      std::fprintf(stderr, "fp8wire-bench sweep: 1 GPU visible; a collective needs 2+ ranks: use --emulate-ranks N\n");
      return 2;
    }
  }
  const std::string exe = self_exe();
  if (exe.empty()) {
    std::fprintf(stderr, "fp8wire-bench sweep: cannot find its own executable (/proc/self/exe)\n");
    return 2;
  }
  std::vector<fp8wire::OutputFolder> made;
  if (const std::string error = make_output_folders(o, made); !error.empty()) {
    std::fprintf(stderr, "fp8wire-bench sweep: %s\n", error.c_str());
    return fail_sweep(made);
  }
  const std::vector<std::string> fabrics =
      o.fabric == "both" ? std::vector<std::string>{"auto", "pcie"} : std::vector<std::string>{o.fabric};
  std::vector<std::string> jsons;
  int worst = 0;
  for (const auto& fabric : fabrics) {
    fp8wire::LaunchSpec spec;
    spec.argv = {exe};
    spec.argv.insert(spec.argv.end(), argv.begin() + 1, argv.end());
    std::string json = o.json_path, profile = o.profile_path;
    if (fabrics.size() > 1) {
      json = fmt::format("{}/fp8wire-sweep-{}.json", a.out_dir, fabric);
      profile = fmt::format("{}/fp8wire-profile-{}.toml", a.out_dir, fabric);
    }
    for (const char* s : {"--fabric", fabric.c_str(), "--json", json.c_str(), "--profile", profile.c_str()}) spec.argv.push_back(s);
    spec.nranks = nranks;
    spec.timeout_s = o.timeout_s;
    // NCCL reads these when the communicator is created; P2P off keeps traffic off NVLink.
    if (fabric == "pcie") spec.env.push_back({"NCCL_P2P_DISABLE", "1"});
    spec.one_gpu = o.emulate_ranks > 0;
    if (o.ranks_per_host > 0) {
      if (nranks % o.ranks_per_host != 0) {
        std::fprintf(stderr, "fp8wire-bench sweep: --ranks-per-host %d does not divide the %d ranks\n", o.ranks_per_host,
                     nranks);
        return fail_sweep(made);
      }
      spec.env_per_rank = fp8wire::host_blocks_env(nranks, o.ranks_per_host);
    }
    std::fprintf(stderr, "fp8wire-bench sweep: %d ranks%s, fabric %s\n", nranks, o.emulate_ranks ? " on one GPU" : "", fabric.c_str());
    const fp8wire::LaunchResult res = fp8wire::launch_local_ranks(spec);
    if (!res.ok) {
      // Exit code 1 from rank 0 alone is "a check failed" (already printed); anything else is an error.
      const bool check_failure = res.exit_codes[0] == 1 &&
                                 std::all_of(res.exit_codes.begin() + 1, res.exit_codes.end(), [](int c) { return c == 0 || c == 143; });
      if (check_failure) {
        worst = std::max(worst, 1);
      } else {
        std::fprintf(stderr, "fp8wire-bench sweep: %s\n", res.error.c_str());
        return fail_sweep(made);
      }
    }
    jsons.push_back(json);
    // "both" is NVLink vs host memory. Where the GPUs are not joined by NVLink the detected fabric
    // already is pcie (or net), and a P2P-disabled round would measure it again under the same label.
    if (fabrics.size() > 1 && fabric == "auto") {
      std::string error;
      const auto first = fb::read_sweep_file(json, error);
      if (first && first->machine.fabric != fp8wire::Fabric::nvlink) {
        std::fprintf(stderr, "fp8wire-bench sweep: --fabric both: the detected fabric is %s, not nvlink; the pcie round "
                             "would measure it again, skipped\n", fb::fabric_name(first->machine.fabric));
        break;
      }
    }
  }
  if (fabrics.size() > 1) {
    std::vector<fb::SweepResult> results;
    std::vector<fb::FabricProfile> profiles;
    for (const auto& path : jsons) {
      std::string error;
      auto r = fb::read_sweep_file(path, error);
      if (!r) {
        std::fprintf(stderr, "fp8wire-bench sweep: %s\n", error.c_str());
        return 2;
      }
      const auto crossovers = fb::analyze_crossovers(*r, o.crossover);
      profiles.push_back(fb::profile_from_sweep(*r, crossovers, fb::calibrate(*r)));
      results.push_back(std::move(*r));
    }
    std::printf("\n%s", fb::render_fabric_comparison(results, o.crossover).c_str());
    if (std::string error; !fp8wire::write_file_atomically(o.profile_path, fb::render_profile_toml(profiles), error)) {
      std::fprintf(stderr, "fp8wire-bench sweep: --profile: %s\n", error.c_str());
      return 2;
    }
    std::printf("# wrote %s (both fabrics)\n", o.profile_path.c_str());
  }
  return worst;
}

int run_model(const std::vector<std::string>& files, const fb::ModelOptions& options, const std::string& json_out) {
  std::vector<fb::SweepResult> sweeps;
  for (const auto& path : files) {
    std::string error;
    auto r = fb::read_sweep_file(path, error);
    if (!r) {
      std::fprintf(stderr, "fp8wire-bench model: %s\n", error.c_str());
      return 2;
    }
    sweeps.push_back(std::move(*r));
  }
  const fb::ModelReport report = fb::model_report(sweeps, options);
  std::printf("%s", report.text.c_str());
  if (!json_out.empty()) {
    if (std::string error; !fp8wire::write_file_atomically(json_out, report.json.dump(1) + "\n", error)) {
      std::fprintf(stderr, "fp8wire-bench model: --json: %s\n", error.c_str());
      return 2;
    }
  }
  return 0;
}

int run_report(const std::vector<std::string>& files, const fb::CrossoverOptions& crossover,
               const std::string& profile_path) {
  std::vector<fb::SweepResult> results;
  std::vector<fb::FabricProfile> profiles;
  // The configuration a job would run with (FP8WIRE_CONFIG, FP8WIRE_*): its planner's picks against
  // each recorded sweep.
  const fp8wire::ConfigResult loaded = fp8wire::load_config();
  if (!loaded.ok()) {
    for (const auto& e : loaded.errors) std::fprintf(stderr, "fp8wire-bench report: config: %s\n", e.message().c_str());
    return 2;
  }
  for (const auto& path : files) {
    std::string error;
    auto r = fb::read_sweep_file(path, error);
    if (!r) {
      std::fprintf(stderr, "fp8wire-bench report: %s\n", error.c_str());
      return 2;
    }
    const auto reports = fb::analyze_crossovers(*r, crossover);
    std::vector<std::pair<Collective, fb::DType>> shown;
    for (const auto& p : r->points) {
      const auto key = std::make_pair(p.collective, p.dtype);
      if (std::find(shown.begin(), shown.end(), key) != shown.end()) continue;
      shown.push_back(key);
      std::printf("%s\n", fb::render_table(*r, p.collective, p.dtype).c_str());
    }
    std::printf("%s\n", fb::render_crossovers(*r, reports).c_str());
    fp8wire::Config config = loaded.config;
    std::printf("%s\n", fb::render_planner_picks(fb::planner_picks(*r, config, r->machine.fabric), r->machine).c_str());
    for (const auto& f : fb::failed_checks(*r)) std::printf("FAIL check %s\n", f.c_str());
    profiles.push_back(fb::profile_from_sweep(*r, reports, fb::calibrate(*r)));
    results.push_back(std::move(*r));
  }
  if (results.size() > 1) std::printf("%s\n", fb::render_fabric_comparison(results, crossover).c_str());
  if (!profile_path.empty()) {
    if (std::string error; !fp8wire::write_file_atomically(profile_path, fb::render_profile_toml(profiles), error)) {
      std::fprintf(stderr, "fp8wire-bench report: --profile: %s\n", error.c_str());
      return 2;
    }
    std::printf("# wrote %s\n", profile_path.c_str());
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"fp8wire-bench: plain NCCL vs fp8wire FP8 collectives; crossovers, threshold profile, model"};
  app.require_subcommand(1);

  // --- sweep --------------------------------------------------------------------------------------
  fb::SweepOptions sweep;
  SweepArgs sa;
  auto* s = app.add_subcommand("sweep", "time plain NCCL against fp8wire's paths over a range of sizes");
  s->add_option("--collectives", sa.collectives, "all_reduce,reduce_scatter,all_gather,all_to_all,send_recv or all")->capture_default_str();
  s->add_option("--dtypes", sa.dtypes, "bf16,fp16,fp32")->capture_default_str();
  s->add_option("--paths", sa.paths, "FP8 paths to time besides passthrough: two_shot,one_shot,ring")
      ->capture_default_str()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  s->add_option("--min", sa.min, "smallest full-buffer size (4KiB, 64MiB, 1GiB, bytes)")->capture_default_str();
  s->add_option("--max", sa.max, "largest full-buffer size")->capture_default_str();
  s->add_option("--step", sweep.step, "size growth factor per step")->capture_default_str();
  s->add_option("--warmup", sweep.warmup, "untimed operations per point")->capture_default_str();
  s->add_option("--repeats", sweep.repeats, "timed samples per point (median, spread)")->capture_default_str();
  s->add_option("--iters", sweep.iters, "operations per timed sample")->capture_default_str();
  s->add_option("--buffers", sweep.buffers, "input/output buffers rotated across operations")->capture_default_str();
  s->add_option("--ranks-per-host", sweep.ranks_per_host,
                "one rank per GPU, NCCL told the GPUs form hosts of N (NCCL_HOSTID per block: a stand-in for a "
                "job spanning hosts); 0 = one host")
      ->capture_default_str();
  s->add_option("--emulate-ranks", sweep.emulate_ranks, "N ranks on one GPU (NCCL_HOSTID per rank, sockets; side by side under a private MPS daemon unless FP8WIRE_MPS=0); 0 = one rank per GPU")->capture_default_str();
  s->add_option("--fabric", sweep.fabric, "auto | nvlink | pcie (NCCL_P2P_DISABLE=1) | net | both (auto, then pcie)")
      ->capture_default_str()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  s->add_option("--transport", sa.transport,
                "what carries the FP8 paths: nccl | direct (peer GPU memory, or host memory under "
                "NCCL_P2P_DISABLE=1) | peer_memory | host_memory | both (NCCL's and the direct one)")
      ->capture_default_str();
  s->add_option("--gather-transport", sa.gather_transport,
                "FP8 gather step: auto (configuration as loaded: FP8WIRE_GATHER_TRANSPORT, else the planner's "
                "choice) | allgather (ncclAllGather) | sendrecv (grouped ncclSend/ncclRecv) | both (every path "
                "with a gather step timed with each)")
      ->capture_default_str();
  s->add_option("--timeout", sweep.timeout_s, "seconds before a hung launch is killed (0 = none)")->capture_default_str();
  s->add_option("--bootstrap-timeout", sweep.bootstrap_timeout_s, "seconds a rank waits for rank 0's NCCL id")->capture_default_str();
  s->add_option("--out", sa.out_dir, "folder for the default JSON and profile")->capture_default_str();
  s->add_option("--json", sa.json, "sweep JSON (default <out>/fp8wire-sweep.json)")->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  s->add_option("--profile", sa.profile, "TOML threshold profile (default <out>/fp8wire-profile.toml)")
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  s->add_flag("--no-check", sa.no_check, "skip the correctness checks");
  s->add_option("--tie-margin", sweep.crossover.min_margin, "relative difference below which sizes tie")->capture_default_str();
  s->add_option("--noise-sigmas", sweep.crossover.noise_sigmas, "tolerance in robust noise units")->capture_default_str();

  // --- model --------------------------------------------------------------------------------------
  std::vector<std::string> model_files;
  fb::ModelOptions model;
  std::string model_json, model_dtype = "bf16";
  std::vector<int> model_nranks;
  double codec_gbps = 0, launch_us = 0;
  auto* m = app.add_subcommand("model", "predict crossovers for fabrics not present; check against measured sweeps");
  bool model_hierarchy = false;
  m->add_option("sweeps", model_files, "sweep JSON files written by fp8wire-bench sweep")->check(CLI::ExistingFile);
  m->add_flag("--hierarchy", model_hierarchy,
              "predict jobs spanning hosts: NCCL's ring, flat FP8 and hierarchical FP8 for 2-64 hosts x 8 GPUs, "
              "25-400 Gb/s cards, NVLink or PCIe inside (needs no sweep)");
  m->add_option("--nranks", model_nranks, "world sizes to predict for (default 8, plus each sweep's)");
  m->add_option("--codec-gbps", codec_gbps, "override the measured codec throughput (GB/s of caller dtype)");
  m->add_option("--launch-us", launch_us, "override the per-kernel launch cost");
  m->add_option("--dtype", model_dtype, "dtype of the predictions")->capture_default_str();
  m->add_option("--json", model_json, "write the report as JSON");

  // --- report -----------------------------------------------------------------------------------
  std::vector<std::string> report_files;
  std::string report_profile;
  fb::CrossoverOptions report_crossover;
  auto* rep = app.add_subcommand("report", "re-render tables, crossovers and a merged profile from sweep JSONs "
                                           "(e.g. one torchrun sweep per fabric)");
  rep->add_option("sweeps", report_files, "sweep JSON files")->required()->check(CLI::ExistingFile);
  rep->add_option("--profile", report_profile, "write one TOML profile holding every fabric given");
  rep->add_option("--tie-margin", report_crossover.min_margin, "relative difference below which sizes tie")->capture_default_str();
  rep->add_option("--noise-sigmas", report_crossover.noise_sigmas, "tolerance in robust noise units")->capture_default_str();

  // --- kernels ------------------------------------------------------------------------------------
  auto* k = app.add_subcommand("kernels", "codec kernels against the copy-bandwidth ceiling");
  std::string kernel_sizes = "1MiB,16MiB,64MiB,256MiB", kernel_dtype = "bf16", kernel_list, kernel_json;
  std::string kernel_format = "e4m3";
  int kernel_warmup = 5, kernel_repeats = 30, kernel_k = 8;
  uint32_t kernel_block = 128;
  k->add_option("--sizes", kernel_sizes, "caller-dtype bytes per buffer")->capture_default_str();
  k->add_option("--dtype", kernel_dtype, "bf16, fp16 or fp32")->capture_default_str();
  k->add_option("--kernels", kernel_list, "quantize,dequantize,reduce,reduce_requant,naive (default all)");
  k->add_option("--k", kernel_k, "inputs of the fused reduce (a world size)")->capture_default_str();
  k->add_option("--format", kernel_format, "e4m3 or e5m2")->capture_default_str();
  k->add_option("--block", kernel_block, "elements per scale block")->capture_default_str();
  k->add_option("--warmup", kernel_warmup, "untimed runs")->capture_default_str();
  k->add_option("--repeats", kernel_repeats, "timed runs (median)")->capture_default_str();
  k->add_option("--json", kernel_json, "write the results as JSON");

  if (const auto status = fp8wire::parse_command_line(app, argc, argv, "fp8wire-bench")) return *status;
  const std::vector<std::string> args(argv, argv + argc);

  if (s->parsed()) {
    sweep.as_json = nlohmann::json::array();
    for (int i = 1; i < argc; ++i) sweep.as_json.push_back(argv[i]);
    if (const std::string error = parse_sweep(sa, sweep); !error.empty()) {
      std::fprintf(stderr, "fp8wire-bench sweep: %s\n", error.c_str());
      return 2;
    }
    std::string env_error;
    const auto env = fp8wire::rank_env_from_environment(env_error);
    if (!env_error.empty()) {
      std::fprintf(stderr, "fp8wire-bench sweep: %s\n", env_error.c_str());
      return 2;
    }
    if (!env) return launch_sweep(sweep, sa, args);
    if (sweep.fabric == "both") {
      std::fprintf(stderr, "fp8wire-bench sweep: --fabric both needs the built-in launcher (NCCL reads NCCL_P2P_DISABLE "
                           "once per process); under torchrun run once per fabric\n");
      return 2;
    }
    std::vector<fp8wire::OutputFolder> made;
    if (const std::string error = make_output_folders(sweep, made); !error.empty()) {
      std::fprintf(stderr, "fp8wire-bench sweep: %s\n", error.c_str());
      return 2;
    }
    fp8wire::RankEnv rank_env = *env;
    // torchrun's own rendezvous store already listens on MASTER_PORT; the NCCL id goes one above.
    if (std::getenv("TORCHELASTIC_RUN_ID")) rank_env.master_port += 1;
    return fb::run_sweep_rank(sweep, rank_env);
  }

  if (m->parsed()) {
    if (model_hierarchy) {
      std::printf("%s", fb::render_hierarchy_table(fb::hierarchy_table()).c_str());
      if (model_files.empty()) return 0;
    } else if (model_files.empty()) {
      std::fprintf(stderr, "fp8wire-bench model: give sweep JSON files, or --hierarchy\n");
      return 2;
    }
    const auto d = fb::parse_dtype(model_dtype);
    if (!d) {
      std::fprintf(stderr, "fp8wire-bench model: --dtype '%s': expected bf16, fp16 or fp32\n", model_dtype.c_str());
      return 2;
    }
    model.dtype = *d;
    if (!model_nranks.empty()) model.nranks = model_nranks;
    for (int n : model.nranks)
      if (n < 2) {
        std::fprintf(stderr, "fp8wire-bench model: --nranks %d: expected >= 2\n", n);
        return 2;
      }
    if (codec_gbps < 0 || launch_us < 0) {
      std::fprintf(stderr, "fp8wire-bench model: --codec-gbps and --launch-us must be >= 0\n");
      return 2;
    }
    if (codec_gbps > 0) model.codec_gbps = codec_gbps;
    if (launch_us > 0) model.launch_us = launch_us;
    return run_model(model_files, model, model_json);
  }

  if (rep->parsed()) return run_report(report_files, report_crossover, report_profile);

  if (k->parsed()) {
#if FP8WIRE_BENCH_KERNELS
    fb::KernelBenchOptions ko;
    ko.sizes.clear();
    for (const auto& text : fb::split_list(kernel_sizes)) {
      const auto bytes = fb::parse_bytes(text);
      if (!bytes || *bytes == 0) {
        std::fprintf(stderr, "fp8wire-bench kernels: --sizes '%s': expected sizes such as 1MiB,64MiB\n", text.c_str());
        return 2;
      }
      ko.sizes.push_back(*bytes);
    }
    const auto d = fb::parse_dtype(kernel_dtype);
    if (!d) {
      std::fprintf(stderr, "fp8wire-bench kernels: --dtype '%s': expected bf16, fp16 or fp32\n", kernel_dtype.c_str());
      return 2;
    }
    ko.dtype = *d == fb::DType::bf16 ? fp8wire::quant::ElemType::bf16
               : *d == fb::DType::f16 ? fp8wire::quant::ElemType::f16
                                      : fp8wire::quant::ElemType::f32;
    if (kernel_format != "e4m3" && kernel_format != "e5m2") {
      std::fprintf(stderr, "fp8wire-bench kernels: --format '%s': expected e4m3 or e5m2\n", kernel_format.c_str());
      return 2;
    }
    ko.format.fp8 = kernel_format == "e4m3" ? fp8wire::Fp8Format::e4m3 : fp8wire::Fp8Format::e5m2;
    ko.format.block = kernel_block;  // validated by run_kernel_bench (quant::validate)
    ko.kernels = fb::split_list(kernel_list);
    ko.k = kernel_k;
    ko.warmup = kernel_warmup;
    ko.repeats = kernel_repeats;
    ko.json_path = kernel_json;
    return fb::run_kernel_bench(ko);
#else
    std::fprintf(stderr, "fp8wire-bench kernels: this build has no kernel benchmarks (bench/kernel_bench.cu missing)\n");
    return 2;
#endif
  }
  return 0;
}
