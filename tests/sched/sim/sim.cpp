// The simulated machine (sim.hpp). One global world at a time; the Platform tables are plain
// function pointers, so they reach it through g_world and the calling thread's rank.
#include "tests/sched/sim/sim.hpp"

#include <algorithm>
#include <array>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <thread>

#include <fmt/format.h>

#include "quant/reference.hpp"
#include "sched/platform/nccl_types.hpp"

namespace fp8wire::sim {

const char* to_string(Site s) {
  switch (s) {
    case Site::codec: return "codec";
    case Site::send: return "send";
    case Site::recv: return "recv";
    case Site::all_gather: return "all_gather";
    case Site::group_end: return "group_end";
    case Site::event_record: return "event_record";
    case Site::stream_wait: return "stream_wait";
    case Site::memcpy_async: return "memcpy_async";
    case Site::is_capturing: return "is_capturing";
    case Site::malloc: return "malloc";
    case Site::host_alloc: return "host_alloc";
    case Site::stream_create: return "stream_create";
    case Site::wait_value: return "wait_value";
    case Site::write_value: return "write_value";
    case Site::window_create: return "window_create";
    case Site::window_open: return "window_open";
  }
  return "?";
}

namespace {

constexpr int kMaxLanes = 64;  // lane 0 is the host of each rank
using Clock = std::array<uint32_t, kMaxLanes>;
void merge(Clock& into, const Clock& other) {
  for (int i = 0; i < kMaxLanes; ++i) into[i] = std::max(into[i], other[i]);
}

struct Access {
  uintptr_t begin = 0, end = 0;
  bool write = false;
  int lane = 0;
  Clock clock{};
  std::string what;
};

struct Stream;
struct Op {
  virtual ~Op() = default;
  std::string what;
  Clock host_at_issue{};  // the host's knowledge when the op was issued: it happens after all of it
  // Advances the op; true once it has completed.
  virtual bool step(World::State& w, Stream& s) = 0;
};

struct Stream {
  int rank = 0;
  int lane = 0;
  std::deque<std::unique_ptr<Op>> queue;
  Clock clock{};
  bool destroyed = false;
};

struct Event {
  int rank = 0;
  uint64_t issued = 0;  // records issued
  uint64_t done = 0;    // records executed
  std::map<uint64_t, Clock> at;
  bool destroyed = false;
};

struct Collective {
  std::vector<std::vector<char>> contrib;
  std::vector<bool> posted;
  int posted_count = 0;
  int taken = 0;  // ranks that have read their result; the slot goes when all have
};

struct Comm {
  std::vector<int> members;  // world rank of each comm rank
  bool aborted = false;
  const Comm* parent = nullptr;  // the communicator it was split from
  std::map<std::pair<int, int>, std::deque<std::vector<char>>> mail;  // (src, dst) comm ranks
  std::map<uint64_t, Collective> collectives;
  // ncclCommSplit rendezvous
  std::vector<std::pair<int, int>> split_args;  // (color, key) per comm rank
  std::vector<bool> split_arrived;
  int split_count = 0;
  uint64_t split_round = 0;
  std::vector<ncclComm_t> split_result;
  int connected = 0;  // ranks that have made their first collective (Options::connect_at_first_collective)
};

struct Handle {
  Comm* comm = nullptr;
  int rank = 0;          // rank in the communicator
  uint64_t next_seq = 0; // collectives issued
  bool destroyed = false;
  bool connected = false;  // its first collective has been made (Options::connect_at_first_collective)
};

struct RankState {
  int next_lane = 1;
  Clock host{};
  Stream* legacy = nullptr;
  std::vector<Access> log;
  std::map<uintptr_t, size_t> allocs;
  std::map<uintptr_t, size_t> mapped;  // direct-transport windows this rank has mapped (its own too)
  std::set<uintptr_t> owned;           // of those, the ones it created and still holds
  size_t live = 0;
  std::array<int, kSiteCount> calls{};
  int group_depth = 0;
  std::vector<std::function<void()>> grouped;  // enqueues deferred to the group's end
  // The group's sends, enqueued at its end before everything else: NCCL runs a group's operations
  // together, so a receive issued before the send it needs (a rank's message to itself, on one
  // stream) completes; here a send never waits, so the sends going first is that.
  std::vector<std::function<void()>> grouped_sends;
  bool group_failed = false;
  std::vector<std::deque<const Op*>> hw_queues;  // Options::hw_queues: each queue's ops in issue order
};

thread_local int t_rank = -1;

}  // namespace

struct World::State {
  Options opt;
  Platform platform;
  NcclApi nccl;
  std::mutex mu;
  std::condition_variable cv;
  std::vector<RankState> ranks;
  std::vector<std::unique_ptr<Stream>> streams;
  std::vector<std::unique_ptr<Event>> events;
  std::vector<std::unique_ptr<Comm>> comms;
  std::vector<std::unique_ptr<Handle>> handles;
  Fault fault;
  std::vector<std::string> races, protocol;
  bool deadlock = false;
  // Deadlock detection: `epoch` moves with every enqueue and every op run; every thread waiting
  // with the epoch unchanged for a while (a woken waiter may not have run yet) is a deadlock.
  uint64_t epoch = 0;
  uint64_t stall_epoch = ~0ull;
  std::chrono::steady_clock::time_point stall_since;
  int active = 1;   // threads acting as ranks (the main thread outside run_ranks)
  int waiting = 0;  // of those, blocked in a simulated wait
  std::mt19937_64 rng;
  // Direct-transport windows by base: the memory lives while any rank maps it (as POSIX shared memory
  // does); its owner "holds" it (the GPU's lock) until it destroys it or its process ends.
  struct SimWindow {
    size_t bytes = 0;
    int mappings = 0;
    int owner = 0;
    bool owner_holds = true;
    bool host = false;  // a host window (Options::host_window_room)
  };
  std::map<uintptr_t, SimWindow> windows;
  // The last stream memory write of each flag word: its rank and that stream's clock. A wait it
  // satisfies on the same rank orders what follows the wait after what preceded the write (the
  // write's memory barrier), as an event would; across ranks the lanes' clocks do not compare.
  struct FlagWrite {
    int rank = 0;
    Clock clock{};
  };
  std::map<const void*, FlagWrite> flag_writes;
  // Stream-ordered blocks already freed: no longer any rank's allocation (a later access is reported),
  // their memory kept until the world ends so that such an access reads stale bytes instead of crashing.
  std::vector<void*> freed_in_order;
};

namespace {

World::State* g_world = nullptr;

World::State& W() { return *g_world; }
RankState& R(World::State& w) { return w.ranks.at(static_cast<size_t>(t_rank < 0 ? 0 : t_rank)); }
int me() { return t_rank < 0 ? 0 : t_rank; }

void protocol_error(World::State& w, std::string text) {
  w.protocol.push_back(fmt::format("rank {}: {}", me(), std::move(text)));
}

bool fail_here(World::State& w, Site site) {
  RankState& r = R(w);
  int& n = r.calls[static_cast<size_t>(site)];
  const bool fail = w.fault.rank == me() && w.fault.site == site && w.fault.index <= n && n < w.fault.index + w.fault.count;
  ++n;
  return fail;
}

// --- races ----------------------------------------------------------------------------------------
bool inside(const std::map<uintptr_t, size_t>& ranges, uintptr_t b, uintptr_t e) {
  auto it = ranges.upper_bound(b);
  if (it == ranges.begin()) return false;
  --it;
  return e <= it->first + it->second;
}
bool inside_allocation(const RankState& r, uintptr_t b, uintptr_t e) {
  return inside(r.allocs, b, e) || inside(r.mapped, b, e);
}

void record_access(World::State& w, int rank, int lane, const Clock& clock, const void* p, size_t bytes,
                   bool write, const std::string& what) {
  if (!p || !bytes) return;
  RankState& r = w.ranks[static_cast<size_t>(rank)];
  const uintptr_t b = reinterpret_cast<uintptr_t>(p), e = b + bytes;
  // Device work touches only memory its rank allocated and has not freed (host staging aside).
  if (lane != 0 && !inside_allocation(r, b, e))
    w.protocol.push_back(fmt::format("rank {}: {} {} {} bytes outside any live allocation of the rank", rank, what,
                                     write ? "writes" : "reads", bytes));
  for (auto it = r.log.begin(); it != r.log.end();) {
    const Access& a = *it;
    const bool overlap = a.begin < e && b < a.end;
    if (overlap && (a.write || write)) {
      const bool ordered = a.clock[static_cast<size_t>(a.lane)] <= clock[static_cast<size_t>(a.lane)];
      if (!ordered) {
        // The lanes are numbered per rank in the order they were created (0: the host).
        w.races.push_back(fmt::format("rank {}: {} ({} of {} bytes at +{}, lane {}) races with {} ({}, lane {})", rank,
                                      what, write ? "write" : "read", bytes, b - a.begin, lane, a.what,
                                      a.write ? "write" : "read", a.lane));
      } else if (write && b <= a.begin && a.end <= e) {
        it = r.log.erase(it);  // covered by an ordered write: it can no longer race with anything
        continue;
      }
    }
    ++it;
  }
  r.log.push_back(Access{b, e, write, lane, clock, what});
}

// --- streams and scheduling ---------------------------------------------------------------------
Stream* stream_of(World::State& w, cudaStream_t s) {
  if (s) return reinterpret_cast<Stream*>(s);
  RankState& r = R(w);
  if (!r.legacy) {
    auto st = std::make_unique<Stream>();
    st->rank = me();
    st->lane = r.next_lane++;
    r.legacy = st.get();
    w.streams.push_back(std::move(st));
  }
  return r.legacy;
}

void enqueue(World::State& w, Stream& s, std::unique_ptr<Op> op) {
  if (s.destroyed) protocol_error(w, "work enqueued on a destroyed stream: " + op->what);
  RankState& r = w.ranks[static_cast<size_t>(s.rank)];
  op->host_at_issue = r.host;
  if (w.opt.hw_queues > 0) r.hw_queues[static_cast<size_t>(s.lane % w.opt.hw_queues)].push_back(op.get());
  s.queue.push_back(std::move(op));
  ++w.epoch;
  w.cv.notify_all();
}

// Runs whatever can run; true when anything advanced.
bool progress(World::State& w) {
  bool any = false;
  std::vector<Stream*> order;
  for (;;) {
    order.clear();
    for (auto& s : w.streams)
      if (!s->queue.empty()) order.push_back(s.get());
    std::shuffle(order.begin(), order.end(), w.rng);
    bool round = false;
    for (Stream* s : order) {
      while (!s->queue.empty()) {
        Op& op = *s->queue.front();
        std::deque<const Op*>* hw = nullptr;
        if (w.opt.hw_queues > 0) {
          hw = &w.ranks[static_cast<size_t>(s->rank)].hw_queues[static_cast<size_t>(s->lane % w.opt.hw_queues)];
          if (hw->front() != &op) break;  // an earlier operation of its queue has not completed
        }
        merge(s->clock, op.host_at_issue);
        if (!op.step(w, *s)) break;
        if (hw) hw->pop_front();
        s->queue.pop_front();
        round = true;
      }
    }
    if (!round) {
      if (any) w.cv.notify_all();  // a waiter's stream may have been run by this thread
      return any;
    }
    ++w.epoch;
    any = true;
  }
}

// True once every rank thread has been waiting, with nothing able to run, for long enough that no
// woken waiter can still be on its way.
bool stalled(World::State& w) {
  if (w.waiting < w.active || progress(w)) return false;
  const auto now = std::chrono::steady_clock::now();
  if (w.stall_epoch != w.epoch) {
    w.stall_epoch = w.epoch;
    w.stall_since = now;
    return false;
  }
  return now - w.stall_since > std::chrono::milliseconds(300);
}

// Blocks the calling rank until done() (progressing the machine), or reports a deadlock: every rank
// thread waiting and nothing able to run.
bool wait_until(World::State& w, std::unique_lock<std::mutex>& lock, const std::function<bool()>& done) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  for (;;) {
    progress(w);
    if (done()) return true;
    if (w.deadlock) return false;
    ++w.waiting;
    if (stalled(w) && !done()) {
      w.deadlock = true;
      w.protocol.push_back(fmt::format("rank {}: deadlock: every rank waits and nothing can run", me()));
      --w.waiting;
      w.cv.notify_all();
      return false;
    }
    w.cv.wait_for(lock, std::chrono::milliseconds(20));
    --w.waiting;
    if (std::chrono::steady_clock::now() > deadline) {
      w.deadlock = true;
      w.protocol.push_back(fmt::format("rank {}: no progress for 60 s", me()));
      return false;
    }
  }
}

// Blocks until every stream of `rank` has run all its work, as a device synchronisation does.
bool drain_rank(World::State& w, std::unique_lock<std::mutex>& lock, int rank) {
  return wait_until(w, lock, [&] {
    for (auto& s : w.streams)
      if (s->rank == rank && !s->queue.empty()) return false;
    return true;
  });
}

// --- ops ------------------------------------------------------------------------------------------
struct Range {
  const void* p;
  size_t bytes;
  bool write;
};

struct ComputeOp final : Op {
  std::vector<Range> ranges;
  std::function<void()> fn;
  bool step(World::State& w, Stream& s) override {
    ++s.clock[static_cast<size_t>(s.lane)];
    for (const Range& r : ranges) record_access(w, s.rank, s.lane, s.clock, r.p, r.bytes, r.write, what);
    if (fn) fn();
    return true;
  }
};

struct RecordOp final : Op {
  Event* event;
  uint64_t gen;
  bool step(World::State&, Stream& s) override {
    ++s.clock[static_cast<size_t>(s.lane)];
    event->at[gen] = s.clock;
    event->done = std::max(event->done, gen);
    return true;
  }
};

struct WaitOp final : Op {
  Event* event;
  uint64_t gen;
  bool step(World::State&, Stream& s) override {
    if (event->done < gen) return false;
    merge(s.clock, event->at[gen]);
    ++s.clock[static_cast<size_t>(s.lane)];
    return true;
  }
};

struct SendOp final : Op {
  Handle* h;
  int peer;
  const void* data;
  size_t bytes;
  bool step(World::State& w, Stream& s) override {
    ++s.clock[static_cast<size_t>(s.lane)];
    if (h->comm->aborted) return true;
    record_access(w, s.rank, s.lane, s.clock, data, bytes, false, what);
    const char* p = static_cast<const char*>(data);
    h->comm->mail[{h->rank, peer}].emplace_back(p, p + bytes);
    return true;
  }
};

struct RecvOp final : Op {
  Handle* h;
  int peer;
  void* data;
  size_t bytes;
  bool step(World::State& w, Stream& s) override {
    if (h->comm->aborted) return true;
    auto& box = h->comm->mail[{peer, h->rank}];
    if (box.empty()) return false;
    std::vector<char> msg = std::move(box.front());
    box.pop_front();
    ++s.clock[static_cast<size_t>(s.lane)];
    if (msg.size() != bytes) {
      w.protocol.push_back(fmt::format("rank {}: received {} bytes from comm rank {} where {} were expected", s.rank,
                                       msg.size(), peer, bytes));
      return true;
    }
    record_access(w, s.rank, s.lane, s.clock, data, bytes, true, what);
    std::memcpy(data, msg.data(), bytes);
    return true;
  }
};

float load_value(const void* p, DataType t, size_t i) {
  switch (t) {
    case DataType::f32: return quant::ref::load_elem(p, quant::ElemType::f32, i);
    case DataType::f16: return quant::ref::load_elem(p, quant::ElemType::f16, i);
    case DataType::bf16: return quant::ref::load_elem(p, quant::ElemType::bf16, i);
    case DataType::int32: return static_cast<float>(static_cast<const int32_t*>(p)[i]);
    case DataType::uint8: return static_cast<float>(static_cast<const uint8_t*>(p)[i]);
    case DataType::int8: return static_cast<float>(static_cast<const int8_t*>(p)[i]);
    default: return static_cast<float>(static_cast<const double*>(p)[i]);
  }
}
void store_value(void* p, DataType t, size_t i, float v) {
  switch (t) {
    case DataType::f32: quant::ref::store_elem(p, quant::ElemType::f32, i, v); break;
    case DataType::f16: quant::ref::store_elem(p, quant::ElemType::f16, i, v); break;
    case DataType::bf16: quant::ref::store_elem(p, quant::ElemType::bf16, i, v); break;
    case DataType::int32: static_cast<int32_t*>(p)[i] = static_cast<int32_t>(v); break;
    case DataType::uint8: static_cast<uint8_t*>(p)[i] = static_cast<uint8_t>(v); break;
    case DataType::int8: static_cast<int8_t*>(p)[i] = static_cast<int8_t>(v); break;
    default: static_cast<double*>(p)[i] = v; break;
  }
}

// One rank's part of a call whose result needs every member's send buffer (the collectives, the
// all-to-all): call `seq` of its communicator's slots.
struct ExchangeOp : Op {
  Handle* h = nullptr;
  uint64_t seq = 0;
  const void* send = nullptr;
  void* recv = nullptr;
  bool posted = false;
  // Posts the rank's `send_bytes` at `send` into `col` the first time (its read of the send buffer);
  // false until every one of the `n` members has posted. Then true, the write of `recv_bytes` at
  // `recv` recorded: the caller writes its result from col.contrib.
  bool all_posted(World::State& w, Stream& s, Collective& col, size_t n, size_t send_bytes, size_t recv_bytes) {
    if (!posted) {
      ++s.clock[static_cast<size_t>(s.lane)];
      record_access(w, s.rank, s.lane, s.clock, send, send_bytes, false, what);
      if (col.contrib.empty()) {
        col.contrib.resize(n);
        col.posted.assign(n, false);
      }
      const char* p = static_cast<const char*>(send);
      col.contrib[static_cast<size_t>(h->rank)].assign(p, p + send_bytes);
      col.posted[static_cast<size_t>(h->rank)] = true;
      ++col.posted_count;
      posted = true;
    }
    if (col.posted_count < static_cast<int>(n)) return false;
    ++s.clock[static_cast<size_t>(s.lane)];
    record_access(w, s.rank, s.lane, s.clock, recv, recv_bytes, true, what);
    return true;
  }
};

enum class CollKind { all_gather, all_reduce, reduce_scatter };
struct CollectiveOp final : ExchangeOp {
  CollKind kind;
  size_t count;  // elements per rank (all_gather: sendcount; reduce_scatter: recvcount)
  DataType dtype;
  ReduceOp op;
  bool step(World::State& w, Stream& s) override {
    Comm& c = *h->comm;
    const size_t n = c.members.size();
    const size_t es = dtype_size(dtype);
    const size_t in_elems = kind == CollKind::reduce_scatter ? count * n : count;
    const size_t out_elems = kind == CollKind::all_gather ? count * n : count;
    if (c.aborted) return true;
    Collective& col = c.collectives[seq];
    if (!all_posted(w, s, col, n, in_elems * es, out_elems * es)) return false;
    char* out = static_cast<char*>(recv);
    if (kind == CollKind::all_gather) {
      for (size_t j = 0; j < n; ++j) std::memcpy(out + j * count * es, col.contrib[j].data(), count * es);
    } else {
      const size_t first = kind == CollKind::reduce_scatter ? static_cast<size_t>(h->rank) * count : 0;
      for (size_t i = 0; i < count; ++i) {
        float acc = load_value(col.contrib[0].data(), dtype, first + i);
        for (size_t j = 1; j < n; ++j) {
          const float v = load_value(col.contrib[j].data(), dtype, first + i);
          switch (op) {
            case ReduceOp::prod: acc *= v; break;
            case ReduceOp::max: acc = std::max(acc, v); break;
            case ReduceOp::min: acc = std::min(acc, v); break;
            default: acc += v; break;
          }
        }
        if (op == ReduceOp::avg) acc /= static_cast<float>(n);
        store_value(out, dtype, i, acc);
      }
    }
    if (++col.taken == static_cast<int>(n)) c.collectives.erase(seq);
    return true;
  }
};

// `bytes` rounded up to the 256-byte alignment of CUDA's allocations, filled with `fill` (null: out
// of memory).
void* aligned_block(size_t bytes, int fill, size_t* rounded) {
  *rounded = (std::max<size_t>(bytes, 1) + 255) / 256 * 256;
  void* p = std::aligned_alloc(256, *rounded);
  if (p) std::memset(p, fill, *rounded);
  return p;
}

// --- CUDA runtime: the functions of CudaApi, by their names there (and what only they use) --------
namespace cuda_runtime {

const char* GetErrorString(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorMemoryAllocation: return "out of memory (simulated)";
    case cudaErrorInvalidValue: return "invalid argument (simulated)";
    case cudaErrorNotReady: return "not ready (simulated)";
    case cudaErrorLaunchFailure: return "launch failure (simulated fault)";
    case cudaErrorLaunchTimeout: return "deadlock (simulated)";
    case cudaErrorStreamCaptureUnsupported: return "not permitted under capture (simulated)";
    default: return "error (simulated)";
  }
}

cudaError_t GetDevice(int* d) {
  *d = 0;
  return cudaSuccess;
}
cudaError_t SetDevice(int) { return cudaSuccess; }

cudaError_t StreamCreateWithFlags(cudaStream_t* out, unsigned int) {
  World::State& w = W();
  std::lock_guard lock(w.mu);
  if (fail_here(w, Site::stream_create)) return cudaErrorLaunchFailure;
  RankState& r = R(w);
  if (r.next_lane >= kMaxLanes) {
    protocol_error(w, "more streams than the simulator tracks");
    return cudaErrorMemoryAllocation;
  }
  auto s = std::make_unique<Stream>();
  s->rank = me();
  s->lane = r.next_lane++;
  *out = reinterpret_cast<cudaStream_t>(s.get());
  w.streams.push_back(std::move(s));
  return cudaSuccess;
}

cudaError_t StreamDestroy(cudaStream_t s) {
  World::State& w = W();
  std::lock_guard lock(w.mu);
  Stream* st = stream_of(w, s);
  if (st->destroyed) protocol_error(w, "stream destroyed twice");
  st->destroyed = true;
  return cudaSuccess;
}

cudaError_t StreamQuery(cudaStream_t s) {
  World::State& w = W();
  std::unique_lock lock(w.mu);
  Stream* st = stream_of(w, s);
  progress(w);
  if (st->queue.empty()) {
    merge(w.ranks[static_cast<size_t>(st->rank)].host, st->clock);
    return cudaSuccess;
  }
  // A poller is a waiter too: if every rank thread waits and nothing can run, nothing ever will.
  if (w.deadlock) return cudaErrorLaunchTimeout;
  ++w.waiting;
  const bool stuck = stalled(w) && !st->queue.empty();
  --w.waiting;
  if (stuck) {
    w.deadlock = true;
    w.protocol.push_back(fmt::format("rank {}: deadlock while polling a stream", me()));
    return cudaErrorLaunchTimeout;
  }
  return cudaErrorNotReady;
}

cudaError_t StreamSynchronize(cudaStream_t s) {
  World::State& w = W();
  std::unique_lock lock(w.mu);
  Stream* st = stream_of(w, s);
  if (!wait_until(w, lock, [&] { return st->queue.empty(); })) return cudaErrorLaunchTimeout;
  merge(w.ranks[static_cast<size_t>(st->rank)].host, st->clock);
  return cudaSuccess;
}

// The event `e`, reported when `use` (a record, a query, ...) finds it destroyed.
Event* live_event(World::State& w, cudaEvent_t e, const char* use) {
  Event* ev = reinterpret_cast<Event*>(e);
  if (ev->destroyed) protocol_error(w, fmt::format("{} a destroyed event", use));
  return ev;
}

// An operation on event `ev`'s record `gen` (RecordOp, WaitOp), issued on stream `s`.
template <class EventOp>
void enqueue_event_op(World::State& w, cudaStream_t s, const char* what, Event* ev, uint64_t gen) {
  auto op = std::make_unique<EventOp>();
  op->what = what;
  op->event = ev;
  op->gen = gen;
  enqueue(w, *stream_of(w, s), std::move(op));
}

cudaError_t EventCreateWithFlags(cudaEvent_t* out, unsigned int) {
  World::State& w = W();
  std::lock_guard lock(w.mu);
  auto e = std::make_unique<Event>();
  e->rank = me();
  *out = reinterpret_cast<cudaEvent_t>(e.get());
  w.events.push_back(std::move(e));
  return cudaSuccess;
}

cudaError_t EventDestroy(cudaEvent_t e) {
  World::State& w = W();
  std::lock_guard lock(w.mu);
  Event* ev = reinterpret_cast<Event*>(e);
  if (ev->destroyed) protocol_error(w, "event destroyed twice");
  ev->destroyed = true;
  return cudaSuccess;
}

cudaError_t EventRecord(cudaEvent_t e, cudaStream_t s) {
  World::State& w = W();
  std::lock_guard lock(w.mu);
  if (fail_here(w, Site::event_record)) return cudaErrorLaunchFailure;
  Event* ev = live_event(w, e, "record of");
  enqueue_event_op<RecordOp>(w, s, "event record", ev, ++ev->issued);
  return cudaSuccess;
}

// The host learns what the event's last record had seen, as after a stream query or synchronisation.
cudaError_t EventQuery(cudaEvent_t e) {
  World::State& w = W();
  std::lock_guard lock(w.mu);
  progress(w);
  Event* ev = live_event(w, e, "query of");
  if (ev->done < ev->issued) return cudaErrorNotReady;
  if (ev->issued) merge(w.ranks[static_cast<size_t>(ev->rank)].host, ev->at[ev->issued]);
  return cudaSuccess;
}

// The simulated machine captures nothing (Options::capturing runs the work as it is issued), so a
// thread's capture mode only swaps.
cudaError_t ThreadExchangeStreamCaptureMode(cudaStreamCaptureMode* mode) {
  thread_local cudaStreamCaptureMode current = cudaStreamCaptureModeGlobal;
  std::swap(current, *mode);
  return cudaSuccess;
}

cudaError_t EventSynchronize(cudaEvent_t e) {
  World::State& w = W();
  std::unique_lock lock(w.mu);
  Event* ev = live_event(w, e, "synchronisation on");
  const uint64_t gen = ev->issued;
  if (!wait_until(w, lock, [&] { return ev->done >= gen; })) return cudaErrorLaunchTimeout;
  if (gen) merge(w.ranks[static_cast<size_t>(ev->rank)].host, ev->at[gen]);
  return cudaSuccess;
}

cudaError_t StreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned int) {
  World::State& w = W();
  std::lock_guard lock(w.mu);
  if (fail_here(w, Site::stream_wait)) return cudaErrorLaunchFailure;
  Event* ev = live_event(w, e, "wait on");
  if (ev->issued == 0) return cudaSuccess;  // never recorded: CUDA makes the wait a no-op
  enqueue_event_op<WaitOp>(w, s, "event wait", ev, ev->issued);
  return cudaSuccess;
}

