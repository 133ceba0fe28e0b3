#include "sched/comm/exchange.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <memory>
#include <mutex>
#include <thread>

#include "common/log.hpp"
#include "common/status.hpp"
#include "sched/platform/platform.hpp"

namespace fp8wire::sched {

bool get_exchange_buffer(CommState& s, size_t bytes, ExchangeBuffer* out) {
  const CudaApi& cuda = s.platform->cuda;
  out->cuda = &cuda;
  if (s.res.scratch && s.res.layout.total_bytes >= bytes) {
    out->data = s.res.scratch;
    return true;
  }
  void* p = nullptr;
  if (cuda.Malloc(&p, bytes) == cudaSuccess) {
    out->data = static_cast<char*>(p);
    out->owned_device = true;
    return true;
  }
  cuda.GetLastError();
  if (cuda.HostAlloc(&p, bytes, cudaHostAllocMapped | cudaHostAllocPortable) == cudaSuccess) {
    out->data = static_cast<char*>(p);
    out->owned_host = true;
    return true;
  }
  cuda.GetLastError();
  return false;
}

void start_setup_clock(CommState& s, const Config& config) {
  s.setup_deadline.reset();
  if (config.setup_timeout_s > 0)
    s.setup_deadline = std::chrono::steady_clock::now() + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                                              std::chrono::duration<double>(config.setup_timeout_s));
}

struct HostCall {
  const NcclApi* api = nullptr;
  std::function<void()> undo;
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  bool abandoned = false;
  ncclResult_t result = ncclSuccess;
  std::vector<ncclComm_t> release;  // communicators whose abort or destroy was asked meanwhile
};

namespace {
std::atomic<int> g_host_calls{0};
}  // namespace

ncclResult_t call_with_deadline(std::span<CommState* const> comms, const char* what,
                                std::function<ncclResult_t()> call, std::function<void()> undo) {
  const Platform& p = *comms[0]->platform;
  auto job = std::make_shared<HostCall>();
  job->api = p.nccl;
  job->undo = std::move(undo);
  void* context = p.thread_context ? p.thread_context() : nullptr;
  ++g_host_calls;
  try {
    std::thread([job, call = std::move(call), adopt = p.adopt_thread_context, context] {
      if (adopt) adopt(context);
      const ncclResult_t r = call();
      {
        std::lock_guard lock(job->mu);
        job->done = true;
        job->result = r;
        if (job->abandoned) {
          if (job->undo) job->undo();
          for (ncclComm_t c : job->release)
            if (job->api->CommAbort) job->api->CommAbort(c);
        }
      }
      job->cv.notify_all();
      --g_host_calls;
    }).detach();
  } catch (...) {
    --g_host_calls;
    throw;
  }
  std::unique_lock lock(job->mu);
  ncclResult_t given_up = ncclSuccess;
  while (!job->done) {
    const auto now = std::chrono::steady_clock::now();
    for (CommState* s : comms) {
      if (s->aborting.load(std::memory_order_acquire)) given_up = ncclInvalidUsage;
      else if (s->setup_deadline && now > *s->setup_deadline && nccl_ok(given_up)) given_up = ncclRemoteError;
    }
    if (!nccl_ok(given_up)) break;
    job->cv.wait_for(lock, std::chrono::milliseconds(1));
  }
  if (job->done) return job->result;
  job->abandoned = true;
  for (CommState* s : comms) {
    s->host_call = job;
    s->exchange_in_flight = true;
  }
  FP8WIRE_ERROR("comm {}: {} {}: the communicator's creation fails", comms[0]->id, what,
                given_up == ncclRemoteError ? "did not return from NCCL within the set-up's deadline (setup_timeout_s): "
                                              "a peer was killed or stopped"
                                            : "was given up for an abort");
  return given_up;
}

bool defer_release(CommState& s) {
  if (!s.host_call) return false;
  std::lock_guard lock(s.host_call->mu);
  if (s.host_call->done) return false;
  s.host_call->release.push_back(s.comm);
  return true;
}

bool host_call_running(CommState& s) {
  if (!s.host_call) return false;
  std::lock_guard lock(s.host_call->mu);
  return !s.host_call->done;
}

int host_calls_in_flight() { return g_host_calls.load(); }

