// A call that telemetry measures (sched/comm/telemetry_monitor.hpp): its stage program wrapped so that the
// call's record is zeroed before its first quantize and read back after its last stage.
#pragma once

#include "quant/telemetry.hpp"
#include "sched/comm/telemetry_monitor.hpp"
#include "sched/exec/pipeline.hpp"
#include "sched/platform/cuda_api.hpp"

namespace fp8wire::sched {

// A measured call's program: `inner` with its record zeroed on the produce lane before the first
// stage and copied to pinned host memory, then its event recorded, on the transfer lane after the
// last stage's gather (its last part), which follows every quantize of the call.
class MeasuredProgram final : public StageProgram {
 public:
  MeasuredProgram(StageProgram& inner, const TelemetryMonitor& m, int slot, const CudaApi& cuda)
      : inner_(&inner), monitor_(&m), slot_(slot), cuda_(&cuda) {}
  ncclResult_t produce(StageOps& ops, const Stage& st) override;
  ncclResult_t finish(StageOps& ops, const Stage& st) override;
  bool has_gather() const override { return inner_->has_gather(); }
  ncclResult_t gather(StageOps& ops, const Stage& st) override;
  bool recorded() const { return recorded_; }

 private:
  StageProgram* inner_;
  const TelemetryMonitor* monitor_;
  int slot_;
  const CudaApi* cuda_;
  bool recorded_ = false;
};

}  // namespace fp8wire::sched