cudaError_t StreamIsCapturing(cudaStream_t, cudaStreamCaptureStatus* status) {
  World::State& w = W();
  std::lock_guard lock(w.mu);
  if (fail_here(w, Site::is_capturing)) return cudaErrorLaunchFailure;
  *status = w.opt.capturing ? cudaStreamCaptureStatusActive : cudaStreamCaptureStatusNone;
  return cudaSuccess;
}

void* allocate(World::State& w, size_t bytes) {
  size_t rounded = 0;
  void* p = aligned_block(bytes, 0xA5, &rounded);  // poison: unwritten bytes read as garbage, not as zeros
  if (!p) return nullptr;
  RankState& r = R(w);
  r.allocs[reinterpret_cast<uintptr_t>(p)] = rounded;
  r.live += rounded;
  return p;
}

cudaError_t release(World::State& w, void* p) {
  if (!p) return cudaSuccess;
  RankState& r = R(w);
  auto it = r.allocs.find(reinterpret_cast<uintptr_t>(p));
  if (it == r.allocs.end()) {
    protocol_error(w, "free of memory this rank did not allocate (or freed twice)");
    return cudaErrorInvalidValue;
  }
  // Pending work of this rank that touches the block would use freed memory: cudaFree waits for
  // the device, so the simulator runs everything first.
  r.live -= it->second;
  r.allocs.erase(it);
  std::free(p);
  return cudaSuccess;
}

