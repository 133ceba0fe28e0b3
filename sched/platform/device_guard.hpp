// The calling thread's current device set to a communicator's for a scope, and put back after:
// set-up and release run on whichever thread the application created or destroyed it on.
#pragma once

#include "sched/platform/cuda_api.hpp"

namespace fp8wire::sched {

class DeviceGuard {
 public:
  DeviceGuard(const CudaApi& cuda, int device) : cuda_(&cuda) {
    if (device >= 0 && cuda.GetDevice(&previous_) == cudaSuccess && previous_ != device)
      changed_ = cuda.SetDevice(device) == cudaSuccess;
  }
  ~DeviceGuard() {
    if (changed_) cuda_->SetDevice(previous_);
  }

 private:
  const CudaApi* cuda_;
  int previous_ = 0;
  bool changed_ = false;
};

}  // namespace fp8wire::sched
