// The agreement's flow (comm_setup.hpp): this rank's resources and facts, the 64-byte exchange of
// every communicator one thread created, the decision, then the later rounds where FP8 may run
// (rounds.hpp). The exchange's primitives are in exchange.cpp.
#include "sched/comm/comm_setup.hpp"

#include <algorithm>
#include <cstring>
#include <memory>
#include <vector>

#include "common/log.hpp"
#include "common/nvtx.hpp"
#include "common/status.hpp"
#include "sched/comm/exchange.hpp"
#include "sched/comm/rounds.hpp"
#include "sched/plan/hierarchy.hpp"
#include "sched/platform/device_guard.hpp"
#include "sched/platform/platform.hpp"
#include "sched/transport/direct_windows.hpp"

namespace fp8wire::sched {

namespace {

// Local resources for FP8 on this communicator: the lanes and their events, and the scratch this rank
// offers (ScratchBudget). Failure is not an error: lanes that cannot be made are reported in the
// agreement and every rank then passes through; scratch that cannot be had is offered as none.
bool allocate_resources(CommState& s, const Config& config) {
  const CudaApi& cuda = s.platform->cuda;
  CommResources& r = s.res;
  if (cuda.StreamCreateWithFlags(&r.produce, cudaStreamNonBlocking) != cudaSuccess ||
      cuda.StreamCreateWithFlags(&r.transfer, cudaStreamNonBlocking) != cudaSuccess ||
      cuda.StreamCreateWithFlags(&r.send, cudaStreamNonBlocking) != cudaSuccess ||
      cuda.StreamCreateWithFlags(&r.fetch, cudaStreamNonBlocking) != cudaSuccess)
    return false;
  std::vector<cudaEvent_t*> events = {&r.fork, &r.tail, &r.produce_end, &r.last, &r.capture_produce_end,
                                       &r.capture_transfer_end, &r.to_copy_lane, &r.to_kernel_lane, &r.send_end};
  for (int i = 0; i < kMaxBufferSets; ++i) events.insert(events.end(), {&r.ready[i], &r.done[i], &r.acquired[i]});
  for (cudaEvent_t* e : events)
    if (cuda.EventCreateWithFlags(e, cudaEventDisableTiming) != cudaSuccess) return false;
  const uint64_t offer = s.scratch_budget->take(config.scratch_max_bytes);
  void* p = nullptr;
  if (offer && cuda.Malloc(&p, offer) != cudaSuccess) {
    cuda.GetLastError();  // clear the allocation error so it is not reported by an unrelated call
    FP8WIRE_WARN("comm {}: cannot allocate {} of scratch on device {}: it offers none, so its collectives pass "
                 "through", s.id, format_size(offer), s.device);
    s.scratch_budget->give_back(offer);
    return true;
  }
  r.scratch = static_cast<char*>(p);
  r.scratch_taken = offer;
  r.layout = scratch_layout(config, offer);  // until the agreement: the exchange's buffer fits in it
  return true;
}

// Keeps the scratch every rank offered (the agreement's least offer), giving the rest back to the
// process's budget: freed and taken again at the smaller size, which the memory just freed serves.
// False when even that allocation fails (the rank can then no longer run what its peers agreed to).
bool keep_agreed_scratch(CommState& s, const Config& config) {
  const CudaApi& cuda = s.platform->cuda;
  CommResources& r = s.res;
  const uint64_t agreed = s.agreement.scratch_bytes;
  if (agreed < r.scratch_taken) {
    if (r.scratch) cuda.Free(r.scratch);
    void* p = nullptr;
    const bool ok = agreed == 0 || cuda.Malloc(&p, agreed) == cudaSuccess;
    r.scratch = static_cast<char*>(p);
    s.scratch_budget->give_back(r.scratch_taken - (ok ? agreed : 0));
    r.scratch_taken = ok ? agreed : 0;
    if (!ok) {
      cuda.GetLastError();  // cleared, as above
      FP8WIRE_ERROR("comm {}: cannot allocate the {} of scratch its ranks agreed on, on device {}", s.id,
                    format_size(agreed), s.device);
      return false;
    }
  }
  r.layout = scratch_layout(config, agreed);
  FP8WIRE_INFO("comm {}: scratch {} (the process holds {} of scratch.process_max_bytes {})", s.id,
               format_size(agreed), format_size(s.scratch_budget->held()), format_size(s.scratch_budget->total()));
  return true;
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
  HostFacts host;  // this rank's, read once: the agreement takes some, the direct round its GPU
  RankFacts mine;
  std::vector<RankFacts> all;
  ExchangeBuffer buffer;
  cudaStream_t stream = nullptr;
  cudaStream_t own = nullptr;  // a stream made for the exchange, destroyed after it
  bool can_take_part = false;
  bool launched = false;  // its all-gather is in NCCL's hands
  ncclResult_t result = ncclSuccess;
};

void prepare(Round& round, const Config& config, const LocalIdentity& me) {
  CommState& s = *round.s;
  const CudaApi& cuda = s.platform->cuda;
  start_setup_clock(s, config);
  RankFacts& mine = round.mine;
  mine.version = me.version;
  mine.device = s.device;
  mine.config_fingerprint = config_fingerprint(config);
  round.host = s.platform->host_facts ? s.platform->host_facts(s.device) : HostFacts{};
  const HostFacts& host = round.host;
  mine.host_hash = host.host_hash;
  mine.p2p_disabled = host.p2p_disabled;
  mine.nvlink_local = host.nvlink_local;
  mine.process = host.process_id;
  mine.usable = me.usable && config.enable && s.nranks <= quant::kMaxReduceInputs;
  if (!me.usable) set_problem(mine, me.problem.c_str());
  else if (!config.enable) set_problem(mine, "enable = false");
  else if (s.nranks > quant::kMaxReduceInputs) set_problem(mine, "more ranks than FP8 serves");
  // Lanes and scratch only where FP8 could run: a pass-through communicator holds no memory of ours.
  mine.lanes_ok = mine.usable && allocate_resources(s, config);
  mine.scratch_units = static_cast<uint32_t>(std::min<uint64_t>(s.res.scratch_taken / kScratchUnit, UINT32_MAX));

  round.all.resize(static_cast<size_t>(s.nranks));
  if (!get_exchange_buffer(s, round.all.size() * sizeof(RankFacts), &round.buffer)) {
    FP8WIRE_ERROR("comm {}: no memory for the 64-byte agreement exchange on device {}; this rank cannot take "
                  "part", s.id, s.device);
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

// The launch of every round's all-gather (in one NCCL group where one thread created several) as a
// host call of its own (exchange.hpp): NCCL's first collective on a communicator may connect to the
// peers and wait for them inside its launch.
void launch(std::vector<Round>& rounds) {
  struct Launch {
    ncclComm_t comm;
    char* mine;
    char* all;
    cudaStream_t stream;
    int device;
  };
  std::vector<Launch> launches;
  std::vector<CommState*> comms;
  std::vector<Round*> taking;
  for (Round& r : rounds) {
    if (!r.can_take_part) continue;
    CommState& s = *r.s;
    launches.push_back({s.comm, r.buffer.data + static_cast<size_t>(s.rank) * sizeof(RankFacts), r.buffer.data,
                        r.stream, s.device});
    comms.push_back(&s);
    taking.push_back(&r);
  }
  if (taking.empty()) return;
  const Platform& p = *comms[0]->platform;
  auto results = std::make_shared<std::vector<ncclResult_t>>(launches.size(), ncclSuccess);
  const ncclResult_t launched = call_with_deadline(
      comms, "the agreement exchange's launch", [api = p.nccl, cuda = &p.cuda, launches, results] {
        const bool grouped = launches.size() > 1;
        if (grouped) api->GroupStart();
        for (size_t i = 0; i < launches.size(); ++i) {
          const Launch& l = launches[i];
          DeviceGuard guard(*cuda, l.device);
          (*results)[i] = api->AllGather(l.mine, l.all, sizeof(RankFacts), ncclUint8, l.comm, l.stream);
        }
        return grouped ? api->GroupEnd() : ncclSuccess;
      });
  for (size_t i = 0; i < taking.size(); ++i) {
    Round& r = *taking[i];
    if (comms[i]->host_call) {  // given up on inside NCCL: joined or not, nobody can tell
      r.result = launched;
      continue;
    }
    if (!nccl_ok((*results)[i])) {  // refused at once: this rank never joined
      r.can_take_part = false;
      if (nccl_ok(r.result)) r.result = (*results)[i];
      continue;
    }
    if (!nccl_ok(launched) && nccl_ok(r.result)) r.result = launched;  // the group's end failed
    r.launched = nccl_ok(launched);
  }
}

// The set-up failed on this rank: its creation fails (sched/README.md, "The agreement": a rank never
// goes on in another mode than its peers may have concluded). What an exchange may still write stays.
void fail_setup(CommState& s, ncclResult_t why) {
  s.setup = CommSetup::failed;
  s.fail(why);
  s.agreement = Agreement{};
  s.agreement.reason = "the set-up's exchange failed";
}

void complete(Round& round, const Config& config) {
  CommState& s = *round.s;
  const CudaApi& cuda = s.platform->cuda;
  if (round.launched) {
    const ncclResult_t waited = wait_exchange(s, round.stream, "the agreement exchange");
    if (nccl_ok(round.result) || !nccl_ok(waited)) round.result = waited;
  }
  const size_t bytes = round.all.size() * sizeof(RankFacts);
  if (nccl_ok(round.result)) {
    if (round.buffer.owned_host) std::memcpy(round.all.data(), round.buffer.data, bytes);
    else if (cuda.Memcpy(round.all.data(), round.buffer.data, bytes, cudaMemcpyDeviceToHost) != cudaSuccess)
      round.result = ncclUnhandledCudaError;
  }
  // CUDA frees it once its work is done; a launch given up on may still enqueue on it.
  if (round.own && !s.host_call) cuda.StreamDestroy(round.own);
  if (!round.can_take_part) {
    // This rank never joined the exchange, so no peer can have completed it (theirs fail at the
    // deadline): going on alone in pass-through meets no peer's FP8 call.
    s.setup = CommSetup::agreed;
    s.agreement = Agreement{};
    s.agreement.reason = "this rank could not take part in the agreement exchange";
    FP8WIRE_ERROR("comm {}: {} (NCCL {}): it passes through, and its peers' creation fails at the set-up's deadline",
                  s.id, s.agreement.reason, static_cast<int>(round.result));
    release_resources(s);
    return;
  }
  if (!nccl_ok(round.result)) {
    FP8WIRE_ERROR("comm {}: the agreement exchange failed (NCCL {}): the communicator's creation fails", s.id,
                  static_cast<int>(round.result));
    // The exchange may still be in flight on the transfer lane: the lanes and scratch stay until the
    // communicator is aborted (a synchronize here could wait forever).
    round.buffer.abandon();
    fail_setup(s, round.result);
    return;
  }
  s.setup = CommSetup::agreed;
  s.agreement = agree(config, round.all);
  log_agreement(s);
  if (!s.agreement.fp8_ok) {
    release_resources(s);  // a pass-through communicator keeps no memory
    return;
  }
  if (!keep_agreed_scratch(s, config)) {
    fail_setup(s, ncclSystemError);
    return;
  }
  // Without scratch no collective runs FP8 here: the sub-communicators and windows would serve none.
  if (s.agreement.scratch_bytes == 0) return;
  ncclResult_t later = ncclSuccess;
  if (hierarchy_possible(config, s.agreement.topology)) {
    // Sub-communicators the planner would never use are not worth their set-up and memory.
    if (const std::string why = hierarchy_guard_reason(config, s.agreement.topology); !why.empty())
      FP8WIRE_INFO("comm {}: {}", s.id, why);
    else
      later = split_hierarchy(s, s.agreement);
  }
  if (nccl_ok(later)) later = setup_direct(s, config, round.all, round.host.gpu_hash);
  if (!nccl_ok(later)) {
    FP8WIRE_ERROR("comm {}: a later round of the agreement failed (NCCL {}): the communicator's creation fails",
                  s.id, static_cast<int>(later));
    fail_setup(s, later);
  }
}

}  // namespace

void agree_at_creation(std::span<CommState* const> comms, const Config& config, const LocalIdentity& me) {
  if (comms.empty()) return;
  const CudaApi& cuda = comms[0]->platform->cuda;
  NvtxRange range("fp8wire agree");
  std::vector<Round> rounds(comms.size());
  for (size_t i = 0; i < comms.size(); ++i) {
    rounds[i].s = comms[i];
    DeviceGuard guard(cuda, comms[i]->device);
    prepare(rounds[i], config, me);
  }
  launch(rounds);
  for (Round& r : rounds) {
    DeviceGuard guard(cuda, r.s->device);
    complete(r, config);
  }
}


}  // namespace fp8wire::sched