// Device and pinned host memory alike: both are this rank's allocations.
cudaError_t allocate_at(Site site, void** out, size_t bytes) {
  World::State& w = W();
  std::lock_guard lock(w.mu);
  if (fail_here(w, site)) return cudaErrorMemoryAllocation;
  *out = allocate(w, bytes);
  return *out ? cudaSuccess : cudaErrorMemoryAllocation;
}

cudaError_t Malloc(void** out, size_t bytes) { return allocate_at(Site::malloc, out, bytes); }

cudaError_t Free(void* p) {
  World::State& w = W();
  std::unique_lock lock(w.mu);
  // cudaFree synchronises the device: everything the rank issued completes first.
  drain_rank(w, lock, me());
  return release(w, p);
}

// Stream-ordered memory (CudaApi::MallocAsync): handed out at once, as a pool hands out a block whose
// earlier use is complete; freed when its stream reaches the free, which writes the whole block: an
// access not ordered before the free is a race, one after it lies outside any live allocation.
cudaError_t MallocAsync(void** out, size_t bytes, cudaStream_t) { return allocate_at(Site::malloc, out, bytes); }

struct FreeOp final : Op {
  void* p = nullptr;
  size_t bytes = 0;
  bool step(World::State& w, Stream& s) override {
    ++s.clock[static_cast<size_t>(s.lane)];
    record_access(w, s.rank, s.lane, s.clock, p, bytes, true, what);
    RankState& r = w.ranks[static_cast<size_t>(s.rank)];
    r.allocs.erase(reinterpret_cast<uintptr_t>(p));
    r.live -= bytes;
    w.freed_in_order.push_back(p);
    return true;
  }
};

