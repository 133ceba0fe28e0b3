// The process-wide accounting ring. Writers claim a slot with one atomic increment and publish it
// with a per-slot sequence lock, so the call path never allocates nor takes a lock; a reader that
// catches a slot mid-write skips it. The storage is a static of the singleton (Accounting::instance).
#include "sched/engine/accounting.hpp"

#include <algorithm>
#include <array>

namespace fp8wire {

namespace {
std::atomic<const CallHooks*> g_hooks{nullptr};

struct Slot {
  std::atomic<uint64_t> version{0};  // odd while being written
  CallRecord record;
};

struct Ring {
  std::array<Slot, Accounting::kCapacity> slots;
  std::atomic<uint64_t> written{0};       // slots claimed so far
  std::atomic<uint64_t> read_horizon{0};  // highest seq a snapshot has returned
  std::atomic<uint64_t> dropped{0};
  std::atomic<uint64_t> calls[kMaxPaths] = {};
  std::atomic<uint64_t> app_bytes[kMaxPaths] = {};
  std::atomic<uint64_t> wire_bytes[kMaxPaths] = {};
  std::atomic<uint64_t> gather_calls[3] = {};
  std::atomic<uint64_t> transport_calls[kMaxTransports] = {};
  std::atomic<uint64_t> transport_app_bytes[kMaxTransports] = {};
  std::atomic<uint64_t> transport_wire_bytes[kMaxTransports] = {};
  std::atomic<uint64_t> kind_calls[kMaxCallKinds][kMaxPaths] = {};
  std::atomic<uint64_t> kind_app_bytes[kMaxCallKinds] = {};
  std::atomic<uint64_t> kind_wire_bytes[kMaxCallKinds] = {};
  std::atomic<uint64_t> kind_plain_wire_bytes[kMaxCallKinds] = {};
};

Ring& ring() {
  static Ring* r = new Ring();  // never destroyed: records may arrive from atexit handlers
  return *r;
}
}  // namespace

void set_call_hooks(const CallHooks* hooks) { g_hooks.store(hooks, std::memory_order_release); }
const CallHooks* call_hooks() { return g_hooks.load(std::memory_order_acquire); }

Accounting& Accounting::instance() {
  static Accounting* a = new Accounting();
  return *a;
}

void Accounting::record(const CallRecord& r) {
  Ring& g = ring();
  const int p = static_cast<int>(r.path) < kMaxPaths ? static_cast<int>(r.path) : 0;
  g.calls[p].fetch_add(1, std::memory_order_relaxed);
  g.app_bytes[p].fetch_add(r.app_bytes, std::memory_order_relaxed);
  g.wire_bytes[p].fetch_add(r.wire_bytes, std::memory_order_relaxed);
  if (r.gather != GatherMethod::automatic && static_cast<int>(r.gather) < 3)
    g.gather_calls[static_cast<int>(r.gather)].fetch_add(1, std::memory_order_relaxed);
  // Only the direct transports count here: NCCL's row is every call less theirs, made when totals are
  // read, so a call that passes through pays nothing more for it.
  if (r.transport != Carrier::nccl && static_cast<int>(r.transport) < kMaxTransports) {
    const int t = static_cast<int>(r.transport);
    g.transport_calls[t].fetch_add(1, std::memory_order_relaxed);
    g.transport_app_bytes[t].fetch_add(r.app_bytes, std::memory_order_relaxed);
    g.transport_wire_bytes[t].fetch_add(r.wire_bytes, std::memory_order_relaxed);
  }
  if (const int k = static_cast<int>(r.kind); k < kMaxCallKinds) {
    g.kind_calls[k][p].fetch_add(1, std::memory_order_relaxed);
    g.kind_app_bytes[k].fetch_add(r.app_bytes, std::memory_order_relaxed);
    g.kind_wire_bytes[k].fetch_add(r.wire_bytes, std::memory_order_relaxed);
    g.kind_plain_wire_bytes[k].fetch_add(r.plain_wire_bytes, std::memory_order_relaxed);
  }

  const uint64_t index = g.written.fetch_add(1, std::memory_order_relaxed);
  Slot& slot = g.slots[index % kCapacity];
  const uint64_t v = slot.version.load(std::memory_order_relaxed);
  slot.version.store(v + 1, std::memory_order_relaxed);  // odd: readers skip the slot
  std::atomic_thread_fence(std::memory_order_release);
  if (index >= kCapacity && slot.record.seq > g.read_horizon.load(std::memory_order_relaxed))
    g.dropped.fetch_add(1, std::memory_order_relaxed);
  slot.record = r;
  slot.version.store(v + 2, std::memory_order_release);
}

size_t Accounting::snapshot(CallRecord* out, size_t max, uint64_t since) const {
  Ring& g = ring();
  const uint64_t end = g.written.load(std::memory_order_acquire);
  const uint64_t begin = end > kCapacity ? end - kCapacity : 0;
  size_t n = 0;
  uint64_t horizon = 0;
  for (uint64_t i = begin; i < end && n < max; ++i) {
    const Slot& slot = g.slots[i % kCapacity];
    const uint64_t v1 = slot.version.load(std::memory_order_acquire);
    if (v1 & 1) continue;
    CallRecord copy = slot.record;
    std::atomic_thread_fence(std::memory_order_acquire);
    if (slot.version.load(std::memory_order_relaxed) != v1 || copy.seq <= since) continue;
    out[n++] = copy;
    horizon = std::max(horizon, copy.seq);
  }
  uint64_t seen = g.read_horizon.load(std::memory_order_relaxed);
  while (horizon > seen && !g.read_horizon.compare_exchange_weak(seen, horizon)) {
  }
  return n;
}

AccountingTotals Accounting::totals() const {
  Ring& g = ring();
  AccountingTotals t;
  // The direct transports' rows first, then the paths' (a call counts in its path's row before its
  // transport's); NCCL's row is the difference, clamped at 0 for a reader racing a writer.
  for (int i = 0; i < kMaxTransports; ++i) {
    if (i == static_cast<int>(Carrier::nccl)) continue;
    t.transport_calls[i] = g.transport_calls[i].load(std::memory_order_acquire);
    t.transport_app_bytes[i] = g.transport_app_bytes[i].load(std::memory_order_acquire);
    t.transport_wire_bytes[i] = g.transport_wire_bytes[i].load(std::memory_order_acquire);
    t.direct_calls += t.transport_calls[i];
  }
  uint64_t calls = 0, app = 0, wire = 0;
  for (int i = 0; i < kMaxPaths; ++i) {
    t.calls[i] = g.calls[i].load(std::memory_order_relaxed);
    t.app_bytes[i] = g.app_bytes[i].load(std::memory_order_relaxed);
    t.wire_bytes[i] = g.wire_bytes[i].load(std::memory_order_relaxed);
    calls += t.calls[i], app += t.app_bytes[i], wire += t.wire_bytes[i];
  }
  for (int i = 0; i < 3; ++i) t.gather_calls[i] = g.gather_calls[i].load(std::memory_order_relaxed);
  for (int k = 0; k < kMaxCallKinds; ++k) {
    for (int p = 0; p < kMaxPaths; ++p) t.kind_calls[k][p] = g.kind_calls[k][p].load(std::memory_order_relaxed);
    t.kind_app_bytes[k] = g.kind_app_bytes[k].load(std::memory_order_relaxed);
    t.kind_wire_bytes[k] = g.kind_wire_bytes[k].load(std::memory_order_relaxed);
    t.kind_plain_wire_bytes[k] = g.kind_plain_wire_bytes[k].load(std::memory_order_relaxed);
  }
  auto rest = [](uint64_t all, const uint64_t* rows) {
    uint64_t direct = 0;
    for (int i = 0; i < kMaxTransports; ++i) direct += rows[i];
    return all > direct ? all - direct : 0;
  };
  const int nccl = static_cast<int>(Carrier::nccl);
  t.transport_calls[nccl] = rest(calls, t.transport_calls);
  t.transport_app_bytes[nccl] = rest(app, t.transport_app_bytes);
  t.transport_wire_bytes[nccl] = rest(wire, t.transport_wire_bytes);
  t.dropped_records = g.dropped.load(std::memory_order_relaxed);
  return t;
}

void Accounting::reset() {
  Ring& g = ring();
  for (int i = 0; i < kMaxPaths; ++i) {
    g.calls[i].store(0);
    g.app_bytes[i].store(0);
    g.wire_bytes[i].store(0);
  }
  for (auto& c : g.gather_calls) c.store(0);
  for (int i = 0; i < kMaxTransports; ++i) {
    g.transport_calls[i].store(0);
    g.transport_app_bytes[i].store(0);
    g.transport_wire_bytes[i].store(0);
  }
  for (int k = 0; k < kMaxCallKinds; ++k) {
    for (auto& c : g.kind_calls[k]) c.store(0);
    g.kind_app_bytes[k].store(0);
    g.kind_wire_bytes[k].store(0);
    g.kind_plain_wire_bytes[k].store(0);
  }
  g.dropped.store(0);
  g.read_horizon.store(seq_.load());
  // Records stay readable by seq; only the totals restart.
}

}  // namespace fp8wire
