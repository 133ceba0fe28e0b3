// Memory that every rank of one machine maps into its own process, for the direct transports
// (sched/transport/direct_windows.hpp): the platform's part, as a table like CudaApi. The GPU fills it with
// POSIX shared memory registered with CUDA (host windows) and CUDA IPC of device memory (device
// windows, reached over NVLink or PCIe P2P); the CPU tier with simulated memory every simulated rank
// can reach.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace fp8wire {

enum class WindowKind : uint32_t {
  host = 1,    // pinned host memory shared by the machine's processes, mapped into each GPU
  device = 2,  // device memory of the owner's GPU, opened by the peers through CUDA IPC
};

// What a peer needs to map a window. Travels in the setup exchange at communicator creation, so it is
// plain bytes of a fixed size.
struct WindowHandle {
  uint32_t kind = 0;           // WindowKind
  uint32_t reserved = 0;
  uint64_t bytes = 0;
  char name[48] = {};          // host: the shared-memory object's name
  unsigned char ipc[64] = {};  // device: the cudaIpcMemHandle_t
};
static_assert(sizeof(WindowHandle) == 128);

// A window as this process reaches it.
struct Window {
  char* device = nullptr;  // the address this process's GPU work uses
  char* host = nullptr;    // host windows: the CPU's mapping (flags are stored through it); else null
  size_t bytes = 0;
  void* token = nullptr;   // the platform's own record of the mapping
};

struct DirectMemoryApi {
  // Whether this process can take part at all (the driver's stream memory operations exist).
  bool (*available)() = nullptr;
  // This process's window of `bytes` (zeroed), and the handle a peer opens it by. `tag` names the
  // communicator and rank (the GPU's shared-memory names are random instead). cudaErrorMemoryAllocation
  // when its memory could not be reserved (for a host window: no room in /dev/shm, which the direct
  // round tells the user how to fix), another error for any other failure.
  cudaError_t (*create)(WindowKind kind, size_t bytes, uint64_t tag, Window* out, WindowHandle* handle) = nullptr;
  // A peer's window, mapped into this process (an error when it is not what its handle says).
  cudaError_t (*open)(const WindowHandle& handle, Window* out) = nullptr;
  // Removes the name a host window is found by, once every peer has mapped it: then nothing is left
  // behind when a process dies (the memory goes with its last mapping).
  void (*unlink)(Window& own) = nullptr;
  void (*close)(Window& peer) = nullptr;   // unmaps a peer's window
  void (*destroy)(Window& own) = nullptr;  // frees this process's window
  // Whether the process that created `peer` (a host window this process opened) no longer holds it:
  // it destroyed the window or ended, in whatever way. Asked of the peer's flag page only. The GPU
  // answers from a lock the owner holds on the shared-memory object while the window lives (the
  // kernel drops it with the owner's last reference), so the answer holds across PID namespaces and
  // cannot be fooled by a reused pid.
  bool (*owner_gone)(const Window& peer) = nullptr;
};

}  // namespace fp8wire
