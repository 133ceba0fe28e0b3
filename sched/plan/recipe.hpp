// One call's recipe: everything the executor needs to run it, decided whole by one pure function
// before anything runs. The route (route.hpp) says *what* runs: pass through, fallback, or an FP8
// algorithm with its carrier, gather step and stage size. The recipe adds *how*: the direct
// protocol and how the executor's lanes hand stages over, whether the call is measured, carries the
// guard's votes or runs in full precision because the guard switched its tensor, whether it is
// audited or fed back, and the one factor applied before requantizing. engine/, exec/, algorithms/
// and transport/ read the recipe and never the configuration.
//
// Inputs alike on every rank (the configuration, whose fingerprint the agreement checked; the
// communicator's agreed facts; the call's shape; the scope's guard state, which every rank advances
// alike from votes every rank received), so every rank follows the same recipe. The one input that
// may differ, whether the call is being captured into a CUDA graph, changes only what is rank-local
// (which lanes a direct call's copies use, whether a record is taken), never what the peers see.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/config.hpp"
#include "quant/wire_format.hpp"
#include "sched/plan/guard.hpp"
#include "sched/plan/route.hpp"
#include "sched/plan/types.hpp"

namespace fp8wire::sched {

// How the pipeline executor's two lanes (produce, transfer: sched/exec/pipeline.hpp) hand a stage over.
enum class LaneHandover : uint8_t {
  // The transfer lane waits for the stage's produce before its finish (calls over NCCL; the kernels
  // protocol under graph capture).
  before_finish,
  // The transfer lane waits at the produce gate: the stage's copy-in of what its peers published runs
  // first, and the wait comes before the first operation that touches what the produce lane wrote
  // (the copy_engine protocol under graph capture).
  produce_gate,
  // The same, and each half of a stage runs its operations over the link (flag handshakes, copies) on
  // a copy lane beside its kernel lane, each copy lane waiting for the kernels it follows and never the
  // other way, so no copy or flag waits behind a kernel that waits for the lane's previous one (every
  // direct call outside capture: a captured graph orders its branches by its edges only).
  copy_lanes,
};
const char* to_string(LaneHandover);

// The direct transport's part of a recipe (the carrier is the route's).
struct DirectRecipe {
  DirectProtocol protocol = DirectProtocol::automatic;  // automatic: not a direct call
  LaneHandover handover = LaneHandover::before_finish;
  // Thread blocks of a codec kernel that loads or stores a window (direct.ctas: the link's share; the
  // rest of the GPU is the application's). Kernels on device memory alone run at the codec's width.
  uint32_t window_ctas = 0;
  // copy_engine: bytes of the stage's device buffer set the programs keep data in.
  size_t device_set_bytes = 0;
  // copy_engine, programs without a second handshake (all but two-shot, whose gather it would tie to
  // the sends and serialise): a stage's first write into a window waits until every peer has
  // published the previous stage, so the ranks of one host take turns on the copy engines stage by
  // stage instead of one rank queueing all of its stages ahead of its peers'.
  bool paced_sends = false;
};

// Telemetry, the guard and the audit on this call (sched/plan/guard.hpp, sched/README.md).
struct Watch {
  bool active = false;          // telemetry or the audit is on: the communicator's monitor sees the call
  // The call counts in its guard scope and in the communicator's audit count, which every rank keeps
  // alike: every collective; never a message, which only its two ends see.
  bool scoped = true;
  uint64_t scope = 0;           // the guard's scope: the call's feedback key, or 0 (the communicator)
  GuardSettings guard;          // telemetry.*, guard.*
  bool decision_read = false;   // this call read the scope's pending decision (it was due)
  bool tripped = false;         // and that decision switched the scope to full precision from this call
  bool resumed = false;         // the first call in FP8 after a spell in full precision
  bool full_precision = false;  // the guard switched the scope: the real NCCL call, recorded as fallback
  bool measured = false;        // the codec kernels measure the call's error into a telemetry record
  bool guarded = false;         // and its chunks carry this rank's vote
  uint64_t decide_at = 0;       // a guarded call: the scope's call that reads its votes
  ScopeState scope_after;       // the scope's count and full-precision spell after this call
  bool audited = false;         // the exact collective also runs, on a copy, and the two are compared
  uint64_t audit_calls_after = 0;
};

// A point-to-point call (room for send/recv: the peer, which end this rank is, the ordered pair's
// own sequence number, which both ends count alike).
enum class PeerDirection : uint8_t { none, send, recv };
struct PeerCall {
  PeerDirection direction = PeerDirection::none;
  int peer = -1;
  uint64_t pair_seq = 0;
};

struct Recipe {
  Route route;          // what runs
  quant::WireFormat format;                          // the wire format (format, block_size, scale_type, ...)
  ConvertPath convert_path = ConvertPath::automatic;  // which FP8 conversion instructions the kernels use
  DirectRecipe direct;  // over a direct transport: how
  Watch watch;
  bool feedback = false;  // error feedback: this call adds its key's residual and keeps the new one
  float post = 1.0f;      // applied once, in fp32, before requantizing (1/n for an average)
  PeerCall peer;
  // Whether the call runs the real NCCL call (pass-through, fallback, or the guard's full precision).
  bool plain() const { return !is_fp8(route.path) || watch.full_precision; }
};

// What the engine knows of a call beyond its shape.
struct CallContext {
  bool capturing = false;     // its stream is being captured into a CUDA graph
  bool grouped = false;       // issued inside an application group (its join waits for the group's end)
  size_t batch = 1;           // calls coalesced into this one
  uint64_t feedback_key = 0;  // fp8wire_set_feedback_key's key for the call (0: none)
  ScopeState scope;           // the guard's state of the call's scope before it (the monitor's)
  uint64_t audit_calls = 0;   // the communicator's auditable calls before it
  PeerCall peer;              // a point-to-point call: its end, its peer, the pair's message number
};

// The recipe of a call whose route is `route` (route_call, or route_fp8 for a coalesced batch).
Recipe recipe_for(const Config& config, const CommFacts& comm, const CallShape& call, const Route& route,
                  const CallContext& context);

// The direct protocol on windows of `kind`: over peer memory kernels (they store over NVLink or P2P
// with no copy engine between: the copies were never measured there); over host memory direct.protocol,
// copy_engine by default.
DirectProtocol direct_protocol_for(const Config& config, Carrier kind);

}  // namespace fp8wire::sched
