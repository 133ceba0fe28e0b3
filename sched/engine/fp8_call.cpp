// Running one FP8 route by its recipe (sched/plan/recipe.hpp): its record, its stage program, the
// pipeline executor, the error that makes the communicator's FP8 path unusable. Everything about how
// the call runs is the recipe's; nothing here reads the configuration. A route that fell back because
// no stage fits the scratch issues the real call here (its record still says fallback, on every rank
// alike), as does a call whose tensor the guard has switched to full precision (a state every rank
// advances alike, from votes every rank received).
#include <optional>

#include "common/log.hpp"
#include "common/nvtx.hpp"
#include "common/status.hpp"
#include "sched/algorithms/algorithms.hpp"
#include "sched/comm/telemetry_monitor.hpp"
#include "sched/engine/engine_impl.hpp"
#include "sched/exec/measured_program.hpp"
#include "sched/plan/recipe.hpp"
#include "sched/transport/direct_windows.hpp"

namespace fp8wire::sched {

namespace {

// Several grouped all-reduces packed through the staging area into one: copied in on the produce
// lane before the first stage, copied out on the transfer lane after the last stage's gather (its
// last part), all between the call's fork and join.
class CoalescedAllReduce final : public StageProgram {
 public:
  CoalescedAllReduce(StageProgram& inner, const Pending* items, size_t batch, char* staging, size_t elem_size)
      : inner_(&inner), items_(items), batch_(batch), staging_(staging), es_(elem_size) {}
  ncclResult_t produce(StageOps& ops, const Stage& st) override {
    if (st.index == 0) {
      size_t off = 0;
      for (size_t i = 0; i < batch_; ++i) {
        const size_t bytes = items_[i].call.count * es_;
        FP8WIRE_TRY(ops.copy(staging_ + off, items_[i].call.send, bytes));
        off += bytes;
      }
    }
    return inner_->produce(ops, st);
  }
  ncclResult_t finish(StageOps& ops, const Stage& st) override { return inner_->finish(ops, st); }
  bool has_gather() const override { return inner_->has_gather(); }
  ncclResult_t gather(StageOps& ops, const Stage& st) override {
    FP8WIRE_TRY(inner_->gather(ops, st));
    if (!st.last) return ncclSuccess;
    size_t off = 0;
    for (size_t i = 0; i < batch_; ++i) {
      const size_t bytes = items_[i].call.count * es_;
      FP8WIRE_TRY(ops.copy(items_[i].call.recv, staging_ + off, bytes));
      off += bytes;
    }
    return ncclSuccess;
  }