cudaError_t FreeAsync(void* p, cudaStream_t s) {
  World::State& w = W();
  std::lock_guard lock(w.mu);
  RankState& r = R(w);
  auto it = r.allocs.find(reinterpret_cast<uintptr_t>(p));
  if (it == r.allocs.end()) {
    protocol_error(w, "stream-ordered free of memory this rank did not allocate (or freed twice)");
    return cudaErrorInvalidValue;
  }
  auto op = std::make_unique<FreeOp>();
  op->what = "stream-ordered free";
  op->p = p;
  op->bytes = it->second;
  enqueue(w, *stream_of(w, s), std::move(op));
  return cudaSuccess;
}

cudaError_t HostAlloc(void** out, size_t bytes, unsigned int) { return allocate_at(Site::host_alloc, out, bytes); }

cudaError_t FreeHost(void* p) {
  World::State& w = W();
  std::lock_guard lock(w.mu);
  return release(w, p);
}

bool is_device(World::State& w, const void* p) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  for (const RankState& r : w.ranks) {
    auto it = r.allocs.upper_bound(a);
    if (it == r.allocs.begin()) continue;
    --it;
    if (a < it->first + it->second) return true;
  }
  return false;
}

// Whether `p` lies in a direct-transport window (pinned or device memory every rank maps).
bool is_window(World::State& w, const void* p) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  auto it = w.windows.upper_bound(a);
  if (it == w.windows.begin()) return false;
  --it;
  return a < it->first + it->second.bytes;
}

cudaError_t MemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, cudaStream_t s) {
  World::State& w = W();
  std::lock_guard lock(w.mu);
  if (fail_here(w, Site::memcpy_async)) return cudaErrorLaunchFailure;
  auto op = std::make_unique<ComputeOp>();
  op->what = "memcpy";
  const bool from_pageable = (kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDefault) && !is_device(w, src) &&
                             !is_window(w, src);
  if (from_pageable) {
    // Pageable host memory is staged at the call, as CUDA does; pinned windows are read by the copy.
    auto staged = std::make_shared<std::vector<char>>(static_cast<const char*>(src), static_cast<const char*>(src) + bytes);
    op->ranges = {{dst, bytes, true}};
    op->fn = [dst, staged] { std::memcpy(dst, staged->data(), staged->size()); };
  } else {
    op->ranges = {{src, bytes, false}, {dst, bytes, true}};
    op->fn = [dst, src, bytes] { std::memmove(dst, src, bytes); };
  }
  enqueue(w, *stream_of(w, s), std::move(op));
  return cudaSuccess;
}

cudaError_t Memcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind) {
  World::State& w = W();
  std::lock_guard lock(w.mu);
  // A synchronous copy by the host: ordered after what the host has seen complete.
  RankState& r = R(w);
  ++r.host[0];
  record_access(w, me(), 0, r.host, src, bytes, false, "host memcpy");
  record_access(w, me(), 0, r.host, dst, bytes, true, "host memcpy");
  std::memmove(dst, src, bytes);
  return cudaSuccess;
}

