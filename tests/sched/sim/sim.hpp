// A simulated machine for the CPU tier of the scheduler: N ranks in one process, each on a thread of
// its own, with simulated CUDA streams and events, a simulated NCCL (collectives, grouped send/recv,
// split, abort) and the CPU reference codec run as stream work. It fills the same Platform tables
// the GPU fills, so the engine runs unchanged: every algorithm, the agreement, the pipeline's events,
// the group queue and every error path.
//
// Work is asynchronous as on a GPU: an API call only enqueues; a scheduler runs whatever is runnable
// (in a seeded random order across streams) when some thread waits. Three checkers watch it:
//   - races: every access of simulated device memory carries a vector clock (stream order, events,
//     host synchronisation); two accesses of overlapping bytes, one a write, that are not ordered
//     are reported (a scratch buffer reused while an earlier stage may still read it, a caller
//     stream not joined on some exit path);
//   - deadlocks: when every rank thread waits and nothing can run, the waits fail and are reported;
//   - protocol: a receive of another size than was sent, an operation on a destroyed stream, event
//     or communicator, a synchronisation while a stream is captured.
// Faults: the k-th call at a given site on a given rank returns an error instead of enqueueing.
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "sched/platform/platform.hpp"

namespace fp8wire::sim {

enum class Site : uint8_t {
  codec,          // any codec launch
  send,           // ncclSend
  recv,           // ncclRecv
  all_gather,     // ncclAllGather
  group_end,      // ncclGroupEnd
  event_record,   // cudaEventRecord
  stream_wait,    // cudaStreamWaitEvent
  memcpy_async,   // cudaMemcpyAsync
  is_capturing,   // cudaStreamIsCapturing
  malloc,         // cudaMalloc
  host_alloc,     // cudaHostAlloc
  stream_create,  // cudaStreamCreateWithFlags
  wait_value,     // a stream memory-operation wait (the direct transports' barrier)
  write_value,    // a stream memory-operation write
  window_create,  // a direct transport's window of this rank
  window_open,    // a peer's window mapped by this rank
};
inline constexpr int kSiteCount = 16;
const char* to_string(Site s);

struct Fault {
  int rank = -1;   // -1: none
  Site site = Site::codec;
  int index = 0;   // the index-th call at `site` on `rank` (0-based) fails
  int count = 1;   // and the count-1 calls after it
};

struct Options {
  int nranks = 2;
  // Host of each rank (the agreement's host hash); empty: every rank its own host, as emulated ranks.
  std::vector<uint64_t> hosts;
  bool p2p_disabled = false;
  bool nvlink = false;
  // The GPU of each rank (HostFacts::gpu_hash; ranks with the same one share it, as ranks emulated on
  // one GPU); empty: unknown (0) on every rank, as a platform that cannot tell.
  std::vector<uint64_t> gpus;
  uint64_t schedule_seed = 1;  // order in which runnable streams progress
  // Hardware queues per rank: 0, every stream runs on its own; k > 0, a rank's streams share k
  // first-in first-out queues (stream i on queue i % k), as CUDA puts streams on at most
  // CUDA_DEVICE_MAX_CONNECTIONS connections: an operation starts only once everything issued before
  // it to its queue, from any stream, has completed. A stream memory wait then holds back every
  // later operation of its queue, so a wait issued before the write its peer waits for can hang.
  int hw_queues = 0;
  // Every stream reports itself captured into a graph (cudaStreamIsCapturing), so the engine takes its
  // captured calls' choices (their lane hand-overs, no telemetry record, no allocation); the work
  // still runs as it is issued, as a graph launched once would.
  bool capturing = false;
  // direct.ctas of the job (0: not checked): a codec launch that touches a direct-transport window
  // must keep to it, and one on the rank's own allocations alone must run uncapped (a protocol error
  // otherwise).
  uint32_t window_ctas = 0;
  // Room for host windows on the machine, all ranks together, as a shared-memory file system of this
  // size (0: unlimited): a host window that does not fit is refused with cudaErrorMemoryAllocation,
  // as the GPU's platform refuses one that /dev/shm has no room for.
  size_t host_window_room = 0;
  // NCCL's first collective on a communicator connects to its peers inside its launch (runtime
  // connection): a rank's first collective call on a communicator (outside a group) returns only once
  // every rank has made its first, or the communicator is aborted (ncclRemoteError then).
  bool connect_at_first_collective = false;
};

class World {
 public:
  explicit World(Options options);
  ~World();
  World(const World&) = delete;
  World& operator=(const World&) = delete;

  // The platform whose tables run on this world (one world at a time per process).
  const Platform& platform() const;
  int nranks() const;

  // A communicator over all ranks (or `members`, in rank order): one handle per member, as each
  // rank's ncclCommInitRank would have returned it.
  std::vector<ncclComm_t> create_comm(std::vector<int> members = {});
  // Runs body(rank) on one thread per rank and joins them. Inside, simulated calls act as that rank.
  void run_ranks(const std::function<void(int rank)>& body);
  // The application's watchdog: aborts the communicator of `handle` for every rank (their pending
  // operations complete without data, and ncclCommGetAsyncError reports ncclRemoteError).
  void abort_comm(ncclComm_t handle);
  // NCCL reports an asynchronous error on every communicator split from the one of `handle` (a
  // failure on fp8wire's own sub-communicators, which the application never holds).
  void abort_splits(ncclComm_t handle);

  void set_fault(Fault fault);
  // How many calls at `site` `rank` has made so far.
  int calls_at(int rank, Site site) const;

  // Test helpers acting as the application of the calling rank: an access of device memory on
  // `stream` (checked for races like any other), a wait for every stream of the rank, and the bytes
  // of simulated device memory still allocated by a rank.
  void app_access(cudaStream_t stream, const void* ptr, size_t bytes, bool write);
  cudaError_t synchronize_rank();
  size_t live_bytes(int rank) const;
  // Direct-transport windows not yet freed: a window lives until its owner destroyed it and every
  // rank that mapped it has closed it (as POSIX shared memory does).
  size_t live_windows() const;
  // The process of `rank` ends without tearing anything down: what its peers see of it through its
  // direct-transport windows, whose owner's hold goes (DirectMemoryApi::owner_gone answers true). Its
  // mappings stay until the test tears its objects down (acting as that rank), only to free memory.
  void end_process(int rank);

  // What the checkers found (empty when all is well).
  std::vector<std::string> races() const;
  std::vector<std::string> protocol_errors() const;
  bool deadlocked() const;

  struct State;

 private:
  std::unique_ptr<State> state_;
};

// The rank the calling thread acts as (set by run_ranks; tests on the main thread may set it).
void set_thread_rank(int rank);

}  // namespace fp8wire::sim
