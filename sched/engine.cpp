// The scheduler: decides per call (plan.hpp) and runs the FP8 algorithms through the real-NCCL table
// and the quant launchers.
//
// Execution of one FP8 collective is a two-stream pipeline over stages of at most
// pipeline.chunk_bytes (and what one scratch buffer set holds):
//   caller stream: [wait previous call] quantize(0) | quantize(1) | quantize(2) ...      join
//   side stream:           fork -> exchange+reduce+gather+dequantize(0) | (1) | (2) ... -^
// Stage i uses buffer set i % 2, so the quantize of stage i+1 overlaps the transfer of stage i, and
// the caller stream waits for stage i-2 to finish with a set before reusing it. Only events link the
// streams, so the same code is legal under CUDA graph capture (fork/join of a captured stream).
//
// Agreement: the first candidate call on a communicator (outside capture) allocates scratch and
// exchanges RankFacts with a real ncclAllGather of a few bytes + a stream sync. Every rank then
// holds the same facts and derives the same fabric and the same "FP8 allowed" bit (plan.hpp: agree),
// so all later decisions are identical on all ranks.
#include "sched/engine.hpp"

#include <time.h>
#include <unistd.h>

#include <array>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <fstream>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/log.hpp"
#include "common/nvtx.hpp"
#include "common/status.hpp"
#include "quant/quant.hpp"
#include "sched/plan.hpp"

namespace fp8wire::sched {
namespace {

uint64_t now_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

CallKind kind_of(Collective c) {
  switch (c) {
    case Collective::all_reduce: return CallKind::all_reduce;
    case Collective::reduce_scatter: return CallKind::reduce_scatter;
    case Collective::all_gather: return CallKind::all_gather;
  }
  return CallKind::all_reduce;
}

bool env_is(const char* name, const char* value) {
  const char* v = std::getenv(name);
  return v && std::strcmp(v, value) == 0;
}

uint64_t local_host_hash() {
  // NCCL's own notion of a host: NCCL_HOSTID when set (emulated hosts), else hostname + boot id.
  if (const char* id = std::getenv("NCCL_HOSTID")) return fnv1a(id, std::strlen(id));
  char name[256] = {};
  gethostname(name, sizeof(name) - 1);
  std::string key = name;
  std::ifstream boot("/proc/sys/kernel/random/boot_id");
  std::string boot_id;
  if (boot >> boot_id) key += boot_id;
  return fnv1a(key.data(), key.size());
}

// NVLink between this GPU and every other GPU this process sees. Native atomics over P2P are the
// NVLink signature (PCIe P2P lacks them). A process that sees one GPU cannot tell and says no.
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

bool is_capturing(cudaStream_t stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &status) != cudaSuccess) return true;  // be conservative
  return status != cudaStreamCaptureStatusNone;
}

class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    if (cudaGetDevice(&previous_) == cudaSuccess && previous_ != device && device >= 0)
      changed_ = cudaSetDevice(device) == cudaSuccess;
  }
  ~DeviceGuard() {
    if (changed_) cudaSetDevice(previous_);
  }

 private:
  int previous_ = 0;
  bool changed_ = false;
};

struct CommState {
  ncclComm_t comm = nullptr;
  uint64_t id = 0;
  int nranks = 1;
  int rank = 0;
  int device = -1;
  bool nonblocking = false;
  bool single_process = false;  // ncclCommInitAll: every rank in this process, always pass through
  bool info_ok = false;  // nranks / rank / device known
  bool agreed = false;   // the exchange has run
  bool fp8_ok = false;  // the agreement allows FP8 on this communicator
  Fabric fabric = Fabric::net;
  cudaStream_t side = nullptr;
  cudaEvent_t fork = nullptr;
  cudaEvent_t last = nullptr;  // end of the most recent eager FP8 call on the side stream
  bool has_last = false;
  // The join of a captured call. Apart from `last` so that a capture neither re-records `last`
  // inside a graph (an eager stream may not wait on that) nor makes the next eager call forget the
  // previous eager one, whose side-stream work may still be reading the scratch.
  cudaEvent_t capture_join = nullptr;
  std::array<cudaEvent_t, 2> ready{};
  std::array<cudaEvent_t, 2> done{};
  char* scratch = nullptr;
  ScratchLayout layout;
  // Bit (collective * 8 + path) set once that choice has been logged at info level.
  uint32_t logged_choices = 0;
};

struct Call {
  Collective collective = Collective::all_reduce;
  const void* send = nullptr;
  void* recv = nullptr;
  size_t count = 0;
  ncclDataType_t dtype = ncclFloat32;
  ncclRedOp_t op = ncclSum;
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
};

struct Pending {
  Call call;
  CommState* state = nullptr;
  Path path = Path::passthrough;  // decided at queue time when the comm was agreed
  bool decided = false;
  std::optional<Path> forced;
  uint64_t seq = 0;
  uint64_t issue_ns = 0;
};

// Group state follows NCCL's: per thread. The queue is fixed-size so queuing never allocates; a
// call beyond it passes through (the call sequence is the same on every rank, so is the overflow).
constexpr size_t kMaxPending = 1024;
struct ThreadGroup {
  GroupState group;
  std::array<Pending, kMaxPending> pending;
  std::array<PendingShape, kMaxPending> shapes;
  size_t npending = 0;
};
thread_local ThreadGroup* tl_group = nullptr;
ThreadGroup& thread_group() {
  if (!tl_group) tl_group = new ThreadGroup();  // once per thread, outside any hot loop
  return *tl_group;
}

struct ResidualKey {
  uint64_t comm_id;
  const void* buffer;
  size_t count;
  bool operator==(const ResidualKey&) const = default;
};
struct ResidualKeyHash {
  size_t operator()(const ResidualKey& k) const {
    return std::hash<uint64_t>()(k.comm_id) ^ (std::hash<const void*>()(k.buffer) << 1) ^ (k.count << 7);
  }
};

}  // namespace

struct Engine::Impl {
  Config config;
  const NcclApi* api;
  quant::WireFormat format;
  quant::LaunchOptions launch;
  bool env_nonblocking;

  mutable std::mutex mutex;
  std::unordered_map<ncclComm_t, std::unique_ptr<CommState>> comms;
  uint64_t next_comm_id = 1;

  std::mutex residual_mutex;
  std::unordered_map<ResidualKey, float*, ResidualKeyHash> residuals;
  uint64_t residual_bytes = 0;

  Config forced_rules;  // config with every switch on: the eligibility rules of forced calls

