#include "sched/platform/gpu_platform.hpp"

#include <unistd.h>

#include <array>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <string>

#include <cuda_runtime.h>

#include "sched/plan/agreement.hpp"

namespace fp8wire {

namespace {

bool env_is(const char* name, const char* value) {
  const char* v = std::getenv(name);
  return v && std::strcmp(v, value) == 0;
}

uint64_t local_host_hash() {
  if (const char* id = std::getenv("NCCL_HOSTID")) return sched::fnv1a(id, std::strlen(id));
  char name[256] = {};
  gethostname(name, sizeof(name) - 1);
  std::string key = name;
  std::ifstream boot("/proc/sys/kernel/random/boot_id");
  std::string boot_id;
  if (boot >> boot_id) key += boot_id;
  return sched::fnv1a(key.data(), key.size());
}

// Native atomics over P2P are the NVLink signature (PCIe P2P lacks them). A process that sees one
// GPU cannot tell and says no.
bool local_nvlink(int device) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count < 2) return false;
  for (int peer = 0; peer < count; ++peer) {
    if (peer == device) continue;
    int access = 0, atomics = 0;
    if (cudaDeviceGetP2PAttribute(&access, cudaDevP2PAttrAccessSupported, device, peer) != cudaSuccess ||
        cudaDeviceGetP2PAttribute(&atomics, cudaDevP2PAttrNativeAtomicSupported, device, peer) != cudaSuccess ||
        !access || !atomics)
      return false;
  }
  return true;
}

// The device's UUID, hashed: the same on every process that uses this GPU, whatever NCCL_HOSTID says.
uint64_t gpu_hash(int device) {
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, device) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return sched::fnv1a(prop.uuid.bytes, sizeof(prop.uuid.bytes));
}

// fp8wire's own stream-ordered pool of a device, made at its first use and kept for the process's
// life. It keeps the memory it has handed out (release threshold: all of it), so a job's messages reuse
// the same blocks step after step instead of mapping memory at every call; it holds at most what the
// messages in flight at once ever needed. The application's default pool is left as it set it.
cudaError_t message_pool(int device, cudaMemPool_t* out) {
  static std::mutex mu;
  static std::array<cudaMemPool_t, 256> pools{};
  if (device < 0 || device >= static_cast<int>(pools.size())) return cudaErrorInvalidDevice;
  std::lock_guard lock(mu);
  cudaMemPool_t& pool = pools[static_cast<size_t>(device)];
  if (!pool) {
    cudaMemPoolProps props{};
    props.allocType = cudaMemAllocationTypePinned;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = device;
    cudaMemPool_t made = nullptr;
    if (const cudaError_t err = cudaMemPoolCreate(&made, &props); err != cudaSuccess) return err;
    uint64_t keep = UINT64_MAX;
    if (const cudaError_t err = cudaMemPoolSetAttribute(made, cudaMemPoolAttrReleaseThreshold, &keep); err != cudaSuccess) {
      cudaMemPoolDestroy(made);
      return err;
    }
    pool = made;
  }
  *out = pool;
  return cudaSuccess;
}

// A block of the stream's device from fp8wire's pool; under capture a graph allocation (the graph's
// own pool, freed by the graph's free node), which is what capture supports.
cudaError_t malloc_stream_ordered(void** out, size_t bytes, cudaStream_t stream) {
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (const cudaError_t err = cudaStreamIsCapturing(stream, &capture); err != cudaSuccess) return err;
  if (capture != cudaStreamCaptureStatusNone) return cudaMallocAsync(out, bytes, stream);
  int device = -1;
  if (const cudaError_t err = cudaStreamGetDevice(stream, &device); err != cudaSuccess) return err;
  cudaMemPool_t pool = nullptr;
  if (const cudaError_t err = message_pool(device, &pool); err != cudaSuccess) return err;
  return cudaMallocFromPoolAsync(out, bytes, pool, stream);
}

cudaError_t free_stream_ordered(void* p, cudaStream_t stream) { return cudaFreeAsync(p, stream); }

}  // namespace

HostFacts gpu_host_facts(int device) {
  HostFacts f;
  f.host_hash = local_host_hash();
  f.p2p_disabled = env_is("NCCL_P2P_DISABLE", "1");
  f.nvlink_local = local_nvlink(device);
  f.process_id = static_cast<uint32_t>(getpid());
  f.gpu_hash = gpu_hash(device);
  return f;
}

Platform gpu_platform(const NcclApi& nccl) {
  Platform p;
  p.nccl = &nccl;
#define FP8WIRE_CUDA_FN(name, type) p.cuda.name = cuda##name;
#include "sched/platform/cuda_functions.def"
#undef FP8WIRE_CUDA_FN
#define FP8WIRE_CODEC_FN(name) p.codec.name = quant::name;
#include "sched/platform/codec_functions.def"
#undef FP8WIRE_CODEC_FN
  p.cuda.MallocAsync = malloc_stream_ordered;
  p.cuda.FreeAsync = free_stream_ordered;
  p.host_facts = gpu_host_facts;
  fill_direct_platform(p);
  return p;
}

}  // namespace fp8wire
