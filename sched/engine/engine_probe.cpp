#include "sched/engine/engine_probe.hpp"

#include "common/log.hpp"
#include "sched/engine/engine_impl.hpp"
#include "sched/transport/direct_windows.hpp"

namespace fp8wire::sched {

CommInfo EngineProbe::comm_info(ncclComm_t comm) const {
  CommInfo info;
  const CommRef s = engine_->impl_->registry.find(comm);
  if (!s) return info;
  info.registered = true;
  info.agreed = s->setup == CommSetup::agreed;
  info.fp8_ok = s->fp8_allowed();
  info.fabric = s->agreement.fabric;
  info.nranks = s->nranks;
  info.hosts = s->agreement.hosts.hosts;
  info.reason = s->setup == CommSetup::pass_through ? s->pass_reason : s->agreement.reason;
  info.failure = s->failed();
  info.direct = s->direct != nullptr;
  if (s->direct) info.direct_kind = s->direct->kind();
  info.scratch_bytes = s->agreement.scratch_bytes;
  return info;
}

uint64_t EngineProbe::scratch_held() const { return engine_->impl_->budgets.scratch.held(); }

ncclResult_t EngineProbe::all_reduce_forced(Path p, const void* s, void* r, size_t n, ncclDataType_t t, ncclRedOp_t op,
                                       ncclComm_t c, cudaStream_t st) {
  return guarded("collective", [&] { return engine_->impl_->submit({Collective::all_reduce, s, r, n, t, op, c, st}, p); });
}
ncclResult_t EngineProbe::reduce_scatter_forced(Path p, const void* s, void* r, size_t n, ncclDataType_t t,
                                           ncclRedOp_t op, ncclComm_t c, cudaStream_t st) {
  // reduce_scatter has one flat FP8 algorithm; any flat FP8 path selects it.
  if (is_fp8(p) && p != Path::hierarchical) p = Path::two_shot;
  return guarded("collective", [&] { return engine_->impl_->submit({Collective::reduce_scatter, s, r, n, t, op, c, st}, p); });
}
ncclResult_t EngineProbe::all_gather_forced(Path p, const void* s, void* r, size_t n, ncclDataType_t t, ncclComm_t c,
                                       cudaStream_t st) {
  if (is_fp8(p)) p = Path::one_shot;
  return guarded("collective", [&] { return engine_->impl_->submit({Collective::all_gather, s, r, n, t, ncclSum, c, st}, p); });
}
ncclResult_t EngineProbe::all_to_all_forced(Path p, const void* s, void* r, size_t n, ncclDataType_t t, ncclComm_t c,
                                            cudaStream_t st) {
  if (is_fp8(p)) p = Path::one_shot;  // its one FP8 algorithm
  return guarded("collective", [&] { return engine_->impl_->submit({Collective::all_to_all, s, r, n, t, ncclSum, c, st}, p); });
}

Fabric EngineProbe::fabric_of(ncclComm_t comm) const {
  const CommRef s = engine_->impl_->registry.find(comm);
  if (s && s->setup == CommSetup::agreed) return s->agreement.fabric;
  return fabric_without_agreement(engine_->impl_->config);
}

}  // namespace fp8wire::sched