  Impl(const Config& c, const NcclApi& a)
      : config(c), api(&a), format(quant::WireFormat::from(c)),
        env_nonblocking(env_is("NCCL_COMM_BLOCKING", "0")), forced_rules(c) {
    launch.path = c.convert_path;
    forced_rules.enable = true;
    forced_rules.collective_enable.fill(true);
  }

  // ---- communicator state ----------------------------------------------------------------------
  CommState* state_for(ncclComm_t comm) {
    std::lock_guard lock(mutex);
    auto it = comms.find(comm);
    if (it != comms.end()) {
      CommState* known = it->second.get();
      if (!known->info_ok) query_info(*known);
      return known;
    }
    auto state = std::make_unique<CommState>();
    state->comm = comm;
    state->id = next_comm_id++;
    state->nonblocking = env_nonblocking;
    query_info(*state);
    CommState* raw = state.get();
    comms.emplace(comm, std::move(state));
    return raw;
  }

  // Takes a communicator out of the registry; its resources are the caller's to release.
  std::unique_ptr<CommState> detach(ncclComm_t comm) {
    std::lock_guard lock(mutex);
    auto it = comms.find(comm);
    if (it == comms.end()) return nullptr;
    std::unique_ptr<CommState> state = std::move(it->second);
    comms.erase(it);
    return state;
  }

  // The state of a communicator already registered, else nullptr: no NCCL query, no allocation.
  const CommState* known_state(ncclComm_t comm) const {
    std::lock_guard lock(mutex);
    auto it = comms.find(comm);
    return it != comms.end() && it->second->info_ok ? it->second.get() : nullptr;
  }

  // A communicator registered inside a group (ncclCommInitRank between GroupStart/End) or still
  // initialising (non-blocking) cannot answer yet; it is asked again at its next call.
  void query_info(CommState& s) const {
    int nranks = 0, rank = -1, device = -1;
    const bool ok = api->CommCount && api->CommUserRank && api->CommCuDevice &&
                    api->CommCount(s.comm, &nranks) == ncclSuccess &&
                    api->CommUserRank(s.comm, &rank) == ncclSuccess &&
                    api->CommCuDevice(s.comm, &device) == ncclSuccess && nranks >= 1 && rank >= 0;
    if (!ok) return;  // nranks stays 1: the call passes through
    s.nranks = nranks;
    s.rank = rank;
    s.device = device;
    s.info_ok = true;
  }

  void release(CommState& s) {
    // A communicator that never reached the agreement owns no CUDA resource: touch nothing (no
    // cudaSetDevice, which would create a context on its device).
    if (!s.agreed && !s.side && !s.scratch) return;
    DeviceGuard guard(s.device);
    if (s.side) cudaStreamSynchronize(s.side);
    if (s.scratch) cudaFree(s.scratch);
    for (cudaEvent_t e : {s.fork, s.last, s.capture_join, s.ready[0], s.ready[1], s.done[0], s.done[1]})
      if (e) cudaEventDestroy(e);
    if (s.side) cudaStreamDestroy(s.side);
    std::lock_guard lock(residual_mutex);
    for (auto it = residuals.begin(); it != residuals.end();) {
      if (it->first.comm_id == s.id) {
        residual_bytes -= it->first.count * sizeof(float);
        cudaFree(it->second);
        it = residuals.erase(it);
      } else {
        ++it;
      }
    }
  }

  // Local resources for FP8 on this communicator. Failure is not an error: it is reported in the
  // agreement, and every rank then passes through.
  bool allocate(CommState& s) {
    s.layout = scratch_layout(config);
    if (cudaStreamCreateWithFlags(&s.side, cudaStreamNonBlocking) != cudaSuccess) return false;
    for (cudaEvent_t* e : {&s.fork, &s.last, &s.capture_join, &s.ready[0], &s.ready[1], &s.done[0], &s.done[1]})
      if (cudaEventCreateWithFlags(e, cudaEventDisableTiming) != cudaSuccess) return false;
    void* p = nullptr;
    if (cudaMalloc(&p, s.layout.total_bytes) != cudaSuccess) {
      cudaGetLastError();  // clear the sticky-free allocation error
      FP8WIRE_WARN("cannot allocate {} of scratch (scratch.max_bytes) on device {}",
                   format_size(s.layout.total_bytes), s.device);
      return false;
    }
    s.scratch = static_cast<char*>(p);
    return true;
  }

  // Runs the one-time exchange; returns whether FP8 is allowed. Caller checked: not capturing.
  ncclResult_t agree_on(CommState& s, cudaStream_t stream) {
    DeviceGuard guard(s.device);
    NvtxRange range("fp8wire agree");
    RankFacts mine;
    mine.host_hash = local_host_hash();
    mine.config_fingerprint = config_fingerprint(config);
    mine.p2p_disabled = env_is("NCCL_P2P_DISABLE", "1");
    mine.nvlink_local = local_nvlink(s.device);
    mine.scratch_ok = allocate(s);
    std::vector<RankFacts> all(static_cast<size_t>(s.nranks));
    void* dev = nullptr;
    cudaStream_t exchange = s.side ? s.side : stream;
    FP8WIRE_CUDA_CHECK(cudaMalloc(&dev, all.size() * sizeof(RankFacts)));
    char* base = static_cast<char*>(dev);
    ncclResult_t res = ncclSuccess;
    cudaError_t err = cudaMemcpyAsync(base + s.rank * sizeof(RankFacts), &mine, sizeof(mine),
                                      cudaMemcpyHostToDevice, exchange);
    if (err == cudaSuccess && exchange != stream) {
      err = cudaEventRecord(s.fork, stream);
      if (err == cudaSuccess) err = cudaStreamWaitEvent(exchange, s.fork, 0);
    }
    if (err == cudaSuccess)
      res = api->AllGather(base + s.rank * sizeof(RankFacts), base, sizeof(RankFacts), ncclUint8,
                           s.comm, exchange);
    if (err == cudaSuccess && res == ncclSuccess)
      err = cudaMemcpyAsync(all.data(), base, all.size() * sizeof(RankFacts), cudaMemcpyDeviceToHost,
                            exchange);
    if (err == cudaSuccess && res == ncclSuccess) err = cudaStreamSynchronize(exchange);
    cudaFree(dev);
    s.agreed = true;
    if (err != cudaSuccess || res != ncclSuccess) {
      FP8WIRE_ERROR("fp8wire agreement exchange failed on comm {} ({}, nccl {}); FP8 off for it",
                    s.id, cudaGetErrorString(err), static_cast<int>(res));
      s.fp8_ok = false;
      return err != cudaSuccess ? ncclUnhandledCudaError : res;
    }
    const Agreement a = agree(config, all);
    s.fabric = a.fabric;
    s.fp8_ok = a.fp8_ok;
    FP8WIRE_INFO("comm {}: {} ranks, rank {}, device {}, fabric {}{}, FP8 {}{}", s.id, s.nranks, s.rank,
                 s.device, to_string(s.fabric), config.fabric_override ? " (override)" : "",
                 s.fp8_ok ? "on" : "off: ", a.reason);
    if (!s.fp8_ok) FP8WIRE_WARN("comm {}: FP8 disabled, passing through: {}", s.id, a.reason);
    return ncclSuccess;
  }

