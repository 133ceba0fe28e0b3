#include "sched/comm/comm_setup.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "common/log.hpp"
#include "common/nvtx.hpp"
#include "common/status.hpp"
#include "sched/plan/cost_model.hpp"
#include "sched/transport/direct_windows.hpp"
#include "sched/plan/hierarchy.hpp"

namespace fp8wire::sched {

namespace {

class DeviceGuard {
 public:
  DeviceGuard(const CudaApi& cuda, int device) : cuda_(&cuda) {
    if (device >= 0 && cuda.GetDevice(&previous_) == cudaSuccess && previous_ != device)
      changed_ = cuda.SetDevice(device) == cudaSuccess;
  }
  ~DeviceGuard() {
    if (changed_) cuda_->SetDevice(previous_);
  }

 private:
  const CudaApi* cuda_;
  int previous_ = 0;
  bool changed_ = false;
};

// Local resources for FP8 on this communicator. Failure is not an error: it is reported in the
// agreement, and every rank then passes through.
bool allocate_resources(CommState& s, const Config& config) {
  const CudaApi& cuda = s.platform->cuda;
  CommResources& r = s.res;
  r.layout = scratch_layout(config);
  if (cuda.StreamCreateWithFlags(&r.produce, cudaStreamNonBlocking) != cudaSuccess ||
      cuda.StreamCreateWithFlags(&r.transfer, cudaStreamNonBlocking) != cudaSuccess)
    return false;
  for (cudaEvent_t* e : {&r.fork, &r.produce_end, &r.last, &r.capture_produce_end, &r.capture_transfer_end,
                         &r.ready[0], &r.ready[1], &r.done[0], &r.done[1]})
    if (cuda.EventCreateWithFlags(e, cudaEventDisableTiming) != cudaSuccess) return false;
  void* p = nullptr;
  if (cuda.Malloc(&p, r.layout.total_bytes) != cudaSuccess) {
    cuda.GetLastError();  // clear the allocation error so it is not reported by an unrelated call
    FP8WIRE_WARN("cannot allocate {} of scratch (scratch.max_bytes) on device {}",
                 format_size(r.layout.total_bytes), s.device);
    return false;
  }
  r.scratch = static_cast<char*>(p);
  return true;
}

// The exchange buffer: a slice of the scratch when there is one, else a small allocation, else
// mapped host memory (NCCL's kernels reach it as well). Only if all three fail can this rank not take
// part, the same situation as NCCL failing its own initialisation on one rank.
struct ExchangeBuffer {
  const CudaApi* cuda = nullptr;
  char* data = nullptr;
  bool owned_device = false;
  bool owned_host = false;
  ExchangeBuffer() = default;
  ExchangeBuffer(const ExchangeBuffer&) = delete;
  ExchangeBuffer& operator=(const ExchangeBuffer&) = delete;
  // An exchange that did not complete may still write into the buffer (until the application aborts
  // the communicator): it is then left allocated, a few bytes, rather than freed under NCCL's feet.
  void abandon() { owned_device = owned_host = false; }
  ~ExchangeBuffer() {
    if (owned_device) cuda->Free(data);
    if (owned_host) cuda->FreeHost(data);
  }
};
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

// Waits for `stream` without blocking in the driver, so that an abort from another thread (which
// sets `aborting` before calling NCCL's abort) or an asynchronous NCCL error releases the wait.
ncclResult_t wait_exchange(CommState& s, cudaStream_t stream) {
  const CudaApi& cuda = s.platform->cuda;
  const NcclApi& nccl = *s.platform->nccl;
  auto pause = std::chrono::microseconds(1);
  for (;;) {
    const cudaError_t q = cuda.StreamQuery(stream);
    if (q == cudaSuccess) return ncclSuccess;
    if (q != cudaErrorNotReady) {
      FP8WIRE_ERROR("comm {}: the agreement exchange failed: {}", s.id, cuda.GetErrorString(q));
      return ncclUnhandledCudaError;
    }
    if (s.aborting.load(std::memory_order_acquire)) {
      FP8WIRE_WARN("comm {}: aborted during the agreement exchange", s.id);
      return ncclInvalidUsage;
    }
    ncclResult_t async = ncclSuccess;
    if (nccl.CommGetAsyncError && nccl.CommGetAsyncError(s.comm, &async) == ncclSuccess && !nccl_ok(async)) {
      FP8WIRE_ERROR("comm {}: NCCL error {} during the agreement exchange", s.id, static_cast<int>(async));
      return async;
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(200));
  }
}

// An all-gather of `bytes` per rank through the scratch (FP8 is on, so there is one), for the rounds
// that follow the agreement. Every rank calls it with the same size; the result is every rank's
// bytes in rank order, or an error (then on every rank: the all-gather either ran everywhere or the
// communicator is broken).
ncclResult_t gather_bytes(CommState& s, const void* mine, size_t bytes, std::vector<char>& all) {
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
  const ncclResult_t gathered = api.AllGather(mine_at, base, bytes, ncclUint8, s.comm, s.res.transfer);
  if (nccl_ok(res)) res = gathered;
  if (nccl_ok(gathered)) {
    const ncclResult_t waited = wait_exchange(s, s.res.transfer);
    if (nccl_ok(res)) res = waited;
  }
  if (nccl_ok(res) && cuda.Memcpy(all.data(), base, all.size(), cudaMemcpyDeviceToHost) != cudaSuccess)
    res = ncclUnhandledCudaError;
  return nccl_ok(res) ? ncclSuccess : res;
}

// Whether every rank answered yes (a 4-byte all-gather); false on any error too.
bool all_agree(CommState& s, bool mine) {
  const int32_t v = mine ? 1 : 0;
  std::vector<char> all;
  if (gather_bytes(s, &v, sizeof(v), all) != ncclSuccess) return false;
  for (int r = 0; r < s.nranks; ++r) {
    int32_t x = 0;
    std::memcpy(&x, all.data() + static_cast<size_t>(r) * sizeof(x), sizeof(x));
    if (x == 0) return false;
  }
  return true;
}

// The agreement's second round, for a communicator spanning hosts with several ranks on each: the
// host and rail sub-communicators (collective over the parent, every rank in the same order), then a
// 4-byte all-gather confirming that every rank has both. Without it nobody uses them.
void split_hierarchy(CommState& s, const Agreement& a) {
  const NcclApi& api = *s.platform->nccl;
  Hierarchy& h = s.hierarchy;
  h.hosts = a.topology.hosts;
  h.ranks_per_host = a.topology.ranks_per_host;
  h.host_index = a.hosts.host_of[static_cast<size_t>(s.rank)];
  h.local_rank = a.hosts.local_rank[static_cast<size_t>(s.rank)];
  h.rank_at.assign(static_cast<size_t>(s.nranks), 0);
  for (int r = 0; r < s.nranks; ++r)
    h.rank_at[static_cast<size_t>(a.hosts.host_of[static_cast<size_t>(r)] * h.ranks_per_host +
                                  a.hosts.local_rank[static_cast<size_t>(r)])] = r;
  const bool ok = api.CommSplit && api.CommSplit(s.comm, h.host_index, h.local_rank, &h.host, nullptr) == ncclSuccess &&
                  api.CommSplit(s.comm, h.local_rank, h.host_index, &h.rail, nullptr) == ncclSuccess && h.host &&
                  h.rail;
  if (all_agree(s, ok)) {
    h.ready = true;
    s.host_transport = NcclTransport(api, h.host, h.local_rank, h.ranks_per_host);
    s.rail_transport = NcclTransport(api, h.rail, h.host_index, h.hosts);
    FP8WIRE_INFO("comm {}: hierarchical path ready: host {} of {}, local rank {} of {}", s.id, h.host_index, h.hosts,
                 h.local_rank, h.ranks_per_host);
    return;
  }
  FP8WIRE_WARN("comm {}: the host/rail sub-communicators could not be made on every rank; no hierarchical path", s.id);
  for (ncclComm_t* c : {&h.host, &h.rail})
    if (*c) {
      if (api.CommDestroy) api.CommDestroy(*c);
      *c = nullptr;
    }
}

// --- the direct transports' round (sched/transport/direct_windows.hpp) ------------------------------------
// What one rank offers: its flag page and data window, by handle.
struct DirectOffer {
  uint32_t ok = 0;
  uint32_t pid = 0;
  WindowHandle flags;
  WindowHandle data;
};

// The kinds to try, in order: the configured one, or with auto peer memory unless some rank has P2P
// disabled, then host memory.
std::vector<TransportKind> direct_kinds(const Config& config, std::span<const RankFacts> facts) {
  switch (config.direct_transport) {
    case DirectMode::off: return {};
    case DirectMode::peer_memory: return {TransportKind::peer_memory};
    case DirectMode::host_memory: return {TransportKind::host_memory};
    case DirectMode::automatic: break;
  }
  for (const RankFacts& f : facts)
    if (f.p2p_disabled) return {TransportKind::host_memory};
  return {TransportKind::peer_memory, TransportKind::host_memory};
}

// Whether the direct transport can exist on this communicator at all: every rank on this machine
// (as NCCL sees hosts, or assumed by configuration) and few enough ranks for one fused reduce.
bool direct_possible(const Config& config, const Agreement& a, std::span<const RankFacts> facts) {
  if (config.direct_transport == DirectMode::off || facts.size() > static_cast<size_t>(kDirectMaxRanks)) return false;
  // auto takes the direct transport only where the fabric's cost model has figures for it (measured,
  // or the built-in host-memory ones): elsewhere its windows would be memory held for nothing.
  if (config.direct_transport == DirectMode::automatic &&
      effective_cost_model(config, a.fabric).direct_bandwidth_gbps <= 0)
    return false;
  if (config.direct_assume_one_host) return true;
  for (const RankFacts& f : facts)
    if (f.host_hash != facts[0].host_hash) return false;
  return true;
}

// One attempt at one kind: create this rank's windows, exchange handles, open every peer's, confirm
// on every rank. On any failure anywhere, everything made here is undone on every rank alike.
bool try_direct(CommState& s, const Config& config, TransportKind kind) {
  const DirectMemoryApi& m = s.platform->direct;
  // A rank whose platform or driver has no windows or no stream memory operations still takes both
  // exchanges of the round (its peers are in them) and says no.
  const bool capable = m.available && m.available() && m.create && m.open && m.close && m.destroy && s.platform->cuda.StreamWaitValue32 &&
                       s.platform->cuda.StreamWriteValue32;
  const size_t n = static_cast<size_t>(s.nranks);
  std::vector<DirectPeer> peers(n);
  DirectPeer& own = peers[static_cast<size_t>(s.rank)];
  DirectOffer offer;
  const uint64_t tag = (s.id << 8) | static_cast<uint64_t>(s.rank);
  bool ok = capable && m.create(WindowKind::host, sizeof(DirectFlags), tag, &own.flags, &offer.flags) == cudaSuccess;
  if (ok) {
    init_flags(*reinterpret_cast<DirectFlags*>(own.flags.host));
    ok = m.create(window_kind(kind), config.direct_window_bytes, tag, &own.data, &offer.data) == cudaSuccess;
  }
  s.platform->cuda.GetLastError();
  offer.ok = ok ? 1 : 0;
  offer.pid = s.platform->host_facts ? s.platform->host_facts(s.device).process_id : 0;
  own.pid = offer.pid;
  std::vector<char> all;
  const bool exchanged = gather_bytes(s, &offer, sizeof(offer), all) == ncclSuccess;
  std::vector<DirectOffer> offers(n);
  bool everyone = exchanged;
  if (exchanged)
    for (size_t r = 0; r < n; ++r) {
      std::memcpy(&offers[r], all.data() + r * sizeof(DirectOffer), sizeof(DirectOffer));
      everyone &= offers[r].ok == 1;
    }
  // Open every peer's windows (only if everyone could offer: the round's second exchange follows
  // either way, so every rank takes the same number of all-gathers).
  bool opened = everyone;
  for (size_t r = 0; r < n && opened; ++r) {
    if (static_cast<int>(r) == s.rank) continue;
    peers[r].pid = offers[r].pid;
    opened = m.open(offers[r].flags, &peers[r].flags) == cudaSuccess &&
             m.open(offers[r].data, &peers[r].data) == cudaSuccess && peers[r].data.bytes == own.data.bytes;
  }
  s.platform->cuda.GetLastError();
  if (all_agree(s, opened)) {
    if (m.unlink) m.unlink(own.flags), m.unlink(own.data);
    s.direct = std::make_unique<DirectTransport>(*s.platform, kind, s.rank, s.nranks, std::move(peers));
    FP8WIRE_INFO("comm {}: direct transport {} ready: {} ranks, {} per window, {} per buffer set", s.id,
                 to_string(kind), s.nranks, format_size(config.direct_window_bytes),
                 format_size(s.direct->set_bytes()));
    return true;
  }
  for (size_t r = 0; r < n; ++r) {
    DirectPeer& p = peers[r];
    const bool mine = static_cast<int>(r) == s.rank;
    for (Window* w : {&p.data, &p.flags})
      if (w->token) (mine ? m.destroy : m.close)(*w);
  }
  FP8WIRE_INFO("comm {}: direct transport {} not possible on every rank", s.id, to_string(kind));
  return false;
}

void setup_direct(CommState& s, const Config& config, std::span<const RankFacts> facts) {
  if (!direct_possible(config, s.agreement, facts)) return;
  for (TransportKind kind : direct_kinds(config, facts))
    if (try_direct(s, config, kind)) return;
  if (config.direct_transport != DirectMode::automatic)
    FP8WIRE_WARN("comm {}: direct.transport = {}, but not every rank could map every other's windows; FP8 goes "
                 "over NCCL's transports", s.id, to_string(config.direct_transport));
}

void log_agreement(const CommState& s) {
  const Agreement& a = s.agreement;
  FP8WIRE_INFO("comm {}: {} ranks on {} host(s), rank {}, device {}, fabric {}, FP8 {}{}", s.id, s.nranks,
               a.hosts.hosts, s.rank, s.device, to_string(a.fabric), a.fp8_ok ? "on" : "off: ", a.reason);
  // A job run with enable = false everywhere is not worth a warning per communicator.
  if (!a.fp8_ok && a.reason.find("enable = false") == std::string::npos)
    FP8WIRE_WARN("comm {}: FP8 off, every call passes through: {}", s.id, a.reason);
}

}  // namespace

bool query_comm(CommState& s) {
  const NcclApi& api = *s.platform->nccl;
  int nranks = 0, rank = -1, device = -1;
  const bool ok = api.CommCount && api.CommUserRank && api.CommCuDevice &&
                  api.CommCount(s.comm, &nranks) == ncclSuccess && api.CommUserRank(s.comm, &rank) == ncclSuccess &&
                  api.CommCuDevice(s.comm, &device) == ncclSuccess && nranks >= 1 && rank >= 0 && rank < nranks;
  if (!ok) return false;
  s.nranks = nranks;
  s.rank = rank;
  s.device = device;
  s.transport = NcclTransport(api, s.comm, rank, nranks);
  return true;
}

namespace {

// One communicator's part of the agreement, across the phases that several communicators of one
// thread go through together.
struct Round {
  CommState* s = nullptr;
  RankFacts mine;
  std::vector<RankFacts> all;
  ExchangeBuffer buffer;
  cudaStream_t stream = nullptr;
  cudaStream_t own = nullptr;  // a stream made for the exchange, destroyed after it
  bool can_take_part = false;
  ncclResult_t result = ncclSuccess;
};

void prepare(Round& round, const Config& config, const LocalIdentity& me) {
  CommState& s = *round.s;
  const CudaApi& cuda = s.platform->cuda;
  RankFacts& mine = round.mine;
  mine.version = me.version;
  mine.device = s.device;
  mine.config_fingerprint = config_fingerprint(config);
  const HostFacts host = s.platform->host_facts ? s.platform->host_facts(s.device) : HostFacts{};
  mine.host_hash = host.host_hash;
  mine.p2p_disabled = host.p2p_disabled;
  mine.nvlink_local = host.nvlink_local;
  mine.process = host.process_id;
  mine.usable = me.usable && config.enable && s.nranks <= quant::kMaxReduceInputs;
  if (!me.usable) set_problem(mine, me.problem.c_str());
  else if (!config.enable) set_problem(mine, "enable = false");
  else if (s.nranks > quant::kMaxReduceInputs) set_problem(mine, "more ranks than FP8 serves");
  // Scratch only where FP8 could run: a pass-through communicator holds no memory of ours.
  mine.scratch_ok = mine.usable && allocate_resources(s, config);

  round.all.resize(static_cast<size_t>(s.nranks));
  if (!get_exchange_buffer(s, round.all.size() * sizeof(RankFacts), &round.buffer)) {
    FP8WIRE_ERROR("comm {}: no memory for the 64-byte agreement exchange on device {}; this rank cannot take "
                  "part and its peers wait in the exchange until the communicator is aborted", s.id, s.device);
    round.result = ncclSystemError;
    return;
  }
  round.can_take_part = true;
  // The exchange runs on the communicator's own transfer lane when it has one, else on a stream made
  // for it (the legacy stream only if even that fails: it would order against the application's).
  round.stream = s.res.transfer;
  if (!round.stream && cuda.StreamCreateWithFlags(&round.own, cudaStreamNonBlocking) == cudaSuccess)
    round.stream = round.own;
  char* mine_at = round.buffer.data + static_cast<size_t>(s.rank) * sizeof(RankFacts);
  if (round.buffer.owned_host) std::memcpy(mine_at, &mine, sizeof(RankFacts));
  else if (cuda.MemcpyAsync(mine_at, &mine, sizeof(RankFacts), cudaMemcpyHostToDevice, round.stream) != cudaSuccess)
    round.result = ncclUnhandledCudaError;  // the all-gather is still issued: the peers are in it
}

void issue(Round& round) {
  if (!round.can_take_part) return;
  CommState& s = *round.s;
  char* mine_at = round.buffer.data + static_cast<size_t>(s.rank) * sizeof(RankFacts);
  const ncclResult_t r = s.platform->nccl->AllGather(mine_at, round.buffer.data, sizeof(RankFacts), ncclUint8,
                                                     s.comm, round.stream);
  if (!nccl_ok(r)) {
    round.can_take_part = false;
    if (nccl_ok(round.result)) round.result = r;
  }
}

void complete(Round& round, const Config& config) {
  CommState& s = *round.s;
  const CudaApi& cuda = s.platform->cuda;
  if (round.can_take_part) {
    const ncclResult_t waited = wait_exchange(s, round.stream);
    if (nccl_ok(round.result)) round.result = waited;
  }
  const size_t bytes = round.all.size() * sizeof(RankFacts);
  if (nccl_ok(round.result)) {
    if (round.buffer.owned_host) std::memcpy(round.all.data(), round.buffer.data, bytes);
    else if (cuda.Memcpy(round.all.data(), round.buffer.data, bytes, cudaMemcpyDeviceToHost) != cudaSuccess)
      round.result = ncclUnhandledCudaError;
  }
  if (round.own) cuda.StreamDestroy(round.own);
  s.setup = CommSetup::agreed;
  if (!nccl_ok(round.result)) {
    s.agreement = Agreement{};
    s.agreement.reason = "the agreement exchange failed";
    FP8WIRE_ERROR("comm {}: the agreement exchange failed (NCCL {}); FP8 off for it", s.id,
                  static_cast<int>(round.result));
    // The exchange may still be in flight on the transfer lane: the lanes and scratch stay until the
    // communicator is destroyed or aborted (a synchronize here could wait forever).
    round.buffer.abandon();
    return;
  }
  s.agreement = agree(config, round.all);
  log_agreement(s);
  if (!s.agreement.fp8_ok) {
    release_resources(s);  // a pass-through communicator keeps no memory
    return;
  }
  if (hierarchy_possible(config, s.agreement.topology)) split_hierarchy(s, s.agreement);
  setup_direct(s, config, round.all);
}

}  // namespace

void agree_at_creation(std::span<CommState* const> comms, const Config& config, const LocalIdentity& me) {
  if (comms.empty()) return;
  const CudaApi& cuda = comms[0]->platform->cuda;
  const NcclApi& nccl = *comms[0]->platform->nccl;
  NvtxRange range("fp8wire agree");
  std::vector<Round> rounds(comms.size());
  for (size_t i = 0; i < comms.size(); ++i) {
    rounds[i].s = comms[i];
    DeviceGuard guard(cuda, comms[i]->device);
    prepare(rounds[i], config, me);
  }
  const bool grouped = rounds.size() > 1;
  if (grouped) nccl.GroupStart();
  for (Round& r : rounds) {
    DeviceGuard guard(cuda, r.s->device);
    issue(r);
  }
  if (grouped) {
    const ncclResult_t end = nccl.GroupEnd();
    if (!nccl_ok(end))
      for (Round& r : rounds)
        if (nccl_ok(r.result)) r.result = end;
  }
  for (Round& r : rounds) {
    DeviceGuard guard(cuda, r.s->device);
    complete(r, config);
  }
}

void release_resources(CommState& s) {
  CommResources& r = s.res;
  if (!r.produce && !r.transfer && !r.scratch && !r.fork && !s.direct) return;  // touch no device it never used
  const CudaApi& cuda = s.platform->cuda;
  DeviceGuard guard(cuda, s.device);
  if (s.direct) {
    // A lane may wait on a peer's flag: after an abort, or once that peer is gone, no signal comes,
    // and this rank releases its own waits. Then the windows go once every peer has read what this
    // rank wrote (their release flags), so that no peer's kernel reads freed memory.
    const cudaStream_t lanes[] = {r.produce, r.transfer};
    s.direct->drain(lanes, 2, s.aborting);
    if (!s.direct->wait_peers_done(s.aborting)) s.direct->keep_own_window();
    s.direct.reset();
  }
  // The lanes may still run an FP8 call of this communicator (its last one, or one an abort cut
  // short): wait for them before freeing what they read.
  if (r.produce) cuda.StreamSynchronize(r.produce);
  if (r.transfer) cuda.StreamSynchronize(r.transfer);
  if (r.scratch) cuda.Free(r.scratch);
  for (cudaEvent_t e : {r.fork, r.produce_end, r.last, r.capture_produce_end, r.capture_transfer_end,
                        r.ready[0], r.ready[1], r.done[0], r.done[1]})
    if (e) cuda.EventDestroy(e);
  if (r.produce) cuda.StreamDestroy(r.produce);
  if (r.transfer) cuda.StreamDestroy(r.transfer);
  r = CommResources{};
}

}  // namespace fp8wire::sched