cudaError_t MemsetAsync(void* p, int value, size_t bytes, cudaStream_t s) {
  World::State& w = W();
  std::lock_guard lock(w.mu);
  auto op = std::make_unique<ComputeOp>();
  op->what = "memset";
  op->ranges = {{p, bytes, true}};
  op->fn = [p, value, bytes] { std::memset(p, value, bytes); };
  enqueue(w, *stream_of(w, s), std::move(op));
  return cudaSuccess;
}

cudaError_t GetLastError() { return cudaSuccess; }

}  // namespace cuda_runtime

// --- stream memory operations and windows (the direct transports) ------------------------------------
// Flags are stored and loaded atomically: the host of a rank (its abort) stores into them outside
// the simulator's lock.
struct WaitValueOp final : Op {
  const uint32_t* addr;
  uint32_t value;
  bool step(World::State& w, Stream& s) override {
    if (__atomic_load_n(addr, __ATOMIC_ACQUIRE) != value) return false;
    if (auto it = w.flag_writes.find(addr); it != w.flag_writes.end() && it->second.rank == s.rank)
      merge(s.clock, it->second.clock);
    ++s.clock[static_cast<size_t>(s.lane)];
    return true;
  }
};
struct WriteValueOp final : Op {
  uint32_t* addr;
  uint32_t value;
  bool step(World::State& w, Stream& s) override {
    ++s.clock[static_cast<size_t>(s.lane)];
    w.flag_writes[addr] = {s.rank, s.clock};
    __atomic_store_n(addr, value, __ATOMIC_RELEASE);
    return true;
  }
};

bool is_mapped_word(const RankState& r, const void* p) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  return inside(r.mapped, a, a + sizeof(uint32_t));
}

// A stream memory operation (WaitValueOp, WriteValueOp) on the flag word at `addr`; `access` says
// how it touches the word ("wait on", "write to").
template <class ValueOp>
cudaError_t memory_op(Site site, const char* what, const char* access, cudaStream_t s, void* addr, uint32_t value) {
  World::State& w = W();
  std::lock_guard lock(w.mu);
  if (fail_here(w, site)) return cudaErrorLaunchFailure;
  if (!is_mapped_word(R(w), addr))
    protocol_error(w, fmt::format("memory-operation {} a word of no window this rank mapped", access));
  auto op = std::make_unique<ValueOp>();
  op->what = what;
  op->addr = static_cast<decltype(op->addr)>(addr);
  op->value = value;
  enqueue(w, *stream_of(w, s), std::move(op));
  return cudaSuccess;
}

cudaError_t s_wait_value(cudaStream_t s, void* addr, uint32_t value) {
  return memory_op<WaitValueOp>(Site::wait_value, "wait value", "wait on", s, addr, value);
}
cudaError_t s_write_value(cudaStream_t s, void* addr, uint32_t value) {
  return memory_op<WriteValueOp>(Site::write_value, "write value", "write to", s, addr, value);
}

bool d_available() { return true; }

void drop_mapping(World::State& w, Window& win) {
  const uintptr_t base = reinterpret_cast<uintptr_t>(win.device);
  RankState& r = R(w);
  r.mapped.erase(base);
  auto it = w.windows.find(base);
  if (it == w.windows.end()) {
    protocol_error(w, "a window closed twice or never opened");
  } else {
    if (r.owned.erase(base)) it->second.owner_holds = false;  // its owner destroyed it
    if (--it->second.mappings == 0) {
      // Its flags' last writes go with it: memory allocated later at the same place is new.
      w.flag_writes.erase(w.flag_writes.lower_bound(win.device), w.flag_writes.lower_bound(win.device + it->second.bytes));
      std::free(win.device);
      w.windows.erase(it);
    }
  }
  win = Window{};
}

cudaError_t d_create(WindowKind kind, size_t bytes, uint64_t, Window* out, WindowHandle* handle) {
  World::State& w = W();
  std::lock_guard lock(w.mu);
  if (fail_here(w, Site::window_create)) return cudaErrorUnknown;
  if (kind == WindowKind::host && w.opt.host_window_room) {
    size_t used = 0;
    for (const auto& [base, win] : w.windows) used += win.host ? win.bytes : 0;
    if (used + (std::max<size_t>(bytes, 1) + 255) / 256 * 256 > w.opt.host_window_room) return cudaErrorMemoryAllocation;
  }
  size_t rounded = 0;
  void* p = aligned_block(bytes, 0, &rounded);
  if (!p) return cudaErrorMemoryAllocation;
  const uintptr_t base = reinterpret_cast<uintptr_t>(p);
  w.windows[base] = {rounded, 1, me(), true, kind == WindowKind::host};
  R(w).mapped[base] = rounded;
  R(w).owned.insert(base);
  out->device = out->host = static_cast<char*>(p);
  out->bytes = bytes;
  out->token = p;
  *handle = WindowHandle{};
  handle->bytes = bytes;
  std::memcpy(handle->ipc, &base, sizeof(base));
  return cudaSuccess;
}

cudaError_t d_open(const WindowHandle& h, Window* out) {
  World::State& w = W();
  std::lock_guard lock(w.mu);
  if (fail_here(w, Site::window_open)) return cudaErrorInvalidValue;
  uintptr_t base = 0;
  std::memcpy(&base, h.ipc, sizeof(base));
  auto it = w.windows.find(base);
  if (it == w.windows.end()) {
    protocol_error(w, "open of a window that does not exist");
    return cudaErrorInvalidValue;
  }
  ++it->second.mappings;
  R(w).mapped[base] = it->second.bytes;
  out->device = out->host = reinterpret_cast<char*>(base);
  out->bytes = h.bytes;
  out->token = out->device;
  return cudaSuccess;
}

void d_unlink(Window&) {}
void d_release(Window& win) {
  World::State& w = W();
  std::unique_lock lock(w.mu);
  // Unregistering host memory (cudaHostUnregister) and freeing device memory (cudaFree) synchronise
  // the device, as Free does: a release while the rank's work waits on a peer that never comes hangs.
  drain_rank(w, lock, me());
  drop_mapping(w, win);
}
bool d_owner_gone(const Window& peer) {
  World::State& w = W();
  std::lock_guard lock(w.mu);
  auto it = w.windows.find(reinterpret_cast<uintptr_t>(peer.device));
  return it == w.windows.end() || !it->second.owner_holds;
}

// --- NCCL ---------------------------------------------------------------------------------------
Handle* handle_of(ncclComm_t c) { return reinterpret_cast<Handle*>(c); }

ncclResult_t check_handle(World::State& w, Handle* h) {
  if (!h) return ncclInvalidArgument;
  if (h->destroyed) {
    protocol_error(w, "call on a destroyed communicator");
    return ncclInvalidArgument;
  }
  return ncclSuccess;
}

// A new handle: comm rank `rank` of `comm`.
ncclComm_t new_handle(World::State& w, Comm* comm, int rank) {
  auto h = std::make_unique<Handle>();
  h->comm = comm;
  h->rank = rank;
  w.handles.push_back(std::move(h));
  return reinterpret_cast<ncclComm_t>(w.handles.back().get());
}

// Inside a group, enqueueing waits for the group's end (a send's before the others').
void issue(World::State& w, std::function<void()> thunk, bool send = false) {
  RankState& r = R(w);
  if (r.group_depth > 0) (send ? r.grouped_sends : r.grouped).push_back(std::move(thunk));
  else thunk();
}

ncclResult_t n_comm_count(const ncclComm_t c, int* n) {
  *n = static_cast<int>(handle_of(c)->comm->members.size());
  return ncclSuccess;
}
ncclResult_t n_comm_user_rank(const ncclComm_t c, int* r) {
  *r = handle_of(c)->rank;
  return ncclSuccess;
}
ncclResult_t n_comm_cu_device(const ncclComm_t, int* d) {
  *d = 0;
  return ncclSuccess;
}
ncclResult_t n_get_async_error(ncclComm_t c, ncclResult_t* out) {
  World::State& w = W();
  std::lock_guard lock(w.mu);
  *out = handle_of(c)->comm->aborted ? ncclRemoteError : ncclSuccess;
  return ncclSuccess;
}

ncclResult_t n_group_start() {
  World::State& w = W();
  std::lock_guard lock(w.mu);
  ++R(w).group_depth;
  return ncclSuccess;
}