  // ---- planning --------------------------------------------------------------------------------
  CallShape shape_of(const Call& c, const CommState* s) const {
    CallShape shape;
    shape.collective = c.collective;
    shape.dtype = c.dtype;
    shape.op = c.op;
    shape.count = c.count;
    shape.nranks = s ? s->nranks : 2;
    shape.nonblocking = s ? s->nonblocking : false;
    shape.single_process = s ? s->single_process : false;
    return shape;
  }

  Path decide(const Call& c, const CommState& s, std::optional<Path> forced) const {
    const Path path = forced ? *forced : plan_call(config, shape_of(c, &s), s.fabric).path;
    if (path == Path::passthrough || path == Path::fallback) return path;
    return s.fp8_ok ? path : Path::fallback;  // eligible, but the agreement ruled FP8 out
  }

  // Whether one pipeline stage of this call fits a scratch buffer set: a function of the config,
  // the size and the world size only, so every rank answers alike.
  bool fits_scratch(const CommState& s, Collective collective, Path path, size_t count,
                    ncclDataType_t dtype) const {
    return stage_elems(config, s.layout, collective, path, count, nccl_type_size(dtype), s.nranks,
                       format, s.fabric) > 0;
  }

  // ---- plain NCCL ------------------------------------------------------------------------------
  ncclResult_t issue_plain(const Call& c) {
    switch (c.collective) {
      case Collective::all_reduce:
        return api->AllReduce(c.send, c.recv, c.count, c.dtype, c.op, c.comm, c.stream);
      case Collective::reduce_scatter:
        return api->ReduceScatter(c.send, c.recv, c.count, c.dtype, c.op, c.comm, c.stream);
      case Collective::all_gather:
        return api->AllGather(c.send, c.recv, c.count, c.dtype, c.comm, c.stream);
    }
    return ncclInvalidArgument;
  }

  CallRecord make_record(const Call& c, const CommState* s, Path path, uint64_t seq, uint64_t issue) {
    CallRecord r;
    r.seq = seq;
    r.comm_id = s ? s->id : 0;
    r.kind = kind_of(c.collective);
    r.path = path;
    r.dtype = c.dtype;
    r.op = c.op;
    r.nranks = s ? s->nranks : 0;
    r.rank = s ? s->rank : 0;
    r.count = c.count;
    r.app_bytes = c.count * nccl_type_size(c.dtype);
    r.issue_ns = issue;
    return r;
  }

  // What this rank sends in NCCL's ring algorithms (nccl-tests' bus-bandwidth factors). Without the
  // communicator's size (calls rejected before the registry lookup) the caller's bytes stand in.
  static uint64_t plain_wire_bytes(const Call& c, const CommState* s) {
    const uint64_t bytes = c.count * nccl_type_size(c.dtype);
    if (!s || s->nranks <= 1) return s ? 0 : bytes;
    const uint64_t n = static_cast<uint64_t>(s->nranks);
    if (c.collective == Collective::all_reduce) return 2 * (n - 1) * bytes / n;
    return (n - 1) * bytes;  // reduce_scatter: recvcount per peer; all_gather: sendcount per peer
  }

  ncclResult_t run_plain_recorded(const Call& c, const CommState* s, Path path, uint64_t seq,
                                  uint64_t issue) {
    CallRecord r = make_record(c, s, path, seq, issue);
    const CallHooks* hooks = call_hooks();
    if (hooks && hooks->begin) hooks->begin(r);
    const ncclResult_t res = issue_plain(c);
    r.wire_bytes = plain_wire_bytes(c, s);
    if (hooks && hooks->end) hooks->end(r);
    Accounting::instance().record(r);
    return res;
  }

  // ---- error feedback ----------------------------------------------------------------------------
  float* residual_for(const CommState& s, const Call& c, bool capturing) {
    if (!config.error_feedback || c.collective != Collective::all_reduce) return nullptr;
    const ResidualKey key{s.id, c.send, c.count};
    std::lock_guard lock(residual_mutex);
    auto it = residuals.find(key);
    if (it != residuals.end()) return it->second;
    const uint64_t need = c.count * sizeof(float);
    // No allocation under capture; beyond the cap the buffer simply goes without feedback.
    if (capturing || residual_bytes + need > config.error_feedback_max_bytes) return nullptr;
    void* p = nullptr;
    if (cudaMalloc(&p, need) != cudaSuccess) {
      cudaGetLastError();
      return nullptr;
    }
    if (cudaMemsetAsync(p, 0, need, c.stream) != cudaSuccess) {
      cudaFree(p);
      return nullptr;
    }
    residual_bytes += need;
    residuals.emplace(key, static_cast<float*>(p));
    return static_cast<float*>(p);
  }

