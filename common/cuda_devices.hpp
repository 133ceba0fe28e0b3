#pragma once
// How many CUDA devices this process can see, asked of the driver (libcuda.so.1) through dlopen, so
// that tools which never run CUDA work themselves (fp8wire-prof) can tell a job on a machine
// without a GPU from a job that recorded nothing.

namespace fp8wire {

// 0 where there is no driver, it cannot initialise, or it sees no device (CUDA_VISIBLE_DEVICES="").
// Initialises the driver in this process (cuInit): not for a process that forks and then uses CUDA.
int visible_cuda_devices();

// Whether the driver library can be loaded at all; no driver, no GPU. Loads it without initialising
// it, so it is safe in any process (a library's constructor, before a fork).
bool cuda_driver_present();

}  // namespace fp8wire