ncclResult_t n_group_end() {
  World::State& w = W();
  std::lock_guard lock(w.mu);
  RankState& r = R(w);
  if (r.group_depth == 0) return ncclInvalidUsage;
  if (--r.group_depth > 0) return ncclSuccess;
  std::vector<std::function<void()>> thunks, sends;
  thunks.swap(r.grouped);
  sends.swap(r.grouped_sends);
  if (fail_here(w, Site::group_end)) return ncclInternalError;  // the group's operations never launch
  for (auto& t : sends) t();
  for (auto& t : thunks) t();
  return ncclSuccess;
}

ncclResult_t n_group_simulate_end(ncclSimInfo_t*) {
  World::State& w = W();
  std::lock_guard lock(w.mu);
  RankState& r = R(w);
  if (r.group_depth == 0) return ncclInvalidUsage;
  if (--r.group_depth == 0) {
    r.grouped.clear();
    r.grouped_sends.clear();
  }
  return ncclSuccess;
}

// A send or a receive (SendOp, RecvOp: `buf` const or not) with comm rank `peer`; `what` names it
// with its peer ("send to", "recv from").
template <class PeerOp, class Buffer>
ncclResult_t point_to_point(Site site, const char* what, Buffer buf, size_t count, ncclDataType_t t, int peer,
                            ncclComm_t c, cudaStream_t s) {
  World::State& w = W();
  std::lock_guard lock(w.mu);
  Handle* h = handle_of(c);
  if (const ncclResult_t r = check_handle(w, h); r != ncclSuccess) return r;
  if (fail_here(w, site)) return ncclInternalError;
  // A rank may send to itself, as NCCL allows (PyTorch's uneven all-to-all sends the rank's own chunk so).
  if (peer < 0 || peer >= static_cast<int>(h->comm->members.size())) return ncclInvalidArgument;
  Stream* st = stream_of(w, s);
  const size_t bytes = count * dtype_size(dtype_of(t));
  issue(w, [&w, h, st, what, peer, buf, bytes] {
    auto op = std::make_unique<PeerOp>();
    op->what = fmt::format("{} {}", what, peer);
    op->h = h;
    op->peer = peer;
    op->data = buf;
    op->bytes = bytes;
    enqueue(w, *st, std::move(op));
  }, site == Site::send);
  return ncclSuccess;
}

ncclResult_t n_send(const void* buf, size_t count, ncclDataType_t t, int peer, ncclComm_t c, cudaStream_t s) {
  return point_to_point<SendOp>(Site::send, "send to", buf, count, t, peer, c, s);
}
ncclResult_t n_recv(void* buf, size_t count, ncclDataType_t t, int peer, ncclComm_t c, cudaStream_t s) {
  return point_to_point<RecvOp>(Site::recv, "recv from", buf, count, t, peer, c, s);
}

// `faultable`: the all-gather fp8wire issues itself; the plain all-reduce and reduce-scatter are the
// application's own calls passed through, not fault sites.
ncclResult_t collective(CollKind kind, const void* send, void* recv, size_t count, ncclDataType_t t, ncclRedOp_t op,
                        ncclComm_t c, cudaStream_t s, bool faultable) {
  World::State& w = W();
  std::unique_lock lock(w.mu);
  Handle* h = handle_of(c);
  if (const ncclResult_t r = check_handle(w, h); r != ncclSuccess) return r;
  if (faultable && fail_here(w, Site::all_gather)) return ncclInternalError;
  if (w.opt.connect_at_first_collective && !h->connected && R(w).group_depth == 0) {
    Comm& comm = *h->comm;
    h->connected = true;
    ++comm.connected;
    w.cv.notify_all();
    const int n = static_cast<int>(comm.members.size());
    if (!wait_until(w, lock, [&] { return comm.connected == n || comm.aborted; })) return ncclSystemError;
    if (comm.aborted) return ncclRemoteError;
  }
  Stream* st = stream_of(w, s);
  issue(w, [&w, h, st, kind, send, recv, count, t, op] {
    auto o = std::make_unique<CollectiveOp>();
    o->what = kind == CollKind::all_gather ? "all-gather" : kind == CollKind::all_reduce ? "all-reduce" : "reduce-scatter";
    o->h = h;
    o->kind = kind;
    o->seq = h->next_seq++;
    o->send = send;
    o->recv = recv;
    o->count = count;
    o->dtype = dtype_of(t);
    o->op = redop_of(op);
    enqueue(w, *st, std::move(o));
  });
  return ncclSuccess;
}

ncclResult_t n_all_gather(const void* s, void* r, size_t n, ncclDataType_t t, ncclComm_t c, cudaStream_t st) {
  return collective(CollKind::all_gather, s, r, n, t, ncclSum, c, st, true);
}
ncclResult_t n_all_reduce(const void* s, void* r, size_t n, ncclDataType_t t, ncclRedOp_t op, ncclComm_t c,
                          cudaStream_t st) {
  return collective(CollKind::all_reduce, s, r, n, t, op, c, st, false);
}
ncclResult_t n_reduce_scatter(const void* s, void* r, size_t n, ncclDataType_t t, ncclRedOp_t op, ncclComm_t c,
                              cudaStream_t st) {
  return collective(CollKind::reduce_scatter, s, r, n, t, op, c, st, false);
}

void abort_locked(World::State& w, Comm& c) {
  c.aborted = true;
  w.cv.notify_all();
}

ncclResult_t n_comm_abort(ncclComm_t c) {
  World::State& w = W();
  std::lock_guard lock(w.mu);
  Handle* h = handle_of(c);
  abort_locked(w, *h->comm);
  h->destroyed = true;
  return ncclSuccess;
}

ncclResult_t n_comm_destroy(ncclComm_t c) {
  World::State& w = W();
  std::lock_guard lock(w.mu);
  handle_of(c)->destroyed = true;
  return ncclSuccess;
}

ncclResult_t n_comm_split(ncclComm_t parent, int color, int key, ncclComm_t* out, ncclConfig_t*) {
  World::State& w = W();
  std::unique_lock lock(w.mu);
  Handle* h = handle_of(parent);
  if (const ncclResult_t r = check_handle(w, h); r != ncclSuccess) return r;
  Comm& c = *h->comm;
  const size_t n = c.members.size();
  if (c.split_arrived.empty()) {
    c.split_arrived.assign(n, false);
    c.split_args.assign(n, {0, 0});
  }
  const uint64_t round = c.split_round;
  c.split_args[static_cast<size_t>(h->rank)] = {color, key};
  c.split_arrived[static_cast<size_t>(h->rank)] = true;
  if (++c.split_count == static_cast<int>(n)) {
    // Everyone is here: one child per color, ranks ordered by (key, parent rank).
    c.split_result.assign(n, nullptr);
    std::map<int, std::vector<std::pair<int, int>>> by_color;
    for (size_t r = 0; r < n; ++r)
      if (c.split_args[r].first != NCCL_SPLIT_NOCOLOR) by_color[c.split_args[r].first].push_back({c.split_args[r].second, static_cast<int>(r)});
    for (auto& [col, list] : by_color) {
      std::sort(list.begin(), list.end());
      auto child = std::make_unique<Comm>();
      child->parent = &c;
      for (auto& [k, r] : list) child->members.push_back(c.members[static_cast<size_t>(r)]);
      for (size_t i = 0; i < list.size(); ++i)
        c.split_result[static_cast<size_t>(list[i].second)] = new_handle(w, child.get(), static_cast<int>(i));
      w.comms.push_back(std::move(child));
    }
    c.split_count = 0;
    c.split_arrived.assign(n, false);
    ++c.split_round;
    w.cv.notify_all();
  } else if (!wait_until(w, lock, [&] { return c.split_round != round || c.aborted; })) {
    return ncclSystemError;
  }
  if (c.aborted) return ncclRemoteError;
  *out = c.split_result[static_cast<size_t>(h->rank)];
  return ncclSuccess;
}

