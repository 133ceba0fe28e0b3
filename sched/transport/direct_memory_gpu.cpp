// The GPU's windows for the direct transports (sched/platform/direct_memory.hpp) and its stream memory
// operations (sched/platform/cuda_api.hpp).
//   host windows    POSIX shared memory (sched/transport/shared_memory.hpp: unguessable names, created
//                   exclusively for this user alone, the space reserved at creation, the size checked
//                   on attach, the owner's lock that a peer asks to learn the owner has gone), registered
//                   with cudaHostRegister as mapped and portable memory, so every GPU of every process
//                   that maps it loads and stores it over PCIe; unlinked once every peer has it mapped.
//                   Before its first host window a process removes the names that killed jobs left in
//                   /dev/shm (shm::sweep), and again when the file system has no room for a window.
//   device windows  cudaMalloc'd memory exported with cudaIpcGetMemHandle, opened by the peers with
//                   cudaIpcOpenMemHandle (peer access enabled on the way): NVLink or PCIe P2P, or the
//                   same GPU when ranks share one.
// Why not NCCL's symmetric memory and device API (ncclMemAlloc / ncclCommWindowRegister, the
// nccl_device.h peer pointers and barriers): that device code is compiled against one NCCL's structure
// layout, while libfp8wire.so serves whatever NCCL the job loaded at run time; and ranks emulated on
// one GPU are separate hosts to NCCL, so its load/store teams would have one member there. CUDA IPC
// depends on no NCCL version and works between processes of one GPU as between GPUs.
// The memory operations come from the driver through cudaGetDriverEntryPointByVersion, so the
// library still links only the static CUDA runtime.
#include "sched/platform/gpu_platform.hpp"

#include <cuda.h>

#include <cstring>
#include <memory>
#include <mutex>
#include <string>

#include <cuda_runtime.h>

#include "common/config.hpp"
#include "common/log.hpp"
#include "sched/transport/shared_memory.hpp"

namespace fp8wire {

namespace {

using WaitFn = CUresult (*)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);
using WriteFn = CUresult (*)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);

struct MemOps {
  WaitFn wait = nullptr;
  WriteFn write = nullptr;
};

const MemOps& memops() {
  static const MemOps ops = [] {
    MemOps m;
    auto entry = [](const char* name) -> void* {
      void* fn = nullptr;
      cudaDriverEntryPointQueryResult q{};
      if (cudaGetDriverEntryPointByVersion(name, &fn, 12000, cudaEnableDefault, &q) != cudaSuccess ||
          q != cudaDriverEntryPointSuccess) {
        cudaGetLastError();
        return nullptr;
      }
      return fn;
    };
    m.wait = reinterpret_cast<WaitFn>(entry("cuStreamWaitValue32"));
    m.write = reinterpret_cast<WriteFn>(entry("cuStreamWriteValue32"));
    if (!m.wait || !m.write) FP8WIRE_INFO("the driver offers no stream memory operations: no direct transport");
    return m;
  }();
  return ops;
}

cudaError_t from_cu(CUresult r) { return r == CUDA_SUCCESS ? cudaSuccess : cudaErrorUnknown; }

cudaError_t wait_value(cudaStream_t s, void* addr, uint32_t value) {
  const MemOps& m = memops();
  if (!m.wait) return cudaErrorNotSupported;
  return from_cu(m.wait(reinterpret_cast<CUstream>(s), reinterpret_cast<CUdeviceptr>(addr), value,
                        CU_STREAM_WAIT_VALUE_EQ));
}

cudaError_t write_value(cudaStream_t s, void* addr, uint32_t value) {
  const MemOps& m = memops();
  if (!m.write) return cudaErrorNotSupported;
  // The default flags put a system-wide memory fence before the write: the data this stream wrote
  // is visible to the peer before the flag that announces it.
  return from_cu(m.write(reinterpret_cast<CUstream>(s), reinterpret_cast<CUdeviceptr>(addr), value,
                         CU_STREAM_WRITE_VALUE_DEFAULT));
}

// A window's own record.
struct Mapping {
  WindowKind kind = WindowKind::host;
  void* base = nullptr;   // host: the mmap'd address; device: the allocation or the opened pointer
  size_t bytes = 0;
  bool owner = false;
  shm::Segment segment;   // host: the shared-memory object (its name until unlinked, its lock)
};

// Once per process, before its first host window: what killed jobs left in /dev/shm goes.
void sweep_leftovers() {
  const shm::Swept swept = shm::sweep();
  if (swept.objects)
    FP8WIRE_INFO("direct transport: removed {} shared-memory object(s) of ended processes from {} ({})", swept.objects,
                 shm::kDirectory, format_size(swept.bytes));
}

