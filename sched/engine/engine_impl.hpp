// The engine's private state, shared by its parts: engine.cpp (entry points, lifecycle, groups),
// submit.cpp (each call's way in: rules, registry, route), fp8_call.cpp (running one FP8 route) and
// group_queue.cpp (calls queued in an application group and their flush).
#pragma once

#include <array>
#include <exception>
#include <type_traits>
#include <atomic>
#include <optional>
#include <vector>

#include "common/log.hpp"
#include "quant/wire_format.hpp"
#include "sched/engine/accounting.hpp"
#include "sched/plan/coalesce.hpp"
#include "sched/comm/registry.hpp"
#include "sched/engine/engine.hpp"
#include "sched/platform/nccl_types.hpp"
#include "sched/exec/pipeline.hpp"
#include "sched/plan/recipe.hpp"
#include "sched/plan/route.hpp"

namespace fp8wire::sched {

// Every entry point's body runs inside this: the library never throws into the application; an
// exception becomes a logged error and ncclInternalError.
template <typename Fn>
auto guarded(const char* what, Fn&& fn) noexcept -> decltype(fn()) {
  try {
    return fn();
  } catch (const std::exception& e) {
    FP8WIRE_ERROR("fp8wire {}: {}", what, e.what());
  } catch (...) {
    FP8WIRE_ERROR("fp8wire {}: unknown exception", what);
  }
  if constexpr (std::is_same_v<decltype(fn()), ncclResult_t>) return ncclInternalError;
}


struct Call {
  Collective collective = Collective::all_reduce;
  const void* send = nullptr;
  void* recv = nullptr;
  size_t count = 0;
  ncclDataType_t dtype = ncclFloat32;
  ncclRedOp_t op = ncclSum;
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  // send_recv: which end of the message this rank is, and the other end's rank.
  PeerDirection direction = PeerDirection::none;
  int peer = -1;
};

// A point-to-point message whose wire buffer outlives its call: inside an application group NCCL
// issues the real send or receive only at the outermost ncclGroupEnd, so a received message is
// decoded, and every message's wire buffer released, after that (point_to_point.cpp).
struct PendingMessage {
  void* wire = nullptr;
  cudaStream_t stream = nullptr;
  void* decode_into = nullptr;  // a receive: the caller's buffer; a send: null
  size_t count = 0;
  quant::ElemType type = quant::ElemType::f32;
  quant::WireFormat format;
  ConvertPath convert_path = ConvertPath::automatic;
  CommRef state;
};

// One FP8 call the application issued inside its group, routed at issue time, run at the group's end.
struct Pending {
  Call call;
  CommRef state;          // kept alive until the flush, even if the communicator is destroyed meanwhile
  Route route;
  uint64_t seq = 0;
  uint64_t issue_ns = 0;
  uint64_t feedback_key = 0;
};

// Group state follows NCCL's: per thread. The call queue is fixed-size so queuing never allocates;
// a call beyond it passes through (the call sequence is the same on every rank, so is the overflow).
inline constexpr size_t kMaxPending = 1024;
struct ThreadGroup {
  GroupState group;
  std::array<Pending, kMaxPending> pending;
  std::array<PendingShape, kMaxPending> shapes;
  size_t npending = 0;
  std::vector<CommRef> setups;  // communicators created inside the group: agreed at its end
  std::vector<PendingMessage> messages;  // FP8 point-to-point messages issued inside the group
};
ThreadGroup& thread_group();

struct Engine::Impl {
  Impl(const Config& c, const Platform& p, LocalIdentity me);

  Config config;
  const Platform* platform;
  const NcclApi* api;
  LocalIdentity me;
  ProcessBudgets budgets;  // memory every communicator of the process shares
  Registry registry;

  // --- lifecycle (engine.cpp) ---
  // The agreement of communicators just created; the first set-up failure among them, if any.
  ncclResult_t set_up(const std::vector<CommRef>& comms);

  // --- routing (submit.cpp) ---
  ncclResult_t submit(const Call& c, std::optional<Path> forced);
  // The real NCCL function of the call, and the same with its record and hooks.
  ncclResult_t issue_plain(const Call& c);
  ncclResult_t run_plain(const Call& c, const CommIdentity* who, Path path, uint64_t seq, uint64_t issue);
  ncclResult_t run_plain(const Call& c, const CommState* s, Path path, uint64_t seq, uint64_t issue) {
    const CommIdentity who = s ? s->identity() : CommIdentity{};
    return run_plain(c, s ? &who : nullptr, path, seq, issue);
  }
  CallShape shape_of(const Call& c, const CommState* s) const;
  // What the planner may know of a communicator (sched/plan/route.hpp).
  static CommFacts facts_of(const CommState& s);

  // --- one FP8 call (fp8_call.cpp) ---
  // Runs the FP8 route of one call, or of a batch of `batch` grouped all-reduces packed into one
  // (items). With `joins`, the join of the caller's stream is left to that list (a group flush).
  ncclResult_t run_fp8(const CommRef& s, const Call& c, const Route& route, uint64_t seq, uint64_t issue,
                       uint64_t feedback_key, const Pending* items = nullptr, size_t batch = 1,
                       JoinList* joins = nullptr);

  // --- point-to-point messages (point_to_point.cpp) ---
  // One FP8 message of a send_recv call whose route is FP8: quantized, sent or received, decoded.
  ncclResult_t run_message(const CommRef& s, const Call& c, const Route& route, uint64_t seq, uint64_t issue);
  // The sending end's quantize of message `m`, measured or audited where its recipe says so.
  ncclResult_t quantize_message(CommState& s, const Call& c, const Recipe& recipe, const PendingMessage& m,
                                uint64_t seq);
  // After the outermost real ncclGroupEnd (its result `group_end`): the group's received messages
  // decoded where it succeeded, every message's wire buffer released on its stream. The first error.
  ncclResult_t finish_messages(ThreadGroup& tg, ncclResult_t group_end);

  // --- groups (group_queue.cpp) ---
  ncclResult_t queue(ThreadGroup& tg, const Call& c, const CommRef& s, const Route& route, uint64_t seq, uint64_t issue,
                     uint64_t feedback_key);
  ncclResult_t flush(ThreadGroup& tg);
};

uint64_t now_ns();
CallKind kind_of(const Call& c);
// What NCCL's own algorithm sends from this rank for the call (CallRecord::plain_wire_bytes): the
// nccl-tests bus-bandwidth factors of its ring algorithms. Without the communicator's identity (a
// call rejected before the registry lookup) the caller's bytes stand in.
uint64_t plain_wire_bytes(const Call& c, const CommIdentity* who);

}  // namespace fp8wire::sched