// --- codec over the reference: the functions of CodecApi, by their names there (and their helpers) ---
namespace codec {

std::vector<Range> segmented_ranges(const void* wire, size_t count, quant::Segmented layout,
                                    const quant::WireFormat& f, bool write) {
  std::vector<Range> out;
  const size_t segments = quant::segment_count(count, layout);
  for (size_t s = 0; s < segments; ++s) {
    const size_t len = quant::segment_elems(count, layout, s);
    if (len) out.push_back({static_cast<const char*>(wire) + s * layout.seg_stride, quant::chunk_bytes(len, f), write});
  }
  return out;
}

cudaError_t launch(World::State& w, cudaStream_t s, const char* what, std::vector<Range> ranges,
                   std::function<const char*()> fn, uint32_t max_ctas = 0) {
  if (fail_here(w, Site::codec)) return cudaErrorLaunchFailure;
  if (w.opt.window_ctas) {  // Options::window_ctas: the launch's width follows what it touches
    const RankState& r = w.ranks[static_cast<size_t>(me())];
    bool window = false;
    for (const Range& x : ranges) {
      const auto b = reinterpret_cast<uintptr_t>(x.p);
      window = window || (x.bytes && inside(r.mapped, b, b + x.bytes));
    }
    const uint32_t expected = window ? w.opt.window_ctas : 0;
    if (max_ctas != expected)
      w.protocol.push_back(fmt::format("rank {}: {} {} a window with at most {} thread blocks (expected {})", me(),
                                       what, window ? "touches" : "does not touch", max_ctas, expected));
  }
  auto op = std::make_unique<ComputeOp>();
  op->what = what;
  op->ranges = std::move(ranges);
  World::State* wp = &w;
  const int rank = me();
  op->fn = [wp, rank, what, fn] {
    if (const char* e = fn()) wp->protocol.push_back(fmt::format("rank {}: {} failed in the reference: {}", rank, what, e));
  };
  enqueue(w, *stream_of(w, s), std::move(op));
  return cudaSuccess;
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// The profiler's call-begin mark (quant/call_mark.cu): an empty launch, counted and failed like any
// codec launch.
cudaError_t mark_call_begin(cudaStream_t s) {
  World::State& w = W();
  std::lock_guard lock(w.mu);
  return launch(w, s, "call-begin mark", {}, [] { return static_cast<const char*>(nullptr); });
}

// The launch's telemetry for the reference (a copy lives in each op's closure).
const quant::TelemetryOptions* telemetry_of(const quant::LaunchOptions& opt) {
  return opt.telemetry.record ? &opt.telemetry : nullptr;
}

// A quantize or a dequantize of `count` elements into or out of the segmented `wire`, besides the
// plain ranges `plain`: refused as the kernels refuse it, nothing issued for an empty call.
cudaError_t convert(const char* what, const void* wire, bool to_wire, size_t count, quant::Segmented layout,
                    const quant::WireFormat& f, std::vector<Range> plain, cudaStream_t s, uint32_t max_ctas,
                    std::function<const char*()> fn) {
  World::State& w = W();
  std::lock_guard lock(w.mu);
  if (quant::validate(f) || quant::validate(count, layout, f) || !aligned16(wire)) return cudaErrorInvalidValue;
  if (count == 0) return cudaSuccess;
  auto ranges = segmented_ranges(wire, count, layout, f, to_wire);
  ranges.insert(ranges.end(), plain.begin(), plain.end());
  return launch(w, s, what, std::move(ranges), std::move(fn), max_ctas);
}

cudaError_t quantize(const void* in, quant::ElemType t, size_t count, void* wire, quant::Segmented layout,
                     const quant::WireFormat& f, cudaStream_t s, quant::LaunchOptions opt) {
  return convert("quantize", wire, true, count, layout, f, {{in, count * quant::elem_size(t), false}}, s, opt.max_ctas,
                 [=] { return quant::ref::quantize(in, t, count, wire, layout, f, opt.sr_offset, telemetry_of(opt)); });
}

cudaError_t quantize_with_residual(const void* in, quant::ElemType t, size_t count, float* residual, void* wire,
                                   quant::Segmented layout, const quant::WireFormat& f, cudaStream_t s,
                                   quant::LaunchOptions opt) {
  return convert("quantize with residual", wire, true, count, layout, f,
                 {{in, count * quant::elem_size(t), false}, {residual, count * sizeof(float), true}}, s, opt.max_ctas,
                 [=] {
                   return quant::ref::quantize_with_residual(in, t, count, residual, wire, layout, f, opt.sr_offset,
                                                             telemetry_of(opt));
                 });
}

cudaError_t dequantize(const void* wire, quant::Segmented layout, size_t count, void* out, quant::ElemType t,
                       const quant::WireFormat& f, cudaStream_t s, quant::LaunchOptions opt) {
  return convert("dequantize", wire, false, count, layout, f, {{out, count * quant::elem_size(t), true}}, s, opt.max_ctas,
                 [=] { return quant::ref::dequantize(wire, layout, count, out, t, f, telemetry_of(opt)); });
}

cudaError_t reduce(World::State& w, const void* const* inputs, int k, const void* plain, quant::ElemType plain_type,
                   int plain_position, size_t count, float post, quant::ReduceOutput out, const quant::WireFormat& f,
                   cudaStream_t s, quant::LaunchOptions opt) {
  if (quant::validate(f) || k < 0 || k > quant::kMaxReduceInputs || (out.plain == nullptr) == (out.wire == nullptr) ||
      (out.wire && !aligned16(out.wire)))
    return cudaErrorInvalidValue;
  std::vector<const void*> ins(inputs, inputs + k);
  std::vector<Range> ranges;
  for (const void* in : ins) {
    if (!aligned16(in)) return cudaErrorInvalidValue;
    ranges.push_back({in, quant::chunk_bytes(count, f), false});
  }
  if (plain) ranges.push_back({plain, count * quant::elem_size(plain_type), false});
  if (out.plain) ranges.push_back({out.plain, count * quant::elem_size(out.plain_type), true});
  else ranges.push_back({out.wire, quant::chunk_bytes(count, f), true});
  const quant::ref::ReduceOutput ro{out.plain, out.plain_type, out.wire};
  return launch(w, s, plain ? "dequantize-reduce (mixed)" : "dequantize-reduce", std::move(ranges), [=] {
    return quant::ref::dequantize_reduce(ins.data(), k, plain, plain_type, plain_position, count, post, ro, f,
                                         opt.sr_offset, telemetry_of(opt));
  }, opt.max_ctas);
}

cudaError_t dequantize_reduce(const void* const* inputs, int k, size_t count, float post, quant::ReduceOutput out,
                     const quant::WireFormat& f, cudaStream_t s, quant::LaunchOptions opt) {
  World::State& w = W();
  std::lock_guard lock(w.mu);
  return reduce(w, inputs, k, nullptr, quant::ElemType::f32, 0, count, post, out, f, s, opt);
}

cudaError_t dequantize_reduce_mixed(const void* const* inputs, int k, const void* plain, quant::ElemType plain_type,
                                   int plain_position, size_t count, float post, quant::ReduceOutput out,
                                   const quant::WireFormat& f, cudaStream_t s, quant::LaunchOptions opt) {
  World::State& w = W();
  std::lock_guard lock(w.mu);
  return reduce(w, inputs, k, plain, plain_type, plain_position, count, post, out, f, s, opt);
}

}  // namespace codec

HostFacts sim_host_facts(int) {
  World::State& w = W();
  std::lock_guard lock(w.mu);
  HostFacts f;
  const size_t r = static_cast<size_t>(me());
  f.host_hash = w.opt.hosts.empty() ? 1000 + r : w.opt.hosts[r];
  f.p2p_disabled = w.opt.p2p_disabled;
  f.nvlink_local = w.opt.nvlink;
  f.process_id = static_cast<uint32_t>(100 + r);
  f.gpu_hash = r < w.opt.gpus.size() ? w.opt.gpus[r] : 0;
  return f;
}

// The simulated ncclAlltoAll (at the end of this file).
ncclResult_t n_all_to_all(const void* s, void* r, size_t count, ncclDataType_t t, ncclComm_t c, cudaStream_t st);
// A thread the engine starts for a blocking call acts as the rank that started it.
void* sim_thread_context() { return reinterpret_cast<void*>(static_cast<intptr_t>(t_rank) + 1); }
void sim_adopt_thread_context(void* context) { t_rank = static_cast<int>(reinterpret_cast<intptr_t>(context)) - 1; }

}  // namespace

void set_thread_rank(int rank) { t_rank = rank; }