// A host window, created (`name` null) or a peer's opened: the shared-memory object, then CUDA's
// registration. cudaErrorMemoryAllocation when the file system had no room for it
// (DirectMemoryApi::create), cudaErrorOperatingSystem for another failure of the object.
cudaError_t map_host(const char* name, size_t bytes, Window* out, Mapping* m) {
  static std::once_flag swept;
  if (!name) std::call_once(swept, sweep_leftovers);
  std::string error;
  shm::Status status = name ? shm::open(name, bytes, &m->segment, &error) : shm::create(bytes, &m->segment, &error);
  if (status == shm::Status::no_room && shm::sweep().objects > 0)  // room made by a leftover's removal
    status = shm::create(bytes, &m->segment, &error);
  if (status != shm::Status::ok) {
    FP8WIRE_INFO("direct transport: {}", error);
    return status == shm::Status::no_room ? cudaErrorMemoryAllocation : cudaErrorOperatingSystem;
  }
  void* p = m->segment.base;
  cudaError_t err = cudaHostRegister(p, bytes, cudaHostRegisterMapped | cudaHostRegisterPortable);
  void* device = nullptr;
  if (err == cudaSuccess) err = cudaHostGetDevicePointer(&device, p, 0);
  if (err != cudaSuccess) {
    cudaGetLastError();
    cudaHostUnregister(p);
    cudaGetLastError();
    shm::close(m->segment);
    return err;
  }
  m->kind = WindowKind::host;
  m->base = p;
  m->bytes = bytes;
  m->owner = !name;
  out->host = static_cast<char*>(p);
  out->device = static_cast<char*>(device);
  out->bytes = bytes;
  return cudaSuccess;
}

// A device window's record and view (created here or opened from a peer).
void set_device_window(void* p, size_t bytes, bool owner, Mapping* m, Window* out) {
  m->kind = WindowKind::device;
  m->base = p;
  m->bytes = bytes;
  m->owner = owner;
  out->device = static_cast<char*>(p);
  out->host = nullptr;
  out->bytes = bytes;
}

// The end of create/open: the window keeps its record, or the error is cleared and returned.
cudaError_t finish_window(cudaError_t err, std::unique_ptr<Mapping> m, Window* out) {
  if (err != cudaSuccess) {
    cudaGetLastError();
    return err;
  }
  out->token = m.release();
  return cudaSuccess;
}

cudaError_t create_window(WindowKind kind, size_t bytes, uint64_t /*tag: the names are random*/, Window* out,
                          WindowHandle* handle) {
  // Whole pages: what mmap maps and cudaHostRegister pins either way.
  if (kind == WindowKind::host) bytes = (bytes + 4095) / 4096 * 4096;
  auto m = std::make_unique<Mapping>();
  cudaError_t err = cudaSuccess;
  *handle = WindowHandle{};
  handle->kind = static_cast<uint32_t>(kind);
  handle->bytes = bytes;
  if (kind == WindowKind::host) {
    err = map_host(nullptr, bytes, out, m.get());
    if (err == cudaSuccess) {
      std::memset(out->host, 0, bytes);
      static_assert(sizeof handle->name == sizeof m->segment.name);
      std::memcpy(handle->name, m->segment.name, sizeof handle->name);
    }
  } else {
    void* p = nullptr;
    err = cudaMalloc(&p, bytes);
    cudaIpcMemHandle_t ipc{};
    if (err == cudaSuccess) err = cudaMemset(p, 0, bytes);
    if (err == cudaSuccess) err = cudaIpcGetMemHandle(&ipc, p);
    if (err == cudaSuccess) {
      static_assert(sizeof(ipc) <= sizeof(handle->ipc));
      std::memcpy(handle->ipc, &ipc, sizeof(ipc));
      set_device_window(p, bytes, true, m.get(), out);
    } else if (p) {
      cudaFree(p);
    }
  }
  return finish_window(err, std::move(m), out);
}

cudaError_t open_window(const WindowHandle& h, Window* out) {
  auto m = std::make_unique<Mapping>();
  cudaError_t err = cudaSuccess;
  if (h.kind == static_cast<uint32_t>(WindowKind::host)) {
    char name[sizeof h.name + 1] = {};
    std::memcpy(name, h.name, sizeof h.name);
    err = map_host(name, h.bytes, out, m.get());
  } else if (h.kind == static_cast<uint32_t>(WindowKind::device)) {
    cudaIpcMemHandle_t ipc{};
    std::memcpy(&ipc, h.ipc, sizeof(ipc));
    void* p = nullptr;
    err = cudaIpcOpenMemHandle(&p, ipc, cudaIpcMemLazyEnablePeerAccess);
    if (err == cudaSuccess) set_device_window(p, h.bytes, false, m.get(), out);
    else FP8WIRE_INFO("direct transport: cudaIpcOpenMemHandle failed: {}", cudaGetErrorString(err));
  } else {
    err = cudaErrorInvalidValue;
  }
  return finish_window(err, std::move(m), out);
}

void unlink_window(Window& own) {
  auto* m = static_cast<Mapping*>(own.token);
  if (m && m->kind == WindowKind::host) shm::unlink(m->segment);
}

void release_window(Window& w) {
  auto* m = static_cast<Mapping*>(w.token);
  if (!m) return;
  if (m->kind == WindowKind::host) {
    cudaHostUnregister(m->base);
    shm::close(m->segment);  // the owner's lock goes with it
  } else if (m->owner) {
    cudaFree(m->base);
  } else {
    cudaIpcCloseMemHandle(m->base);
  }
  cudaGetLastError();
  delete m;
  w = Window{};
}

bool available() {
  const MemOps& m = memops();
  return m.wait && m.write;
}

bool owner_gone(const Window& peer) {
  const auto* m = static_cast<const Mapping*>(peer.token);
  return m && m->kind == WindowKind::host && shm::owner_gone(m->segment);
}

}  // namespace

void fill_direct_platform(Platform& p) {
  p.cuda.StreamWaitValue32 = wait_value;
  p.cuda.StreamWriteValue32 = write_value;
  DirectMemoryApi& d = p.direct;
  d.available = available;
  d.create = create_window;
  d.open = open_window;
  d.unlink = unlink_window;
  d.close = release_window;
  d.destroy = release_window;
  d.owner_gone = owner_gone;
}

}  // namespace fp8wire