  // ---- FP8 execution -----------------------------------------------------------------------------
  ncclResult_t begin_pipeline(CommState& s, cudaStream_t stream, bool capturing) {
    // A previous eager call may still use the scratch on the side stream (from another caller
    // stream). Under capture the event lies outside the graph and must not be waited on.
    if (s.has_last && !capturing) FP8WIRE_CUDA_CHECK(cudaStreamWaitEvent(stream, s.last, 0));
    FP8WIRE_CUDA_CHECK(cudaEventRecord(s.fork, stream));
    FP8WIRE_CUDA_CHECK(cudaStreamWaitEvent(s.side, s.fork, 0));
    return ncclSuccess;
  }
  ncclResult_t end_pipeline(CommState& s, cudaStream_t stream, bool capturing) {
    cudaEvent_t end = capturing ? s.capture_join : s.last;
    FP8WIRE_CUDA_CHECK(cudaEventRecord(end, s.side));
    FP8WIRE_CUDA_CHECK(cudaStreamWaitEvent(stream, end, 0));
    if (!capturing) s.has_last = true;
    return ncclSuccess;
  }
  // Before the caller stream writes buffer set `set` for stage `stage`.
  ncclResult_t acquire_set(CommState& s, cudaStream_t stream, size_t stage) {
    if (stage >= 2) FP8WIRE_CUDA_CHECK(cudaStreamWaitEvent(stream, s.done[stage % 2], 0));
    return ncclSuccess;
  }
  ncclResult_t hand_over(CommState& s, cudaStream_t stream, size_t stage) {
    FP8WIRE_CUDA_CHECK(cudaEventRecord(s.ready[stage % 2], stream));
    FP8WIRE_CUDA_CHECK(cudaStreamWaitEvent(s.side, s.ready[stage % 2], 0));
    return ncclSuccess;
  }
  ncclResult_t release_set(CommState& s, size_t stage) {
    FP8WIRE_CUDA_CHECK(cudaEventRecord(s.done[stage % 2], s.side));
    return ncclSuccess;
  }

#define FP8WIRE_QUANT(call)                                                                   \
  do {                                                                                        \
    cudaError_t qerr_ = (call);                                                               \
    if (qerr_ != cudaSuccess) {                                                               \
      FP8WIRE_ERROR("codec launch failed: {} in {}", cudaGetErrorString(qerr_), #call);       \
      return ncclUnhandledCudaError;                                                          \
    }                                                                                         \
  } while (0)

  // Issues `sends_and_recvs(call)` between GroupStart and GroupEnd, where call(result) records the
  // first failure. The group is always closed: a failed Send/Recv must not leave the application's
  // thread inside an open NCCL group (its later calls would be swallowed into it).
  template <class Body>
  ncclResult_t in_group(const char* what, Body&& sends_and_recvs) {
    FP8WIRE_NCCL_CHECK(api->GroupStart());
    ncclResult_t res = ncclSuccess;
    sends_and_recvs([&res](ncclResult_t r) {
      if (nccl_ok(res) && !nccl_ok(r)) res = r;
    });
    const ncclResult_t end = api->GroupEnd();
    if (!nccl_ok(res)) {
      FP8WIRE_ERROR("NCCL error {} in the send/recv group of the {}", static_cast<int>(res), what);
      return res;
    }
    FP8WIRE_NCCL_CHECK(end);
    return ncclSuccess;
  }

  // The gather step of an FP8 path: rank r's slot (base + r * slot_bytes) to every rank's slot r,
  // by ncclAllGather or by grouped send/recv to every peer (GatherTransport; same layout, same bytes).
  ncclResult_t gather_slots(CommState& s, GatherTransport gather, char* base, size_t slot_bytes) {
    if (gather != GatherTransport::sendrecv) {
      FP8WIRE_NCCL_CHECK(api->AllGather(base + s.rank * slot_bytes, base, slot_bytes, ncclUint8, s.comm, s.side));
      return ncclSuccess;
    }
    return in_group("send/recv gather", [&](auto call) {
      for (int j = 0; j < s.nranks; ++j) {
        if (j == s.rank) continue;
        call(api->Send(base + s.rank * slot_bytes, slot_bytes, ncclUint8, j, s.comm, s.side));
        call(api->Recv(base + j * slot_bytes, slot_bytes, ncclUint8, j, s.comm, s.side));
      }
    });
  }

  // All-reduce of `count` elements from `in` to `out` (may alias). Returns ncclInvalidUsage (with no
  // side effect) when the scratch cannot hold even one stage: the caller falls back.
  ncclResult_t all_reduce_fp8(CommState& s, Path path, GatherTransport gather, const void* in, void* out,
                              size_t count, ncclDataType_t dtype, ncclRedOp_t op, cudaStream_t stream,
                              float* residual, bool capturing, uint64_t* wire) {
    quant::ElemType type;
    elem_type_of(dtype, &type);
    const size_t es = quant::elem_size(type);
    const size_t stage = stage_elems(config, s.layout, Collective::all_reduce, path, count, es,
                                     s.nranks, format, s.fabric);
    if (stage == 0) return ncclInvalidUsage;
    const int n = s.nranks, r = s.rank;
    const float post = op == ncclAvg ? 1.0f / static_cast<float>(n) : 1.0f;
    const auto* src = static_cast<const char*>(in);
    auto* dst = static_cast<char*>(out);
    const size_t stages = stage_count(count, stage);
    if (auto res = begin_pipeline(s, stream, capturing); res != ncclSuccess) return res;
    for (size_t i = 0; i < stages; ++i) {
      const size_t off = i * stage;
      const size_t len = std::min(stage, count - off);
      char* set = s.scratch + s.layout.set_offset(static_cast<int>(i % 2));
      quant::LaunchOptions opt = launch;
      opt.sr_offset = off;
      if (auto res = acquire_set(s, stream, i); res != ncclSuccess) return res;
      if (path == Path::one_shot) {
        const size_t cb = quant::chunk_bytes(len, format);
        char* gathered = set;
        {
          NvtxRange q("fp8wire quantize");
          const quant::Segmented single = quant::Segmented::single(len, format);
          if (residual)
            FP8WIRE_QUANT(quant::quantize_with_residual(src + off * es, type, len, residual + off,
                                                       gathered + r * cb, single, format, stream, opt));
          else
            FP8WIRE_QUANT(quant::quantize(src + off * es, type, len, gathered + r * cb, single, format,
                                         stream, opt));
        }
        if (auto res = hand_over(s, stream, i); res != ncclSuccess) return res;
        if (auto res = gather_slots(s, gather, gathered, cb); res != ncclSuccess) return res;
        std::array<const void*, quant::kMaxReduceInputs> inputs;
        for (int j = 0; j < n; ++j) inputs[j] = gathered + j * cb;
        quant::ReduceOutput o;
        o.plain = dst + off * es;
        o.plain_type = type;
        FP8WIRE_QUANT(quant::dequantize_reduce(inputs.data(), n, len, post, o, format, s.side, opt));
        *wire += cb * static_cast<uint64_t>(n - 1);
      } else {
        const ShardLayout l = shard_layout(len, n, format);
        const size_t stride = l.seg_stride;
        char* sent = set;
        char* received = set + l.total_bytes();
        // Two-shot: the reduced shard goes into the receive area's own slot (never received into,
        // never an input of the reduce), and the in-place all-gather fills the other slots once the
        // reduce has consumed them (same stream). Ring: send slot, receive slot, gathered.
        char* gathered = received;
        if (path == Path::ring) {
          received = set + stride;
          gathered = set + 2 * stride;
        }
        if (path == Path::two_shot) {
          NvtxRange q("fp8wire quantize");
          if (residual)
            FP8WIRE_QUANT(quant::quantize_with_residual(src + off * es, type, len, residual + off, sent,
                                                       l.segmented(), format, stream, opt));
          else
            FP8WIRE_QUANT(quant::quantize(src + off * es, type, len, sent, l.segmented(), format, stream, opt));
        } else {
          // Ring: rank r starts by sending its own copy of chunk r-1.
          const int c0 = (r - 1 + n) % n;
          if (l.length(c0)) {
            quant::LaunchOptions o0 = opt;
            o0.sr_offset = off + l.begin(c0);
            FP8WIRE_QUANT(quant::quantize(src + (off + l.begin(c0)) * es, type, l.length(c0), sent,
                                         quant::Segmented::single(l.length(c0), format), format, stream, o0));
          }
        }
        if (auto res = hand_over(s, stream, i); res != ncclSuccess) return res;
        if (path == Path::two_shot) {
          const ncclResult_t sent_res = in_group("two-shot all-to-all", [&](auto call) {
            for (int j = 0; j < n; ++j) {
              if (j == r) continue;
              if (l.length(j)) {
                call(api->Send(sent + j * stride, l.bytes(j, format), ncclUint8, j, s.comm, s.side));
                *wire += l.bytes(j, format);
              }
              if (l.length(r)) call(api->Recv(received + j * stride, l.bytes(r, format), ncclUint8, j, s.comm, s.side));
            }
          });
          if (sent_res != ncclSuccess) return sent_res;
          if (l.length(r)) {
            std::array<const void*, quant::kMaxReduceInputs> inputs;
            for (int j = 0; j < n; ++j) inputs[j] = (j == r ? sent : received) + j * stride;
            quant::ReduceOutput o;
            o.wire = gathered + r * stride;
            quant::LaunchOptions ro = opt;
            ro.sr_offset = off + l.begin(r);
            FP8WIRE_QUANT(quant::dequantize_reduce(inputs.data(), n, l.length(r), post, o, format, s.side, ro));
          }
        } else {
          for (int step = 0; step + 1 < n; ++step) {
            const int c_send = ((r - step - 1) % n + n) % n;
            const int c_recv = ((r - step - 2) % n + n) % n;
            const ncclResult_t hop = in_group("ring hop", [&](auto call) {
              if (l.length(c_send)) {
                call(api->Send(sent, l.bytes(c_send, format), ncclUint8, (r + 1) % n, s.comm, s.side));
                *wire += l.bytes(c_send, format);
              }
              if (l.length(c_recv)) call(api->Recv(received, l.bytes(c_recv, format), ncclUint8, (r - 1 + n) % n, s.comm, s.side));
            });
            if (hop != ncclSuccess) return hop;
            if (!l.length(c_recv)) continue;
            const bool last = step + 2 == n;
            const void* acc = received;
            quant::ReduceOutput o;
            o.wire = last ? gathered + r * stride : sent;
            quant::LaunchOptions ro = opt;
            ro.sr_offset = off + l.begin(c_recv);
            FP8WIRE_QUANT(quant::dequantize_reduce_mixed(&acc, 1, src + (off + l.begin(c_recv)) * es, type, 1,
                                                        l.length(c_recv), last ? post : 1.0f, o, format,
                                                        s.side, ro));
          }
        }
        if (auto res = gather_slots(s, gather, gathered, stride); res != ncclSuccess) return res;
        *wire += stride * static_cast<uint64_t>(n - 1);
        // Every rank, the owner included, decodes the same gathered bytes: identical results.
        FP8WIRE_QUANT(quant::dequantize(gathered, l.segmented(), len, dst + off * es, type, format, s.side, opt));
      }
      if (auto res = release_set(s, i); res != ncclSuccess) return res;
    }
    return end_pipeline(s, stream, capturing);
  }

  ncclResult_t reduce_scatter_fp8(CommState& s, const void* in, void* out, size_t recvcount,
                                  ncclDataType_t dtype, ncclRedOp_t op, cudaStream_t stream,
                                  bool capturing, uint64_t* wire) {
    quant::ElemType type;
    elem_type_of(dtype, &type);
    const size_t es = quant::elem_size(type);
    const size_t stage = stage_elems(config, s.layout, Collective::reduce_scatter, Path::two_shot,
                                     recvcount, es, s.nranks, format, s.fabric);
    if (stage == 0) return ncclInvalidUsage;
    const int n = s.nranks, r = s.rank;
    const float post = op == ncclAvg ? 1.0f / static_cast<float>(n) : 1.0f;
    const auto* src = static_cast<const char*>(in);
    auto* dst = static_cast<char*>(out);
    if (auto res = begin_pipeline(s, stream, capturing); res != ncclSuccess) return res;
    const size_t stages = stage_count(recvcount, stage);
    for (size_t i = 0; i < stages; ++i) {
      const size_t off = i * stage;
      const size_t len = std::min(stage, recvcount - off);
      const size_t cb = quant::chunk_bytes(len, format);
      char* sent = s.scratch + s.layout.set_offset(static_cast<int>(i % 2));
      char* received = sent + n * cb;
      if (auto res = acquire_set(s, stream, i); res != ncclSuccess) return res;
      for (int j = 0; j < n; ++j) {
        quant::LaunchOptions opt = launch;
        opt.sr_offset = j * recvcount + off;
        FP8WIRE_QUANT(quant::quantize(src + (j * recvcount + off) * es, type, len, sent + j * cb,
                                     quant::Segmented::single(len, format), format, stream, opt));
      }
      if (auto res = hand_over(s, stream, i); res != ncclSuccess) return res;
      const ncclResult_t exchanged = in_group("reduce-scatter all-to-all", [&](auto call) {
        for (int j = 0; j < n; ++j) {
          if (j == r) continue;
          call(api->Send(sent + j * cb, cb, ncclUint8, j, s.comm, s.side));
          call(api->Recv(received + j * cb, cb, ncclUint8, j, s.comm, s.side));
        }
      });
      if (exchanged != ncclSuccess) return exchanged;
      *wire += cb * static_cast<uint64_t>(n - 1);
      std::array<const void*, quant::kMaxReduceInputs> inputs;
      for (int j = 0; j < n; ++j) inputs[j] = (j == r ? sent : received) + j * cb;
      quant::ReduceOutput o;
      o.plain = dst + off * es;
      o.plain_type = type;
      quant::LaunchOptions opt = launch;
      opt.sr_offset = r * recvcount + off;
      FP8WIRE_QUANT(quant::dequantize_reduce(inputs.data(), n, len, post, o, format, s.side, opt));
      if (auto res = release_set(s, i); res != ncclSuccess) return res;
    }
    return end_pipeline(s, stream, capturing);
  }

  ncclResult_t all_gather_fp8(CommState& s, GatherTransport gather, const void* in, void* out, size_t sendcount,
                              ncclDataType_t dtype, cudaStream_t stream, bool capturing, uint64_t* wire) {
    quant::ElemType type;
    elem_type_of(dtype, &type);
    const size_t es = quant::elem_size(type);
    const size_t stage = stage_elems(config, s.layout, Collective::all_gather, Path::one_shot,
                                     sendcount, es, s.nranks, format, s.fabric);
    if (stage == 0) return ncclInvalidUsage;
    const int n = s.nranks, r = s.rank;
    const auto* src = static_cast<const char*>(in);
    auto* dst = static_cast<char*>(out);
    if (auto res = begin_pipeline(s, stream, capturing); res != ncclSuccess) return res;
    const size_t stages = stage_count(sendcount, stage);
    for (size_t i = 0; i < stages; ++i) {
      const size_t off = i * stage;
      const size_t len = std::min(stage, sendcount - off);
      const size_t cb = quant::chunk_bytes(len, format);
      char* gathered = s.scratch + s.layout.set_offset(static_cast<int>(i % 2));
      if (auto res = acquire_set(s, stream, i); res != ncclSuccess) return res;
      quant::LaunchOptions opt = launch;
      opt.sr_offset = off;
      FP8WIRE_QUANT(quant::quantize(src + off * es, type, len, gathered + r * cb,
                                   quant::Segmented::single(len, format), format, stream, opt));
      if (auto res = hand_over(s, stream, i); res != ncclSuccess) return res;
      if (auto res = gather_slots(s, gather, gathered, cb); res != ncclSuccess) return res;
      *wire += cb * static_cast<uint64_t>(n - 1);
      if (stages == 1 && len % format.block == 0) {
        // Whole slots, block aligned: the gathered buffer is one segmented buffer.
        FP8WIRE_QUANT(quant::dequantize(gathered, quant::Segmented{len, cb}, len * n, dst, type, format,
                                       s.side, opt));
      } else {
        for (int j = 0; j < n; ++j)
          FP8WIRE_QUANT(quant::dequantize(gathered + j * cb, quant::Segmented::single(len, format), len,
                                         dst + (j * sendcount + off) * es, type, format, s.side, opt));
      }
      if (auto res = release_set(s, i); res != ncclSuccess) return res;
    }
    return end_pipeline(s, stream, capturing);
  }

  // Runs one FP8 call (or passes it through with Path::fallback when it cannot run). `batch` > 1:
  // the calls items[0..batch) are packed through the staging area into one all-reduce.
  ncclResult_t run_fp8(CommState& s, const Call& c, Path path, uint64_t seq, uint64_t issue,
                       const Pending* items = nullptr, size_t batch = 1) {
    const bool capturing = is_capturing(c.stream);
    CallRecord rec = make_record(c, &s, path, seq, issue);
    quant::ElemType type;
    elem_type_of(c.dtype, &type);
    const size_t es = quant::elem_size(type);
    if (batch > 1) {
      rec.coalesced_calls = static_cast<uint32_t>(batch);
      rec.count = 0;
      for (size_t i = 0; i < batch; ++i) rec.count += items[i].call.count;
      rec.app_bytes = rec.count * es;
    }
    // The gather transport of this call (of the whole batch when coalesced): from the config and the
    // call's shape only, like the path, so every rank picks the same.
    CallShape shape = shape_of(c, &s);
    shape.count = rec.count;
    const GatherTransport gather = has_gather_step(c.collective, path)
        ? gather_transport_for(config, c.collective, path, threshold_bytes(shape), s.nranks, s.fabric)
        : GatherTransport::automatic;
    rec.gather = gather;
    const CallHooks* hooks = call_hooks();
    if (hooks && hooks->begin) hooks->begin(rec);
    NvtxRange range(path == Path::one_shot ? "fp8wire one_shot" : path == Path::ring ? "fp8wire ring" : "fp8wire two_shot");
    uint64_t wire = 0;
    ncclResult_t res = ncclSuccess;
    const bool runnable = fits_scratch(s, c.collective, path, rec.count, c.dtype);
    if (!runnable) {
      // handled below: pass through without any FP8 side effect
    } else if (batch > 1) {
      char* staging = s.scratch;
      size_t off = 0;
      // The staging area is free once the previous call's side-stream work is done.
      if (s.has_last && !capturing && cudaStreamWaitEvent(c.stream, s.last, 0) != cudaSuccess)
        res = ncclUnhandledCudaError;
      for (size_t i = 0; i < batch && res == ncclSuccess; ++i) {
        const size_t bytes = items[i].call.count * es;
        if (cudaMemcpyAsync(staging + off, items[i].call.send, bytes, cudaMemcpyDeviceToDevice, c.stream) != cudaSuccess)
          res = ncclUnhandledCudaError;
        off += bytes;
      }
      if (res == ncclSuccess)
        res = all_reduce_fp8(s, path, gather, staging, staging, rec.count, c.dtype, c.op, c.stream, nullptr, capturing, &wire);
      off = 0;
      for (size_t i = 0; i < batch && res == ncclSuccess; ++i) {
        const size_t bytes = items[i].call.count * es;
        if (cudaMemcpyAsync(items[i].call.recv, staging + off, bytes, cudaMemcpyDeviceToDevice, c.stream) != cudaSuccess)
          res = ncclUnhandledCudaError;
        off += bytes;
      }
      // The copies out of the staging area run on the caller stream after the side stream's end:
      // the next call (maybe from another stream) must wait for them before refilling the area.
      if (res == ncclSuccess && !capturing && cudaEventRecord(s.last, c.stream) != cudaSuccess)
        res = ncclUnhandledCudaError;
    } else {
      switch (c.collective) {
        case Collective::all_reduce:
          res = all_reduce_fp8(s, path, gather, c.send, c.recv, c.count, c.dtype, c.op, c.stream,
                               path == Path::ring ? nullptr : residual_for(s, c, capturing), capturing, &wire);
          break;
        case Collective::reduce_scatter:
          res = reduce_scatter_fp8(s, c.send, c.recv, c.count, c.dtype, c.op, c.stream, capturing, &wire);
          break;
        case Collective::all_gather:
          res = all_gather_fp8(s, gather, c.send, c.recv, c.count, c.dtype, c.stream, capturing, &wire);
          break;
      }
    }
    if (!runnable) {
      // Not even one pipeline stage fits the scratch: a function of the configuration, the size and
      // the world size only, so every rank falls back together.
      FP8WIRE_WARN_ONCE("scratch.max_bytes too small for one pipeline stage of a {} on {} ranks; passing through",
                        to_string(c.collective), s.nranks);
      rec.path = Path::fallback;
      rec.gather = GatherTransport::automatic;
      if (batch > 1) {
        res = ncclSuccess;
        for (size_t i = 0; i < batch && res == ncclSuccess; ++i) res = issue_plain(items[i].call);
      } else {
        res = issue_plain(c);
      }
      rec.wire_bytes = 0;
    } else {
      rec.wire_bytes = wire;
    }
    const uint32_t choice = 1u << (static_cast<int>(c.collective) * 8 + static_cast<int>(rec.path));
    if (!(s.logged_choices & choice)) {
      s.logged_choices |= choice;
      FP8WIRE_INFO("comm {} ({} ranks, fabric {}): first {} on path {}{}{} ({} B of caller data, {} calls)", s.id,
                   s.nranks, to_string(s.fabric), to_string(c.collective), to_string(rec.path),
                   rec.gather == GatherTransport::automatic ? "" : ", gather by ",
                   rec.gather == GatherTransport::automatic ? "" : to_string(rec.gather), rec.app_bytes,
                   rec.coalesced_calls);
    }
    FP8WIRE_DEBUG("seq {} {} {} x{} {} comm {} -> {} ({} calls), wire {} B", seq, to_string(c.collective),
                  rec.count, es, to_string(s.fabric), s.id, to_string(rec.path), rec.coalesced_calls, rec.wire_bytes);
    if (hooks && hooks->end) hooks->end(rec);
    Accounting::instance().record(rec);
    return res;
  }

  // ---- the entry point of every collective -------------------------------------------------------
  ncclResult_t submit(const Call& c, std::optional<Path> forced) {
    const uint64_t seq = Accounting::instance().next_seq();
    const uint64_t issue = now_ns();
    if (forced && (*forced == Path::passthrough || *forced == Path::fallback))
      return run_plain_recorded(c, state_for(c.comm), Path::passthrough, seq, issue);
    // Cheap rules first: most ineligible calls never touch the communicator registry. A forced path
    // ignores the enable switches (the benchmark measures FP8 all_gather although it is off by
    // default) but not the rules FP8 cannot serve (dtype, op, world size).
    const Config& rules = forced ? forced_rules : config;
    if (static_eligibility(rules, shape_of(c, nullptr)) != PassReason::none)
      return run_plain_recorded(c, nullptr, Path::passthrough, seq, issue);
    // Size against the smallest threshold over the fabrics, still before the communicator is
    // looked up, queried or agreed on (and so before any CUDA call: on a machine or communicator
    // where CUDA cannot answer, a small call must not become a "capturing" FP8 candidate).
    // reduce_scatter / all_gather thresholds count the whole buffer (x world size): bound it with
    // the largest world FP8 serves; the exact check follows the lookup.
    if (!forced) {
      CallShape widest = shape_of(c, nullptr);
      widest.nranks = quant::kMaxReduceInputs;
      if (below_every_threshold(config, widest))
        return run_plain_recorded(c, known_state(c.comm), Path::passthrough, seq, issue);
    }
    CommState* s = state_for(c.comm);
    if (static_eligibility(rules, shape_of(c, s)) != PassReason::none ||
        (!forced && below_every_threshold(config, shape_of(c, s))))
      return run_plain_recorded(c, s, Path::passthrough, seq, issue);

    ThreadGroup& tg = thread_group();
    if (tg.group.inside()) {
      Path path = Path::passthrough;
      if (s->agreed) {
        path = decide(c, *s, forced);
        // Pass-through calls stay inside the application's real group.
        if (path == Path::passthrough || path == Path::fallback)
          return run_plain_recorded(c, s, path, seq, issue);
      }
      if (tg.npending == kMaxPending) {
        FP8WIRE_WARN_ONCE("more than {} FP8 calls in one group; the rest pass through", kMaxPending);
        return run_plain_recorded(c, s, Path::fallback, seq, issue);
      }
      Pending& p = tg.pending[tg.npending++];
      p = Pending{c, s, path, s->agreed, forced, seq, issue};
      return ncclSuccess;
    }

    if (!s->agreed) {
      if (is_capturing(c.stream)) {
        FP8WIRE_WARN_ONCE("first FP8 candidate of a communicator issued under CUDA graph capture: "
                          "passing through until a call outside capture lets the ranks agree");
        return run_plain_recorded(c, s, Path::fallback, seq, issue);
      }
      FP8WIRE_NCCL_CHECK(agree_on(*s, c.stream));
    }
    const Path path = decide(c, *s, forced);
    if (path == Path::passthrough || path == Path::fallback) return run_plain_recorded(c, s, path, seq, issue);
    return run_fp8(*s, c, path, seq, issue);
  }

  // Runs the queued calls after the application's outermost real GroupEnd, in issue order.
  ncclResult_t flush_pending() {
    ThreadGroup& tg = thread_group();
    const size_t count = tg.npending;
    tg.npending = 0;
    ncclResult_t first_error = ncclSuccess;
    for (size_t i = 0; i < count; ++i) {
      Pending& p = tg.pending[i];
      if (!p.decided) {
        if (!p.state->agreed && !is_capturing(p.call.stream)) {
          const ncclResult_t res = agree_on(*p.state, p.call.stream);
          if (res != ncclSuccess && first_error == ncclSuccess) first_error = res;
        }
        p.path = p.state->agreed ? decide(p.call, *p.state, p.forced) : Path::fallback;
        p.decided = true;
      }
      PendingShape& shape = tg.shapes[i];
      shape.comm = p.call.comm;
      shape.stream = p.call.stream;
      shape.fp8 = p.path != Path::passthrough && p.path != Path::fallback;
      shape.collective = p.call.collective;
      shape.dtype = p.call.dtype;
      shape.op = p.call.op;
      shape.bytes = p.call.count * nccl_type_size(p.call.dtype);
    }
    for (size_t i = 0; i < count;) {
      Pending& p = tg.pending[i];
      ncclResult_t res;
      size_t batch = 1;
      if (!tg.shapes[i].fp8) {
        res = run_plain_recorded(p.call, p.state, p.path, p.seq, p.issue_ns);
      } else {
        batch = coalesce_batch_length(config, p.state->layout.staging_bytes,
                                      std::span<const PendingShape>(tg.shapes.data() + i, count - i));
        // Same path for the whole batch: the first call's, planned on its own size. The packed size
        // is a function of the same rank-identical inputs, so all ranks pack alike.
        for (size_t k = 1; k < batch; ++k)
          if (tg.pending[i + k].path != p.path) { batch = k; break; }
        res = run_fp8(*p.state, p.call, p.path, p.seq, p.issue_ns, &tg.pending[i], batch);
      }
      if (res != ncclSuccess && first_error == ncclSuccess) first_error = res;
      i += batch;
    }
    return first_error;
  }
};

namespace {
// Nothing throws out of Engine (STYLE.md 5): an allocation failure in the registry or the agreement
// becomes an NCCL error code with a log line.
template <typename Fn>
ncclResult_t guarded(const char* what, Fn&& fn) noexcept {
  try {
    return fn();
  } catch (const std::exception& e) {
    FP8WIRE_ERROR("fp8wire {}: {}", what, e.what());
  } catch (...) {
    FP8WIRE_ERROR("fp8wire {}: unknown exception", what);
  }
  return ncclInternalError;
}
}  // namespace

Engine::Engine(const Config& config, const NcclApi& api) : impl_(new Impl(config, api)) {}
Engine::~Engine() {
  for (auto& [comm, state] : impl_->comms) impl_->release(*state);
}
const Config& Engine::config() const { return impl_->config; }
const NcclApi& Engine::nccl() const { return *impl_->api; }

void Engine::comm_created(ncclComm_t comm) {
  guarded("comm_created", [&] {
    impl_->state_for(comm);
    return ncclSuccess;
  });
}
void Engine::comm_created(ncclComm_t comm, bool nonblocking) {
  guarded("comm_created", [&] {
    impl_->state_for(comm)->nonblocking = nonblocking || impl_->env_nonblocking;
    return ncclSuccess;
  });
}

void Engine::comm_created_single_process(ncclComm_t comm) {
  guarded("comm_created", [&] {
    impl_->state_for(comm)->single_process = true;
    return ncclSuccess;
  });
}

bool Engine::comm_single_process(ncclComm_t comm) const {
  std::lock_guard lock(impl_->mutex);
  auto it = impl_->comms.find(comm);
  return it != impl_->comms.end() && it->second->single_process;
}

void Engine::comm_destroyed(ncclComm_t comm) {
  guarded("comm_destroyed", [&] {
    std::unique_ptr<CommState> state = impl_->detach(comm);
    if (state) impl_->release(*state);
    return ncclSuccess;
  });
}

ncclResult_t Engine::comm_abort(ncclComm_t comm) {
  // Detached first: once the real abort has freed the communicator, a new one may be created at the
  // same address and must not find this one's state.
  std::unique_ptr<CommState> state;
  guarded("comm_abort", [&] {
    state = impl_->detach(comm);
    return ncclSuccess;
  });
  const ncclResult_t result = impl_->api->CommAbort ? impl_->api->CommAbort(comm) : ncclInternalError;
  if (state) {
    guarded("comm_abort", [&] {
      impl_->release(*state);
      return ncclSuccess;
    });
  }
  return result;
}

ncclResult_t Engine::all_reduce(const void* s, void* r, size_t n, ncclDataType_t t, ncclRedOp_t op,
                                ncclComm_t c, cudaStream_t st) {
  return guarded("collective", [&] { return impl_->submit({Collective::all_reduce, s, r, n, t, op, c, st}, std::nullopt); });
}
ncclResult_t Engine::reduce_scatter(const void* s, void* r, size_t n, ncclDataType_t t, ncclRedOp_t op,
                                    ncclComm_t c, cudaStream_t st) {
  return guarded("collective", [&] { return impl_->submit({Collective::reduce_scatter, s, r, n, t, op, c, st}, std::nullopt); });
}
ncclResult_t Engine::all_gather(const void* s, void* r, size_t n, ncclDataType_t t, ncclComm_t c,
                                cudaStream_t st) {
  return guarded("collective", [&] { return impl_->submit({Collective::all_gather, s, r, n, t, ncclSum, c, st}, std::nullopt); });
}

ncclResult_t Engine::group_start() {
  return guarded("group_start", [&] {
    thread_group().group.start();
    return impl_->api->GroupStart();
  });
}

ncclResult_t Engine::group_end() {
  return guarded("group_end", [&] {
    ThreadGroup& tg = thread_group();
    const bool outermost = tg.group.end();
    const ncclResult_t res = impl_->api->GroupEnd();
    if (!outermost || tg.npending == 0) return res;
    const ncclResult_t queued = impl_->flush_pending();
    return res != ncclSuccess ? res : queued;
  });
}

ncclResult_t Engine::group_simulate_end(ncclSimInfo_t* sim_info) {
  return guarded("group_simulate_end", [&] {
    ThreadGroup& tg = thread_group();
    // Left open, the engine's depth would stay above NCCL's: every later FP8 candidate of this
    // thread would be queued until some later GroupEnd, which would also run the simulated calls.
    if (tg.group.end()) tg.npending = 0;
    return impl_->api->GroupSimulateEnd ? impl_->api->GroupSimulateEnd(sim_info) : ncclSystemError;
  });
}

ncclResult_t Engine::all_reduce_forced(Path p, const void* s, void* r, size_t n, ncclDataType_t t,
                                       ncclRedOp_t op, ncclComm_t c, cudaStream_t st) {
  return guarded("collective", [&] { return impl_->submit({Collective::all_reduce, s, r, n, t, op, c, st}, p); });
}
ncclResult_t Engine::reduce_scatter_forced(Path p, const void* s, void* r, size_t n, ncclDataType_t t,
                                           ncclRedOp_t op, ncclComm_t c, cudaStream_t st) {
  // reduce_scatter has one FP8 algorithm; any FP8 path selects it.
  if (p != Path::passthrough && p != Path::fallback) p = Path::two_shot;
  return guarded("collective", [&] { return impl_->submit({Collective::reduce_scatter, s, r, n, t, op, c, st}, p); });
}
ncclResult_t Engine::all_gather_forced(Path p, const void* s, void* r, size_t n, ncclDataType_t t,
                                       ncclComm_t c, cudaStream_t st) {
  if (p != Path::passthrough && p != Path::fallback) p = Path::one_shot;
  return guarded("collective", [&] { return impl_->submit({Collective::all_gather, s, r, n, t, ncclSum, c, st}, p); });
}

Fabric Engine::fabric_of(ncclComm_t comm) const {
  std::lock_guard lock(impl_->mutex);
  auto it = impl_->comms.find(comm);
  if (it != impl_->comms.end() && it->second->agreed) return it->second->fabric;
  return impl_->config.fabric_override.value_or(Fabric::net);
}

}  // namespace fp8wire::sched