World::World(Options options) : state_(new State) {
  State& w = *state_;
  w.opt = std::move(options);
  w.rng.seed(w.opt.schedule_seed);
  w.ranks.resize(static_cast<size_t>(w.opt.nranks));
  for (RankState& r : w.ranks) r.hw_queues.resize(static_cast<size_t>(std::max(w.opt.hw_queues, 0)));
  NcclApi& n = w.nccl;
  n.CommCount = n_comm_count;
  n.CommUserRank = n_comm_user_rank;
  n.CommCuDevice = n_comm_cu_device;
  n.CommGetAsyncError = n_get_async_error;
  n.GroupStart = n_group_start;
  n.GroupEnd = n_group_end;
  n.GroupSimulateEnd = n_group_simulate_end;
  n.Send = n_send;
  n.Recv = n_recv;
  n.AllGather = n_all_gather;
  n.AllReduce = n_all_reduce;
  n.ReduceScatter = n_reduce_scatter;
  n.AlltoAll = n_all_to_all;
  n.CommAbort = n_comm_abort;
  n.CommDestroy = n_comm_destroy;
  n.CommSplit = n_comm_split;
  Platform& p = w.platform;
  p.nccl = &w.nccl;
#define FP8WIRE_CUDA_FN(name, type) p.cuda.name = cuda_runtime::name;
#include "sched/platform/cuda_functions.def"
#undef FP8WIRE_CUDA_FN
  p.cuda.StreamWaitValue32 = s_wait_value;
  p.cuda.StreamWriteValue32 = s_write_value;
  p.cuda.MallocAsync = cuda_runtime::MallocAsync;
  p.cuda.FreeAsync = cuda_runtime::FreeAsync;
  DirectMemoryApi& d = p.direct;
  d.available = d_available;
  d.create = d_create;
  d.open = d_open;
  d.unlink = d_unlink;
  d.close = d_release;
  d.destroy = d_release;
  d.owner_gone = d_owner_gone;
#define FP8WIRE_CODEC_FN(name) p.codec.name = codec::name;
#include "sched/platform/codec_functions.def"
#undef FP8WIRE_CODEC_FN
  p.host_facts = sim_host_facts;
  p.thread_context = sim_thread_context;
  p.adopt_thread_context = sim_adopt_thread_context;
  g_world = state_.get();
}

World::~World() {
  State& w = *state_;
  for (RankState& r : w.ranks)
    for (auto& [p, size] : r.allocs) std::free(reinterpret_cast<void*>(p));
  for (auto& [p, entry] : w.windows) std::free(reinterpret_cast<void*>(p));
  for (void* p : w.freed_in_order) std::free(p);
  g_world = nullptr;
}

const Platform& World::platform() const { return state_->platform; }
int World::nranks() const { return state_->opt.nranks; }

std::vector<ncclComm_t> World::create_comm(std::vector<int> members) {
  State& w = *state_;
  std::lock_guard lock(w.mu);
  if (members.empty())
    for (int r = 0; r < w.opt.nranks; ++r) members.push_back(r);
  auto comm = std::make_unique<Comm>();
  comm->members = members;
  std::vector<ncclComm_t> out;
  for (size_t i = 0; i < members.size(); ++i) out.push_back(new_handle(w, comm.get(), static_cast<int>(i)));
  w.comms.push_back(std::move(comm));
  return out;
}

void World::run_ranks(const std::function<void(int)>& body) {
  State& w = *state_;
  {
    std::lock_guard lock(w.mu);
    w.active = w.opt.nranks;
    w.waiting = 0;
  }
  std::vector<std::thread> threads;
  for (int r = 0; r < w.opt.nranks; ++r)
    threads.emplace_back([this, &w, &body, r] {
      set_thread_rank(r);
      body(r);
      std::lock_guard lock(w.mu);
      --w.active;
      w.cv.notify_all();
    });
  for (auto& t : threads) t.join();
  std::lock_guard lock(w.mu);
  w.active = 1;
}

void World::abort_comm(ncclComm_t handle) {
  State& w = *state_;
  std::lock_guard lock(w.mu);
  abort_locked(w, *handle_of(handle)->comm);
}

void World::abort_splits(ncclComm_t handle) {
  State& w = *state_;
  std::lock_guard lock(w.mu);
  const Comm* parent = handle_of(handle)->comm;
  for (auto& c : w.comms)
    if (c->parent == parent) abort_locked(w, *c);
}

void World::set_fault(Fault fault) {
  std::lock_guard lock(state_->mu);
  state_->fault = fault;
}

int World::calls_at(int rank, Site site) const {
  std::lock_guard lock(state_->mu);
  return state_->ranks.at(static_cast<size_t>(rank)).calls[static_cast<size_t>(site)];
}

void World::app_access(cudaStream_t stream, const void* ptr, size_t bytes, bool write) {
  State& w = *state_;
  std::lock_guard lock(w.mu);
  auto op = std::make_unique<ComputeOp>();
  op->what = write ? "application write" : "application read";
  op->ranges = {{ptr, bytes, write}};
  enqueue(w, *stream_of(w, stream), std::move(op));
}

cudaError_t World::synchronize_rank() {
  State& w = *state_;
  std::unique_lock lock(w.mu);
  const int rank = me();
  const bool ok = drain_rank(w, lock, rank);
  RankState& r = R(w);
  for (auto& s : w.streams)
    if (s->rank == rank) merge(r.host, s->clock);
  if (ok) r.log.clear();  // everything so far happens before whatever comes next
  return ok ? cudaSuccess : cudaErrorLaunchTimeout;
}

size_t World::live_bytes(int rank) const {
  std::lock_guard lock(state_->mu);
  return state_->ranks.at(static_cast<size_t>(rank)).live;
}

void World::end_process(int rank) {
  std::lock_guard lock(state_->mu);
  RankState& r = state_->ranks.at(static_cast<size_t>(rank));
  for (uintptr_t base : r.owned) state_->windows.at(base).owner_holds = false;
  r.owned.clear();
}

size_t World::live_windows() const {
  std::lock_guard lock(state_->mu);
  return state_->windows.size();
}

std::vector<std::string> World::races() const {
  std::lock_guard lock(state_->mu);
  return state_->races;
}
std::vector<std::string> World::protocol_errors() const {
  std::lock_guard lock(state_->mu);
  return state_->protocol;
}
bool World::deadlocked() const {
  std::lock_guard lock(state_->mu);
  return state_->deadlock;
}

}  // namespace fp8wire::sim

namespace fp8wire::sim {
namespace {

// ncclAlltoAll, the application's own call passed through (not a fault site, as the plain all-reduce
// is not): chunk j of every rank's send buffer lands in chunk `rank` of rank j's receive buffer. Every
// rank must pass the same count (NCCL's contract), else a protocol error.
struct AllToAllOp final : ExchangeOp {
  size_t chunk = 0;  // bytes per peer
  bool step(World::State& w, Stream& s) override {
    Comm& c = *h->comm;
    const size_t n = c.members.size();
    if (c.aborted) return true;
    Collective& col = c.collectives[seq];
    if (!all_posted(w, s, col, n, n * chunk, n * chunk)) return false;
    char* out = static_cast<char*>(recv);
    for (size_t j = 0; j < n; ++j) {
      const std::vector<char>& from = col.contrib[j];
      if (from.size() != n * chunk) {
        w.protocol.push_back(fmt::format("rank {}: all-to-all of {} bytes per peer, comm rank {} sent {} in all", s.rank,
                                         chunk, j, from.size()));
        continue;
      }
      if (chunk) std::memcpy(out + j * chunk, from.data() + static_cast<size_t>(h->rank) * chunk, chunk);
    }
    if (++col.taken == static_cast<int>(n)) c.collectives.erase(seq);
    return true;
  }
};

ncclResult_t n_all_to_all(const void* send, void* recv, size_t count, ncclDataType_t t, ncclComm_t c, cudaStream_t s) {
  World::State& w = W();
  std::lock_guard lock(w.mu);
  Handle* h = handle_of(c);
  if (const ncclResult_t r = check_handle(w, h); r != ncclSuccess) return r;
  Stream* st = stream_of(w, s);
  const size_t chunk = count * dtype_size(dtype_of(t));
  issue(w, [&w, h, st, send, recv, chunk] {
    auto o = std::make_unique<AllToAllOp>();
    o->what = "all-to-all";
    o->h = h;
    o->seq = h->next_seq++;
    o->send = send;
    o->recv = recv;
    o->chunk = chunk;
    enqueue(w, *st, std::move(o));
  });
  return ncclSuccess;
}

}  // namespace
}  // namespace fp8wire::sim
