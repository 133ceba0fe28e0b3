// The guard's choices, as pure functions of what every rank of a communicator knows alike: the
// configuration, the call's route, and one scope's sequence of calls and decisions. A scope is a
// tensor (its feedback key, fp8wire_set_feedback_key) or, for calls without one, the communicator.
//
// Protocol (sched/README.md, "Telemetry and the guard"): call n of a scope is measured when
// n % telemetry.sample_every == 0 (and the first FP8 call after a retry). A measured call with the
// guard carries each rank's vote as a flag in the chunks it sends; every rank ORs the flags in the
// bytes it finally decodes, which are the same votes on every rank (sched/README.md, "Telemetry
// and the guard", says why per algorithm; guard_eligible below lists them). Before call m = n + guard.decide_after of the scope each rank reads that decision
// (waiting for call n to complete only if it has not by then) and, if any rank voted, calls
// m .. m + retry_after - 1 of the scope run in full precision on every rank. One decision is in flight
// per scope: measured calls before m carry no vote. Nothing rank-local enters a choice except through
// those flags, and the call that reads them is fixed by the call count alone.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/config.hpp"
#include "quant/telemetry.hpp"
#include "quant/wire_format.hpp"
#include "sched/plan/route.hpp"
#include "sched/plan/types.hpp"

namespace fp8wire::sched {

struct GuardSettings {
  uint32_t sample_every = 0;   // telemetry.sample_every (0: nothing is measured)
  bool enable = false;         // guard.enable
  uint32_t retry_after = 0;    // guard.retry_after: calls in full precision after a trip (0: for good)
  uint32_t decide_after = 8;   // guard.decide_after: a guarded call n's votes are read before call n + this
  quant::GuardBounds bounds;   // guard.max_*
  static GuardSettings from(const Config& c);
};

// One scope's history.
struct ScopeState {
  uint64_t calls = 0;        // FP8-eligible calls of the scope so far
  uint64_t full_until = 0;   // calls with an index below this run in full precision
  uint64_t resume_at = 0;    // the first call after a full-precision spell (measured); 0: none
  int pending = -1;          // telemetry record of a guarded call whose decision is not read yet
  uint64_t decide_at = 0;    // the call that reads it: the guarded call's index + decide_after
  bool has_decision = false; // that record was read: `decision` waits for call `decide_at`
  bool decision = false;
  bool deciding() const { return pending >= 0 || has_decision; }
};

struct CallChoice {
  bool full_precision = false;  // the guard has switched this scope: the real NCCL call
  bool measure = false;         // telemetry on this call
  bool guard = false;           // and the guard's flags
};

// The scope of a call (`batch` calls coalesced into it, `feedback_key` its key): the key's tensor, or
// the communicator for a call without one or for a coalesced batch (whose calls each have their own).
inline uint64_t guard_scope(size_t batch, uint64_t feedback_key) { return batch > 1 ? 0 : feedback_key; }

// Whether the flags of a call reach every rank as the same set of votes: the one-shot and two-shot
// all-reduce (over NCCL or a direct transport, coalesced or not), the all-gather, and the all-to-all
// of one stage of whole blocks, with a scale that has a spare bit. The all-to-all's rank then
// quantizes every chunk in one launch, its own too, whose last thread block casts the rank's vote over
// all of it onto every peer's chunk, so every rank receives every other's whole vote and holds its
// own: the same set everywhere. Not a pipelined or ragged all-to-all (its launches cover a part of
// the peers each, so a receiver would read a vote over whatever its sender had quantized by then),
// the reduce-scatter (rank r holds only the chunks sent to it, voted before their senders' later
// chunks were measured), the ring or the hierarchical path (votes stay inside a rail): those are
// measured only.
bool guard_eligible(const CallShape& call, const Route& route, const quant::WireFormat& format);

// What the scope's next call does; advances its count. Under capture nothing is measured (the record
// could not be read back per replay). While a guarded call's votes are still to be read, later
// measured calls are measured only (one decision in flight per scope).
CallChoice choose(ScopeState& scope, const GuardSettings& g, bool eligible, bool capturing);

// The decision of a guarded call (the OR of every rank's vote), read at the scope's call decide_after
// calls later: when set, the scope runs in full precision from that call on, for retry_after calls
// (for good when 0). Returns whether it switched.
bool apply_decision(ScopeState& scope, bool decided, uint32_t retry_after);

}  // namespace fp8wire::sched
