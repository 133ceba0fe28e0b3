// The GPU's windows for the direct transports (sched/platform/direct_memory.hpp) and its stream memory
// operations (sched/platform/cuda_api.hpp).
//   host windows    POSIX shared memory (shm_open + mmap), registered with cudaHostRegister as mapped
//                   and portable memory, so every GPU of every process that maps it loads and stores it
//                   over PCIe; unlinked once every peer has it mapped. The owner holds a write lock on
//                   the object's first byte (fcntl) for the window's life; a peer tests it (F_GETLK) to
//                   learn the owner has gone. The kernel drops a process's record locks when it ends,
//                   however it ends, and they belong to the open object, not to a pid: the answer holds
//                   for ranks in other PID namespaces and cannot be fooled by pid reuse. A child the
//                   owner forks does not inherit the lock.
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
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>

#include <cuda_runtime.h>

#include "common/log.hpp"

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
  char name[48] = {};     // host: the shared-memory object's name while not yet unlinked
  int fd = -1;            // host: the object, kept open for the owner's lock and the peers' test of it
};

// The owner's lock, on the first byte (fcntl record locks: see the top of the file). Closing any
// descriptor of the object would drop it, so the process opens each object exactly once.
flock first_byte(short type) {
  flock l{};
  l.l_type = type;
  l.l_whence = SEEK_SET;
  l.l_start = 0;
  l.l_len = 1;
  return l;
}

std::atomic<uint64_t> g_windows{0};

cudaError_t map_host(const char* name, size_t bytes, bool create, Window* out, Mapping* m) {
  const int fd = shm_open(name, create ? (O_CREAT | O_EXCL | O_RDWR) : O_RDWR, 0600);
  if (fd < 0) {
    FP8WIRE_INFO("direct transport: shm_open {} failed: {}", name, std::strerror(errno));
    return cudaErrorMemoryAllocation;
  }
  if (create && ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    FP8WIRE_INFO("direct transport: sizing {} to {} bytes failed: {}", name, bytes, std::strerror(errno));
    close(fd);
    shm_unlink(name);
    return cudaErrorMemoryAllocation;
  }
  if (create) {
    flock l = first_byte(F_WRLCK);
    if (fcntl(fd, F_SETLK, &l) != 0) {
      FP8WIRE_INFO("direct transport: locking {} failed: {}", name, std::strerror(errno));
      close(fd);
      shm_unlink(name);
      return cudaErrorMemoryAllocation;
    }
  }
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    close(fd);
    if (create) shm_unlink(name);
    return cudaErrorMemoryAllocation;
  }
  cudaError_t err = cudaHostRegister(p, bytes, cudaHostRegisterMapped | cudaHostRegisterPortable);
  void* device = nullptr;
  if (err == cudaSuccess) err = cudaHostGetDevicePointer(&device, p, 0);
  if (err != cudaSuccess) {
    cudaGetLastError();
    cudaHostUnregister(p);
    cudaGetLastError();
    munmap(p, bytes);
    close(fd);
    if (create) shm_unlink(name);
    return err;
  }
  m->fd = fd;
  m->kind = WindowKind::host;
  m->base = p;
  m->bytes = bytes;
  m->owner = create;
  std::snprintf(m->name, sizeof m->name, "%s", name);
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

cudaError_t create_window(WindowKind kind, size_t bytes, uint64_t tag, Window* out, WindowHandle* handle) {
  // Whole pages: what mmap maps and cudaHostRegister pins either way.
  if (kind == WindowKind::host) bytes = (bytes + 4095) / 4096 * 4096;
  auto m = std::make_unique<Mapping>();
  cudaError_t err = cudaSuccess;
  *handle = WindowHandle{};
  handle->kind = static_cast<uint32_t>(kind);
  handle->bytes = bytes;
  if (kind == WindowKind::host) {
    char name[48];
    std::snprintf(name, sizeof name, "/fp8wire-%d-%llx-%llu", static_cast<int>(getpid()),
                  static_cast<unsigned long long>(tag), static_cast<unsigned long long>(g_windows.fetch_add(1)));
    err = map_host(name, bytes, true, out, m.get());
    if (err == cudaSuccess) {
      std::memset(out->host, 0, bytes);
      std::snprintf(handle->name, sizeof handle->name, "%s", name);
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
    err = map_host(name, h.bytes, false, out, m.get());
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
  if (!m || m->kind != WindowKind::host || !m->name[0]) return;
  shm_unlink(m->name);
  m->name[0] = 0;
}

void release_window(Window& w) {
  auto* m = static_cast<Mapping*>(w.token);
  if (!m) return;
  if (m->kind == WindowKind::host) {
    cudaHostUnregister(m->base);
    munmap(m->base, m->bytes);
    if (m->owner && m->name[0]) shm_unlink(m->name);
    if (m->fd >= 0) close(m->fd);  // the owner's lock goes with it
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
  if (!m || m->kind != WindowKind::host || m->fd < 0) return false;  // no lock to ask: not known gone
  flock l = first_byte(F_WRLCK);
  if (fcntl(m->fd, F_GETLK, &l) != 0) return false;
  return l.l_type == F_UNLCK;
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
