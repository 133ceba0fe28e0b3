// Running one FP8 call: its record, its stage program, the pipeline executor, the error that makes
// the communicator's FP8 path unusable. A call whose single stage cannot fit the scratch passes
// through instead (a function of the configuration, the size and the world size only, so every rank
// falls back together).
#include <optional>

#include "common/log.hpp"
#include "common/nvtx.hpp"
#include "common/status.hpp"
#include "sched/algorithms.hpp"
#include "sched/cost_model.hpp"
#include "sched/direct_transport.hpp"
#include "sched/engine_impl.hpp"
#include "sched/hierarchy.hpp"
#include "sched/plan.hpp"
#include "sched/telemetry.hpp"

namespace fp8wire::sched {

namespace {

// Several grouped all-reduces packed through the staging area into one: copied in on the produce
// lane before the first stage, copied out on the transfer lane after the last, all between the
// call's fork and join.
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
  ncclResult_t finish(StageOps& ops, const Stage& st) override {
    FP8WIRE_TRY(inner_->finish(ops, st));
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

// Telemetry and the guard's choice for this call (sched/telemetry.hpp); nothing while telemetry is off.
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

const char* range_name(Collective c, Path p) {
  if (c == Collective::reduce_scatter) return "fp8wire reduce_scatter";
  if (c == Collective::all_gather) return "fp8wire all_gather";
  return p == Path::one_shot ? "fp8wire one_shot" : p == Path::ring ? "fp8wire ring" : "fp8wire two_shot";
}

}  // namespace

ncclResult_t Engine::Impl::run_fp8(const CommRef& sref, const Call& c, Path path, uint64_t seq, uint64_t issue,
                                   uint64_t feedback_key, const Pending* items, size_t batch, JoinList* joins) {
  CommState& s = *sref;
  // The path never depends on capture (it was decided from agreed facts): capture only decides
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
  rec.path = path;
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
  // The gather transport of this call (of the whole batch when coalesced): from the config and the
  // call's shape only, like the path, so every rank picks the same.
  CallShape shape = shape_of(c, &s);
  shape.count = rec.count;
  const GatherTransport gather =
      has_gather_step(c.collective, path)
          ? gather_transport_for(config, c.collective, path, threshold_bytes(shape), s.nranks, s.agreement.fabric)
          : GatherTransport::automatic;
  rec.gather = gather;
  // The transport: a direct transport's windows where the communicator has one and the config or the
  // cost model takes it (cost_model.hpp), else NCCL's. A call that does not fit one buffer set of the
  // window goes over NCCL's (again a function of the shape only).
  TransportKind transport =
      s.direct ? transport_for(config, c.collective, path, threshold_bytes(shape), s.nranks, s.agreement.fabric,
                               s.direct->kind())
               : TransportKind::nccl;
  size_t direct_stage = 0;
  if (transport != TransportKind::nccl) {
    direct_stage = direct_stage_elems(config, s.direct->set_bytes(), c.collective, path, rec.count, es, s.nranks, format);
    if (direct_stage == 0) transport = TransportKind::nccl;
  }
  rec.transport = transport;
  if (transport != TransportKind::nccl) rec.gather = GatherTransport::automatic;  // no NCCL gather step
  CallHookScope hooks(rec);
  NvtxRange range(range_name(c.collective, path));

  const Path inner = path == Path::hierarchical ? inner_path(config, shape, s.agreement.topology) : path;
  const size_t stage =
      transport != TransportKind::nccl ? direct_stage
      : path == Path::hierarchical
          ? hierarchical_stage_elems(s.res.layout, c.collective, rec.count, es, s.hierarchy.hosts,
                                     s.hierarchy.ranks_per_host, inner, format)
          : stage_elems(config, s.res.layout, c.collective, path, rec.count, es, s.nranks, format, s.agreement.fabric);
  // Telemetry and the guard (sched/guard.hpp): the scope is the call's tensor, or the communicator.
  TelemetryMonitor::Call measured;
  bool measuring_recorded = false;
  ncclResult_t res =
      telemetry_begin(s, config, format, c, rec.path, batch > 1 ? 0 : feedback_key, capturing, seq, &measured);
  if (res != ncclSuccess) {
    s.fail(res);
  } else if (stage == 0 || measured.choice.full_precision) {
    if (stage == 0)
      FP8WIRE_WARN_ONCE("scratch.max_bytes too small for one pipeline stage of a {} on {} ranks; passing through",
                        to_string(c.collective), s.nranks);
    rec.path = Path::fallback;
    rec.gather = GatherTransport::automatic;
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
    a.gather = gather;
    const bool feedback = config.error_feedback && c.collective == Collective::all_reduce && batch == 1 &&
                          (path == Path::one_shot || path == Path::two_shot);
    if (feedback)
      a.residual = s.feedback.residual_for(feedback_key, c.count, dtype_of(c.dtype), s.res.produce, capturing);
    TwoShotAllReduce two_shot(a);
    OneShotAllReduce one_shot(a);
    RingAllReduce ring(a);
    ReduceScatterFp8 reduce_scatter(a);
    AllGatherFp8 all_gather(a);
    HierarchicalAllReduce hierarchical(a, s, inner);
    HierarchicalReduceScatter hierarchical_rs(a, s);
    DirectTwoShotAllReduce direct_two_shot(a);
    DirectOneShotAllReduce direct_one_shot(a);
    DirectReduceScatter direct_reduce_scatter(a);
    DirectAllGather direct_all_gather(a);
    StageProgram* program = &two_shot;
    if (path == Path::hierarchical) program = c.collective == Collective::reduce_scatter ? static_cast<StageProgram*>(&hierarchical_rs) : &hierarchical;
    else if (c.collective == Collective::reduce_scatter) program = &reduce_scatter;
    else if (c.collective == Collective::all_gather) program = &all_gather;
    else if (path == Path::one_shot) program = &one_shot;
    else if (path == Path::ring) program = &ring;
    if (transport != TransportKind::nccl) {
      program = c.collective == Collective::reduce_scatter ? static_cast<StageProgram*>(&direct_reduce_scatter)
                : c.collective == Collective::all_gather   ? static_cast<StageProgram*>(&direct_all_gather)
                : path == Path::one_shot                   ? static_cast<StageProgram*>(&direct_one_shot)
                                                           : static_cast<StageProgram*>(&direct_two_shot);
    }
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
      void *in = nullptr, *out = nullptr;
      res = s.telemetry->audit_buffers(send_bytes_of(c, s.nranks, es), recv_bytes_of(c, s.nranks, es), &in, &out);
      if (res == ncclSuccess &&
          platform->cuda.MemcpyAsync(in, c.send, send_bytes_of(c, s.nranks, es), cudaMemcpyDeviceToDevice, c.stream) !=
              cudaSuccess)
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
      if (transport != TransportKind::nccl) ops.use_direct(s.direct.get(), config.direct_ctas);
      PipelineRun run(sref, c.stream, capturing, joins);
      res = run.finish(run.run(*program, ops, rec.count, stage));
      rec.wire_bytes = ops.wire_bytes();
      measuring_recorded = measuring && measuring->recorded();
    }
    if (res == ncclSuccess && audited)
      res = s.telemetry->audit_read_back(c.stream, c.recv, recv_bytes_of(c, s.nranks, es), dtype_of(c.dtype),
                                         c.collective, path, seq);
    if (res != ncclSuccess) s.fail(res);
  }
  if (s.telemetry) s.telemetry->end(measured, measuring_recorded);

  const uint64_t choice = 1ull << (static_cast<int>(c.collective) * 16 + static_cast<int>(rec.path) * 2 +
                                    (rec.transport == TransportKind::nccl ? 0 : 1));
  if (!(s.logged_choices & choice)) {
    s.logged_choices |= choice;
    FP8WIRE_INFO("comm {} ({} ranks, fabric {}): first {} on path {} over {}{}{} ({} B of caller data, {} calls)",
                 s.id, s.nranks, to_string(s.agreement.fabric), to_string(c.collective), to_string(rec.path),
                 to_string(rec.transport), rec.gather == GatherTransport::automatic ? "" : ", gather by ",
                 rec.gather == GatherTransport::automatic ? "" : to_string(rec.gather), rec.app_bytes,
                 rec.coalesced_calls);
  }
  FP8WIRE_DEBUG("seq {} {} {} x{} {} comm {} -> {} ({} calls), wire {} B{}", seq, to_string(c.collective), rec.count,
                es, to_string(s.agreement.fabric), s.id, to_string(rec.path), rec.coalesced_calls, rec.wire_bytes,
                res == ncclSuccess ? "" : " FAILED");
  hooks.end();
  Accounting::instance().record(rec);
  return res;
}

}  // namespace fp8wire::sched
