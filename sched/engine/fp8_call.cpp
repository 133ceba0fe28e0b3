// Running one FP8 route (sched/plan/route.hpp): its record, its stage program, the pipeline executor,
// the error that makes the communicator's FP8 path unusable. A route that fell back because no stage
// fits the scratch issues the real call here (its record still says fallback, on every rank alike).
#include "common/log.hpp"
#include "common/nvtx.hpp"
#include "common/status.hpp"
#include "sched/algorithms/algorithms.hpp"
#include "sched/engine/engine_impl.hpp"
#include "sched/transport/direct_windows.hpp"

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

  ncclResult_t res = ncclSuccess;
  if (route.path == Path::fallback) {  // no pipeline stage fits the scratch (route_fp8)
    FP8WIRE_WARN_ONCE("scratch.max_bytes too small for one pipeline stage of a {} on {} ranks; passing through",
                      to_string(c.collective), s.nranks);
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
    if (route.carrier == Carrier::host_memory && config.direct_own_on_device) a.own_device_bytes = s.res.layout.set_bytes;
    const bool feedback = config.error_feedback && c.collective == Collective::all_reduce && batch == 1 &&
                          (route.path == Path::one_shot || route.path == Path::two_shot);
    if (feedback)
      a.residual = s.feedback.residual_for(feedback_key, c.count, dtype_of(c.dtype), s.res.produce, capturing);
    RouteProgram chosen(c.collective, route, a, s);
    StageProgram* program = &chosen.get();
    CoalescedAllReduce coalesced(*program, items, batch, s.res.scratch, es);
    if (batch > 1) program = &coalesced;

    StageOps ops(s, type, format, launch);
    if (route.carrier != Carrier::nccl) ops.use_direct(s.direct.get(), config.direct_ctas);
    PipelineRun run(sref, c.stream, capturing, call_hooks() != nullptr, joins);
    res = run.finish(run.run(*program, ops, rec.count, route.stage_elems));
    rec.wire_bytes = ops.wire_bytes();
    if (res != ncclSuccess) s.fail(res);
  }

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
  FP8WIRE_DEBUG("seq {} {} {} x{} {} comm {} -> {} ({} calls), wire {} B{}", seq, to_string(c.collective), rec.count,
                es, to_string(s.agreement.fabric), s.id, to_string(rec.path), rec.coalesced_calls, rec.wire_bytes,
                res == ncclSuccess ? "" : " FAILED");
  hooks.end();
  Accounting::instance().record(rec);
  return res;
}

}  // namespace fp8wire::sched
