#include "sched/exec/measured_program.hpp"

#include "common/log.hpp"
#include "common/status.hpp"

namespace fp8wire::sched {

ncclResult_t MeasuredProgram::produce(StageOps& ops, const Stage& st) {
  if (st.index == 0) FP8WIRE_TRY(ops.zero(monitor_->device_record(slot_), sizeof(quant::CallTelemetry)));
  return inner_->produce(ops, st);
}

ncclResult_t MeasuredProgram::finish(StageOps& ops, const Stage& st) { return inner_->finish(ops, st); }

ncclResult_t MeasuredProgram::gather(StageOps& ops, const Stage& st) {
  FP8WIRE_TRY(inner_->gather(ops, st));
  if (!st.last) return ncclSuccess;
  const cudaError_t err = monitor_->read_back(slot_, ops.lane());
  if (err != cudaSuccess) {
    FP8WIRE_ERROR("telemetry: copying the call's record back failed: {}", cuda_->GetErrorString(err));
    return ncclUnhandledCudaError;
  }
  recorded_ = true;
  return ncclSuccess;
}

}  // namespace fp8wire::sched
