#include "common/cuda_devices.hpp"

#include <dlfcn.h>

namespace fp8wire {

namespace {
// The driver stays loaded: unloading it under a process that may use CUDA later gains nothing.
void* open_driver() { return dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL); }
}  // namespace

bool cuda_driver_present() { return open_driver() != nullptr; }

int visible_cuda_devices() {
  void* driver = open_driver();
  if (!driver) return 0;
  using Init = int (*)(unsigned);
  using Count = int (*)(int*);
  const auto init = reinterpret_cast<Init>(dlsym(driver, "cuInit"));
  const auto count = reinterpret_cast<Count>(dlsym(driver, "cuDeviceGetCount"));
  int devices = 0;
  if (!init || !count || init(0) != 0 || count(&devices) != 0) return 0;  // 0 is CUDA_SUCCESS
  return devices;
}

}  // namespace fp8wire