 private:
  StageProgram* inner_;
  const Pending* items_;
  size_t batch_;
  char* staging_;
  size_t es_;
};

size_t send_bytes_of(const Call& c, int nranks, size_t es) {
  const bool per_rank = c.collective == Collective::reduce_scatter || c.collective == Collective::all_to_all;
  return c.count * es * (per_rank ? static_cast<size_t>(nranks) : 1);
}
size_t recv_bytes_of(const Call& c, int nranks, size_t es) {
  const bool per_rank = c.collective == Collective::all_gather || c.collective == Collective::all_to_all;
  return c.count * es * (per_rank ? static_cast<size_t>(nranks) : 1);
}
const char* range_name(Collective c, Path p) {
  if (c == Collective::reduce_scatter) return "fp8wire reduce_scatter";
  if (c == Collective::all_gather) return "fp8wire all_gather";
  if (c == Collective::all_to_all) return "fp8wire all_to_all";
  return p == Path::one_shot ? "fp8wire one_shot" : p == Path::ring ? "fp8wire ring" : "fp8wire two_shot";
}

}  // namespace

ncclResult_t Engine::Impl::run_fp8(const CommRef& sref, const Call& c, const Route& route, uint64_t seq, uint64_t issue,
                                   uint64_t feedback_key, const Pending* items, size_t batch, JoinList* joins) {
  CommState& s = *sref;
  // The route never depends on capture (it was decided from agreed facts): capture only decides
  // which join events are used and that nothing is allocated. A failing query is an error, never
  // a guess that could differ between ranks.
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (const cudaError_t err = platform->cuda.StreamIsCapturing(c.stream, &capture); err != cudaSuccess) {
    FP8WIRE_ERROR("comm {}: cudaStreamIsCapturing failed ({}); the FP8 call is not run",
                  s.id, platform->cuda.GetErrorString(err));
    s.fail(ncclUnhandledCudaError);
    return ncclUnhandledCudaError;
  }
  const bool capturing = capture != cudaStreamCaptureStatusNone;

  CallRecord rec;
  rec.seq = seq;
  rec.comm_id = s.id;
  rec.kind = kind_of(c);
  rec.path = route.path;
  rec.gather = route.gather;
  rec.transport = route.carrier;
  rec.dtype = c.dtype;
  rec.op = c.op;
  rec.nranks = s.nranks;
  rec.rank = s.rank;
  rec.count = c.count;
  rec.issue_ns = issue;
  quant::ElemType type = quant::ElemType::f32;
  elem_type_of(dtype_of(c.dtype), &type);
  const size_t es = quant::elem_size(type);
  const CommIdentity who = s.identity();
  rec.plain_wire_bytes = plain_wire_bytes(c, &who);
  if (batch > 1) {
    rec.coalesced_calls = static_cast<uint32_t>(batch);
    rec.count = 0;
    rec.plain_wire_bytes = 0;
    for (size_t i = 0; i < batch; ++i) {
      rec.count += items[i].call.count;
      rec.plain_wire_bytes += plain_wire_bytes(items[i].call, &who);
    }
  }
  rec.app_bytes = rec.count * es;
  CallHookScope hooks(rec);
  NvtxRange range(range_name(c.collective, route.algorithm));

  // The recipe (sched/plan/recipe.hpp), with the guard's state of the call's scope as its input.
  CallContext context;
  context.capturing = capturing;
  context.grouped = joins != nullptr;
  context.batch = batch;
  context.feedback_key = feedback_key;
  ncclResult_t res = ncclSuccess;
  if (s.telemetry) {
    res = s.telemetry->settle(guard_scope(batch, feedback_key), capturing, &context.scope);
    context.audit_calls = s.telemetry->audit_calls();
  }
  CallShape shape = shape_of(c, &s);
  shape.count = rec.count;
  const Recipe recipe = recipe_for(config, facts_of(s), shape, route, context);
  TelemetryMonitor::Call measured;
  bool measuring_recorded = false;
  if (res == ncclSuccess && recipe.watch.active) {
    if (!s.telemetry) s.telemetry = std::make_unique<TelemetryMonitor>(*s.platform, s.id, s.rank);
    res = s.telemetry->begin(recipe.watch, c.collective, route.path, seq, &measured);
  }
  if (res != ncclSuccess) {
    s.fail(res);
  } else if (recipe.plain()) {
    if (route.path == Path::fallback)  // no pipeline stage fits the scratch (route_fp8)
      FP8WIRE_WARN_ONCE("the communicator's scratch ({}: scratch.max_bytes, or what scratch.process_max_bytes had "
                        "left at its creation) is too small for one pipeline stage of a {} on {} ranks; passing through",
                        format_size(s.res.layout.total_bytes), to_string(c.collective), s.nranks);
    rec.path = Path::fallback;
    rec.gather = GatherMethod::automatic;
    rec.transport = Carrier::nccl;
    rec.wire_bytes = rec.plain_wire_bytes;
    if (batch > 1) {
      for (size_t i = 0; i < batch && res == ncclSuccess; ++i) res = issue_plain(items[i].call);
    } else {
      res = issue_plain(c);
    }
  } else {
    Fp8Args a;
    a.src = batch > 1 ? s.res.scratch : c.send;
    a.dst = batch > 1 ? s.res.scratch : c.recv;
    a.count = rec.count;
    a.post = recipe.post;
    a.gather = route.gather;
    a.protocol = recipe.direct.protocol;
    a.device_set_bytes = recipe.direct.device_set_bytes;
    if (recipe.feedback)
      a.residual = s.feedback.residual_for(feedback_key, c.count, dtype_of(c.dtype), s.res.produce, capturing);
    RouteProgram chosen(c.collective, route, a, s);
    StageProgram* program = &chosen.get();
    CoalescedAllReduce coalesced(*program, items, batch, s.res.scratch, es);
    if (batch > 1) program = &coalesced;
    std::optional<MeasuredProgram> measuring;
    quant::LaunchOptions call_launch;
    call_launch.path = recipe.convert_path;
    if (measured.slot >= 0) {
      measuring.emplace(*program, *s.telemetry, measured.slot, platform->cuda);
      program = &*measuring;
      call_launch.telemetry = measured.options;
    }

    // The audit: the same collective in full precision through the real NCCL, on a copy of the input
    // made before the FP8 call may overwrite it (in place), compared once both are back.
    if (recipe.watch.audited) {
      const size_t in_bytes = send_bytes_of(c, s.nranks, es);
      void *in = nullptr, *out = nullptr;
      res = s.telemetry->audit_buffers(in_bytes, recv_bytes_of(c, s.nranks, es), &in, &out);
      if (res == ncclSuccess &&
          platform->cuda.MemcpyAsync(in, c.send, in_bytes, cudaMemcpyDeviceToDevice, c.stream) != cudaSuccess)
        res = ncclUnhandledCudaError;
      if (res == ncclSuccess) {
        Call exact = c;
        exact.send = in;
        exact.recv = out;
        res = issue_plain(exact);
      }
    }

    if (res == ncclSuccess) {
      StageOps ops(s, type, recipe.format, call_launch);
      if (route.carrier != Carrier::nccl) ops.use_direct(s.direct.get(), recipe.direct);
      PipelineRun run(sref, c.stream, capturing, call_hooks() != nullptr, joins);
      res = run.finish(run.run(*program, ops, rec.count, route.stage_elems));
      rec.wire_bytes = ops.wire_bytes();
      measuring_recorded = measuring && measuring->recorded();
    }
    if (res == ncclSuccess && recipe.watch.audited)
      res = s.telemetry->audit_read_back(c.stream, c.recv, recv_bytes_of(c, s.nranks, es), dtype_of(c.dtype),
                                         c.collective, route.path, seq);
    if (res != ncclSuccess) s.fail(res);
  }
  if (s.telemetry) s.telemetry->end(measured, measuring_recorded);

  const uint64_t choice = 1ull << (static_cast<int>(c.collective) * 16 + static_cast<int>(rec.path) * 2 +
                                    (rec.transport == Carrier::nccl ? 0 : 1));
  if (!(s.logged_choices & choice)) {
    s.logged_choices |= choice;
    FP8WIRE_INFO("comm {} ({} ranks, fabric {}): first {} on path {} over {}{}{} ({} B of caller data, {} calls)",
                 s.id, s.nranks, to_string(s.agreement.fabric), to_string(c.collective), to_string(rec.path),
                 to_string(rec.transport), rec.gather == GatherMethod::automatic ? "" : ", gather by ",
                 rec.gather == GatherMethod::automatic ? "" : to_string(rec.gather), rec.app_bytes,
                 rec.coalesced_calls);
  }
  // The host time of the call (from entering the call to its return) tells a host-bound job where its milliseconds went.
  FP8WIRE_DEBUG("seq {} {} {} x{} {} comm {} -> {} ({} calls), wire {} B, {:.1f} us on the host{}", seq,
                to_string(c.collective), rec.count, es, to_string(s.agreement.fabric), s.id, to_string(rec.path),
                rec.coalesced_calls, rec.wire_bytes, static_cast<double>(now_ns() - issue) / 1e3,
                res == ncclSuccess ? "" : " FAILED");
  hooks.end();
  Accounting::instance().record(rec);
  return res;
}

}  // namespace fp8wire::sched
