// Running one FP8 route (sched/plan/route.hpp): its record, its stage program, the pipeline executor,
// the error that makes the communicator's FP8 path unusable. A route that fell back because no stage
// fits the scratch issues the real call here (its record still says fallback, on every rank alike), as
// does a call whose tensor the guard has switched to full precision (sched/plan/guard.hpp: a state every
// rank advances alike, from votes every rank received).
#include <optional>

#include "common/log.hpp"
#include "common/nvtx.hpp"
#include "common/status.hpp"
#include "sched/algorithms/algorithms.hpp"
#include "sched/comm/telemetry_monitor.hpp"
#include "sched/engine/engine_impl.hpp"
#include "sched/exec/measured_program.hpp"
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

// Telemetry and the guard's choice for this call (sched/comm/telemetry_monitor.hpp); nothing while telemetry is off.
ncclResult_t telemetry_begin(CommState& s, const Config& config, const quant::WireFormat& format, const Call& c,
                             Path path, uint64_t scope, bool capturing, uint64_t seq, TelemetryMonitor::Call* out) {
  const GuardSettings g = GuardSettings::from(config);
  if (g.sample_every == 0 && config.audit_every == 0) return ncclSuccess;
  if (!s.telemetry) s.telemetry = std::make_unique<TelemetryMonitor>(*s.platform, s.id, s.rank);
  const bool eligible = guard_eligible(c.collective, path, format.scale);
  return s.telemetry->begin(g, scope, c.collective, path, eligible, capturing, seq, out);
}

size_t send_bytes_of(const Call& c, int nranks, size_t es) {
  return c.count * es * (c.collective == Collective::reduce_scatter ? static_cast<size_t>(nranks) : 1);
}
size_t recv_bytes_of(const Call& c, int nranks, size_t es) {
  return c.count * es * (c.collective == Collective::all_gather ? static_cast<size_t>(nranks) : 1);
}
bool overlaps(const void* a, size_t a_bytes, const void* b, size_t b_bytes) {
  const auto x = reinterpret_cast<uintptr_t>(a), y = reinterpret_cast<uintptr_t>(b);
  return x < y + b_bytes && y < x + a_bytes;
}

const char* range_name(Collective c, Path p) {
  if (c == Collective::reduce_scatter) return "fp8wire reduce_scatter";
  if (c == Collective::all_gather) return "fp8wire all_gather";
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
  rec.kind = kind_of(c.collective);
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
  if (batch > 1) {
    rec.coalesced_calls = static_cast<uint32_t>(batch);
    rec.count = 0;
    for (size_t i = 0; i < batch; ++i) rec.count += items[i].call.count;
  }
  rec.app_bytes = rec.count * es;
  CallHookScope hooks(rec);
  NvtxRange range(range_name(c.collective, route.algorithm));

  // Telemetry and the guard (sched/plan/guard.hpp): the scope is the call's tensor, or the communicator.
  TelemetryMonitor::Call measured;
  bool measuring_recorded = false;
  ncclResult_t res =
      telemetry_begin(s, config, format, c, route.path, batch > 1 ? 0 : feedback_key, capturing, seq, &measured);
  if (res != ncclSuccess) {
    s.fail(res);
  } else if (route.path == Path::fallback || measured.choice.full_precision) {
    if (route.path == Path::fallback)  // no pipeline stage fits the scratch (route_fp8)
      FP8WIRE_WARN_ONCE("scratch.max_bytes too small for one pipeline stage of a {} on {} ranks; passing through",
                        to_string(c.collective), s.nranks);
    rec.path = Path::fallback;
    rec.gather = GatherMethod::automatic;
    rec.transport = Carrier::nccl;
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
    a.post = c.op == ncclAvg ? 1.0f / static_cast<float>(s.nranks) : 1.0f;
    a.gather = route.gather;
    a.outbox = route.carrier != Carrier::nccl && config.direct_outbox;
    if (route.carrier == Carrier::host_memory && config.direct_own_on_device) {
      a.own_device_bytes = s.res.layout.set_bytes_for(s.direct->sets());  // the set a stage uses (pipeline.cpp)
      a.copy_in = config.direct_copy_in;
      a.copy_out = config.direct_copy_out;
    }
    const bool feedback = config.error_feedback && c.collective == Collective::all_reduce && batch == 1 &&
                          (route.path == Path::one_shot || route.path == Path::two_shot);
    if (feedback)
      a.residual = s.feedback.residual_for(feedback_key, c.count, dtype_of(c.dtype), s.res.produce, capturing);
    // direct.lanes_apart (sched/algorithms/direct.cpp, "Lanes apart"): not where the produce lane's
    // quantize carries more than the input (error feedback, the telemetry and the guard's vote) or
    // reads what only the produce lane has (a coalesced batch's staging), nor under capture.
    LaneHandover handover = LaneHandover::both;
    if (config.direct_lanes_apart && a.own_device_bytes && !a.residual && batch == 1 &&
        measured.slot < 0 && !capturing &&
        direct_lanes_apart_fits(c.collective, route.path, route.stage_elems, a.own_device_bytes, format)) {
      a.own_per_lane = true;
      // In place, stage i's finish overwrites the input its produce reads: that hand-over stays.
      handover = overlaps(c.send, send_bytes_of(c, s.nranks, es), c.recv, recv_bytes_of(c, s.nranks, es))
                     ? LaneHandover::ready_only
                     : LaneHandover::none;
    }
    RouteProgram chosen(c.collective, route, a, s);
    StageProgram* program = &chosen.get();
    CoalescedAllReduce coalesced(*program, items, batch, s.res.scratch, es);
    if (batch > 1) program = &coalesced;
    std::optional<MeasuredProgram> measuring;
    quant::LaunchOptions call_launch = launch;
    if (measured.slot >= 0) {
      measuring.emplace(*program, *s.telemetry, measured.slot, platform->cuda);
      program = &*measuring;
      call_launch.telemetry = measured.options;
    }

    // The audit (audit.every): the same collective in full precision through the real NCCL, on a copy
    // of the input made before the FP8 call may overwrite it (in place), compared once both are back.
    const bool audited = batch == 1 && !capturing && !joins && s.telemetry && s.telemetry->audit_due(config.audit_every);
    if (audited) {
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
      StageOps ops(s, type, format, call_launch);
      if (route.carrier != Carrier::nccl)
        ops.use_direct(s.direct.get(), config.direct_ctas, config.direct_lane_flags, handover,
                       a.copy_in && config.direct_early_copy_in,
                       config.direct_paced_sends && route.carrier == Carrier::host_memory, config.direct_copy_lanes,
                       config.direct_per_peer_flags);
      PipelineRun run(sref, c.stream, capturing, call_hooks() != nullptr, joins);
      res = run.finish(run.run(*program, ops, rec.count, route.stage_elems));
      rec.wire_bytes = ops.wire_bytes();
      measuring_recorded = measuring && measuring->recorded();
    }
    if (res == ncclSuccess && audited)
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