ncclResult_t wait_exchange(CommState& s, cudaStream_t stream, const char* what) {
  const CudaApi& cuda = s.platform->cuda;
  const NcclApi& nccl = *s.platform->nccl;
  auto pause = std::chrono::microseconds(1);
  for (;;) {
    const cudaError_t q = cuda.StreamQuery(stream);
    if (q != cudaSuccess && q != cudaErrorNotReady) {
      FP8WIRE_ERROR("comm {}: {} failed: {}", s.id, what, cuda.GetErrorString(q));
      return ncclUnhandledCudaError;
    }
    // Asked also once the exchange has completed: an abort or an NCCL error may have ended it
    // without its data. From here on, an exchange given up may still be run by NCCL.
    if (s.aborting.load(std::memory_order_acquire)) {
      FP8WIRE_WARN("comm {}: aborted during {}", s.id, what);
      if (q != cudaSuccess) s.exchange_in_flight = true;
      return ncclInvalidUsage;
    }
    ncclResult_t async = ncclSuccess;
    if (nccl.CommGetAsyncError && nccl.CommGetAsyncError(s.comm, &async) == ncclSuccess && !nccl_ok(async)) {
      FP8WIRE_ERROR("comm {}: NCCL error {} during {}", s.id, static_cast<int>(async), what);
      if (q != cudaSuccess) s.exchange_in_flight = true;
      return async;
    }
    if (q == cudaSuccess) return ncclSuccess;
    if (s.setup_deadline && std::chrono::steady_clock::now() > *s.setup_deadline) {
      FP8WIRE_ERROR("comm {}: {} got no answer from every rank within the set-up's deadline (setup_timeout_s): a "
                    "peer was killed or stopped, or does not run fp8wire; the communicator's creation fails "
                    "(ncclRemoteError)", s.id, what);
      s.exchange_in_flight = true;
      return ncclRemoteError;
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(200));
  }
}

ncclResult_t gather_bytes(CommState& s, const void* mine, size_t bytes, std::vector<char>& all, const char* what) {
  const NcclApi& api = *s.platform->nccl;
  const CudaApi& cuda = s.platform->cuda;
  all.assign(bytes * static_cast<size_t>(s.nranks), 0);
  if (!s.res.scratch || all.size() > s.res.layout.total_bytes) return ncclInternalError;
  char* base = s.res.scratch;
  char* mine_at = base + static_cast<size_t>(s.rank) * bytes;
  ncclResult_t res = cuda.MemcpyAsync(mine_at, mine, bytes, cudaMemcpyHostToDevice, s.res.transfer) == cudaSuccess
                         ? ncclSuccess
                         : ncclUnhandledCudaError;
  // Issued even when the copy failed: the peers are in it.
  CommState* const one[] = {&s};
  const ncclResult_t gathered = call_with_deadline(one, what, [api = &api, cuda = &cuda, device = s.device, mine_at, base,
                                                               bytes, comm = s.comm, stream = s.res.transfer] {
    if (device >= 0) cuda->SetDevice(device);
    return api->AllGather(mine_at, base, bytes, ncclUint8, comm, stream);
  });
  if (nccl_ok(res)) res = gathered;
  if (nccl_ok(gathered)) {
    const ncclResult_t waited = wait_exchange(s, s.res.transfer, what);
    if (nccl_ok(res) || !nccl_ok(waited)) res = waited;  // a wait given up is the error that counts
  }
  if (nccl_ok(res) && cuda.Memcpy(all.data(), base, all.size(), cudaMemcpyDeviceToHost) != cudaSuccess)
    res = ncclUnhandledCudaError;
  return nccl_ok(res) ? ncclSuccess : res;
}

ncclResult_t all_agree(CommState& s, bool mine, bool* all, const char* what) {
  *all = false;
  const int32_t v = mine ? 1 : 0;
  std::vector<char> votes;
  if (const ncclResult_t r = gather_bytes(s, &v, sizeof(v), votes, what); r != ncclSuccess) return r;
  *all = true;
  for (int r = 0; r < s.nranks; ++r) {
    int32_t x = 0;
    std::memcpy(&x, votes.data() + static_cast<size_t>(r) * sizeof(x), sizeof(x));
    if (x == 0) *all = false;
  }
  return ncclSuccess;
}

}  // namespace fp8wire::sched
