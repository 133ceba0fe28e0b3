#include "profiler/exposure.hpp"

#include <algorithm>
#include <set>
#include <unordered_set>

namespace fp8wire::prof {

namespace {
double to_ms(int64_t ns) { return static_cast<double>(ns) * 1e-6; }

Interval clip(Interval i, Interval window) {
  return {std::max(i.begin, window.begin), std::min(i.end, window.end)};
}

constexpr Interval kNoSpan{std::numeric_limits<int64_t>::max(), std::numeric_limits<int64_t>::min()};

struct CollectiveGroup {
  uint64_t seq = 0;
  Interval span = kNoSpan;        // call-begin mark (or first kernel) .. last kernel end, unclipped
  const Activity* first = nullptr;  // earliest kernel (its mark when the call has none)
  uint32_t kernels = 0;
  int64_t data_ns = 0;            // exposed, a kernel of this collective owning the instant
  int64_t wait_ns = 0;            // exposed, no kernel running, this collective's span owning it
};

void widen(Interval& span, Interval t) {
  span.begin = std::min(span.begin, t.begin);
  span.end = std::max(span.end, t.end);
}

// Exposed data per collective: every instant of K \ C goes to the earliest-starting collective
// (lowest index: groups are sorted by span start) with a kernel running then. One sweep over the
// kernels' boundaries.
void own_exposed_data(const std::vector<std::pair<Interval, size_t>>& kernels, const IntervalSet& compute,
                      std::vector<CollectiveGroup>& groups) {
  struct Edge {
    int64_t t;
    int delta;
    size_t group;
  };
  std::vector<Edge> edges;
  edges.reserve(kernels.size() * 2);
  for (const auto& [time, g] : kernels) {
    edges.push_back({time.begin, +1, g});
    edges.push_back({time.end, -1, g});
  }
  std::sort(edges.begin(), edges.end(), [](const Edge& a, const Edge& b) { return a.t < b.t; });
  std::vector<uint32_t> running(groups.size(), 0);
  std::set<size_t> active;  // groups with a kernel running
  int64_t previous = 0;
  for (size_t i = 0; i < edges.size();) {
    const int64_t t = edges[i].t;
    if (!active.empty() && t > previous)
      groups[*active.begin()].data_ns += compute.uncovered_length({previous, t});
    for (; i < edges.size() && edges[i].t == t; ++i) {
      const size_t g = edges[i].group;
      if (edges[i].delta > 0) {
        if (running[g]++ == 0) active.insert(g);
      } else if (--running[g] == 0) {
        active.erase(g);
      }
    }
    previous = t;
  }
}
}  // namespace

uint32_t NameTable::intern(std::string_view name) {
  if (auto it = ids_.find(name); it != ids_.end()) return it->second;
  const uint32_t id = static_cast<uint32_t>(names_.size());
  const std::string& stored = names_.emplace_back(name);
  ids_.emplace(std::string_view(stored), id);
  return id;
}

std::string_view NameTable::name(uint32_t id) const {
  return id < names_.size() ? std::string_view(names_[id]) : std::string_view();
}

StepReport compute_step(const StepInput& in, StepTimeline* timeline) {
  const Interval window = in.window.time;
  StepReport r;
  r.rank = in.rank;
  r.step = in.window.step;
  r.begin_ns = window.begin;
  r.end_ns = window.end;
  r.step_ms = to_ms(window.length());

  // A shim call's span is whole only with all its activities, those outside the window included:
  // its mark may lie in an earlier window than its kernels.
  std::unordered_map<uint64_t, size_t> group_of_seq;
  std::vector<CollectiveGroup> groups;
  for (const Activity& a : in.activities) {
    if (a.call_seq == 0 || (a.cls != ActivityClass::communication && a.cls != ActivityClass::call_mark)) continue;
    auto [it, inserted] = group_of_seq.emplace(a.call_seq, groups.size());
    if (inserted) groups.push_back({.seq = a.call_seq});
    widen(groups[it->second].span, a.time);
  }

  std::vector<Interval> compute, memory;
  std::vector<std::pair<Interval, size_t>> comm;  // clipped communication kernels and their group
  for (const Activity& a : in.activities) {
    const Interval inside = clip(a.time, window);
    switch (a.cls) {
      case ActivityClass::compute:
        if (inside.empty()) break;
        compute.push_back(inside);
        ++r.compute_kernels;
        break;
      case ActivityClass::memory:
        if (inside.empty()) break;
        memory.push_back(inside);
        ++r.memory_ops;
        break;
      case ActivityClass::call_mark:
        // Only its start matters, through its call's span; a mark without a call is ignored.
        if (a.call_seq != 0) {
          CollectiveGroup& g = groups[group_of_seq.at(a.call_seq)];
          if (!g.first) g.first = &a;
        }
        break;
      case ActivityClass::communication: {
        // One shim call = one collective, whatever kernels it launched (codec + NCCL). Without the
        // shim every communication kernel is its own collective.
        size_t g;
        if (a.call_seq != 0) {
          g = group_of_seq.at(a.call_seq);
        } else {
          if (inside.empty()) break;
          g = groups.size();
          groups.push_back({.span = a.time});
        }
        CollectiveGroup& group = groups[g];
        if (!group.first || group.first->cls == ActivityClass::call_mark || a.time.begin < group.first->time.begin)
          group.first = &a;
        if (inside.empty()) break;  // a kernel of a call whose span reaches into the window
        comm.emplace_back(inside, g);
        ++group.kernels;
        ++r.comm_kernels;
        break;
      }
    }
  }
  // The collectives with time in this window, by span start: the order exposed time is handed out in.
  std::vector<size_t> order;
  for (size_t g = 0; g < groups.size(); ++g)
    if (!clip(groups[g].span, window).empty()) order.push_back(g);
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    const CollectiveGroup &x = groups[a], &y = groups[b];
    return x.span.begin != y.span.begin ? x.span.begin < y.span.begin : x.seq < y.seq;
  });
  std::vector<size_t> position(groups.size());
  std::vector<CollectiveGroup> sorted;
  sorted.reserve(order.size());
  for (size_t g : order) {
    position[g] = sorted.size();
    sorted.push_back(groups[g]);
  }
  groups = std::move(sorted);
  std::vector<Interval> kernel_times, spans;
  kernel_times.reserve(comm.size());
  for (auto& [time, g] : comm) {
    g = position[g];  // a kernel inside the window keeps its group's span inside it too
    kernel_times.push_back(time);
  }
  spans.reserve(groups.size());
  for (const CollectiveGroup& g : groups) spans.push_back(clip(g.span, window));

  const IntervalSet c = IntervalSet::from(std::move(compute));
  const IntervalSet k = IntervalSet::from(std::move(kernel_times));
  const IntervalSet m = k.unite(IntervalSet::from(std::span<const Interval>(spans)));
  const IntervalSet y = IntervalSet::from(std::move(memory));
  const IntervalSet exposed_comm = m.minus(c);
  const IntervalSet kc = k.unite(c);
  const IntervalSet exposed_wait = m.minus(kc);
  const IntervalSet exposed_memcpy = y.minus(c.unite(m));
  const int64_t comm_ns = m.measure();
  const int64_t overlap_ns = m.intersect(c).measure();

  r.compute_ms = to_ms(c.measure());
  r.comm_ms = to_ms(comm_ns);
  r.exposed_comm_ms = to_ms(exposed_comm.measure());
  r.exposed_wait_ms = to_ms(exposed_wait.measure());
  r.exposed_data_ms = to_ms(exposed_comm.measure() - exposed_wait.measure());
  r.exposed_memcpy_ms = to_ms(exposed_memcpy.measure());
  // Computed from integer nanoseconds so the four parts add up exactly.
  r.idle_ms = to_ms(window.length() - c.measure() - exposed_comm.measure() - exposed_memcpy.measure());
  r.overlap_pct = comm_ns > 0 ? 100.0 * static_cast<double>(overlap_ns) / static_cast<double>(comm_ns) : 100.0;

  // Exposed wait: the part of S_k no earlier-starting span covered (earlier spans all begin at or
  // before S_k, so what they cover of it is one piece from its start), minus kernels and compute.
  int64_t covered_until = std::numeric_limits<int64_t>::min();
  for (size_t g = 0; g < groups.size(); ++g) {
    const Interval own{std::max(spans[g].begin, covered_until), spans[g].end};
    groups[g].wait_ns = kc.uncovered_length(own);
    covered_until = std::max(covered_until, spans[g].end);
  }
  own_exposed_data(comm, c, groups);

  std::unordered_map<uint64_t, const CallInfo*> call_of_seq;
  for (const CallInfo& call : in.calls) {
    call_of_seq.emplace(call.seq, &call);
    if (call.issue_ns >= window.begin && call.issue_ns < window.end) {
      r.app_bytes += call.app_bytes;
      r.wire_bytes += call.wire_bytes;
      r.plain_wire_bytes += call.plain_wire_bytes;
    }
  }

  const NameTable* names = in.names;
  auto name_of = [names](uint32_t id) -> std::string {
    return names ? std::string(names->name(id)) : std::string();
  };
  std::vector<CollectiveReport> collectives;
  collectives.reserve(groups.size());
  for (size_t g = 0; g < groups.size(); ++g) {
    const CollectiveGroup& group = groups[g];
    CollectiveReport cr;
    cr.seq = group.seq;
    cr.ordinal = static_cast<uint32_t>(g);
    cr.kernel = name_of(group.first->name);
    cr.range = name_of(group.first->range);
    cr.kernels = group.kernels;
    cr.begin_ns = group.span.begin;
    cr.duration_ms = to_ms(spans[g].length());
    cr.exposed_data_ms = to_ms(group.data_ns);
    cr.exposed_wait_ms = to_ms(group.wait_ns);
    cr.exposed_ms = to_ms(group.data_ns + group.wait_ns);
    if (auto it = call_of_seq.find(group.seq); group.seq != 0 && it != call_of_seq.end()) {
      const CallInfo& call = *it->second;
      cr.name = name_of(call.kind);
      cr.dtype = name_of(call.dtype);
      cr.path = name_of(call.path);
      cr.transport = name_of(call.transport);
      if (call.range != kNoName) cr.range = name_of(call.range);
      cr.app_bytes = call.app_bytes;
      cr.wire_bytes = call.wire_bytes;
      cr.plain_wire_bytes = call.plain_wire_bytes;
    } else {
      const std::string_view collective = nccl_collective_of(cr.kernel);
      cr.name = collective.empty() ? cr.kernel : std::string(collective);
    }
    collectives.push_back(std::move(cr));
  }
  r.calls = collectives.size();
  const size_t top = std::min(in.top_n, collectives.size());
  std::partial_sort(collectives.begin(), collectives.begin() + static_cast<std::ptrdiff_t>(top),
                    collectives.end(), [](const CollectiveReport& a, const CollectiveReport& b) {
                      if (a.exposed_ms != b.exposed_ms) return a.exposed_ms > b.exposed_ms;
                      return a.ordinal < b.ordinal;
                    });
  collectives.resize(top);
  r.top = std::move(collectives);

  if (timeline) {
    timeline->compute = c;
    timeline->comm = m;
    timeline->exposed_comm = exposed_comm;
    timeline->exposed_wait = exposed_wait;
    timeline->exposed_memcpy = exposed_memcpy;
  }
  return r;
}

std::vector<StepReport> compute_steps(std::span<const StepWindow> windows, std::span<const Activity> activities,
                                      std::span<const CallInfo> calls, const NameTable* names, size_t top_n,
                                      int rank) {
  // Windows by start; the running maximum of their ends is monotone, so "the first window that
  // could still contain time t" is a binary search even when windows overlap or nest.
  std::vector<size_t> by_begin(windows.size());
  for (size_t i = 0; i < by_begin.size(); ++i) by_begin[i] = i;
  std::stable_sort(by_begin.begin(), by_begin.end(),
                   [&](size_t a, size_t b) { return windows[a].time.begin < windows[b].time.begin; });
  std::vector<int64_t> begins(windows.size()), max_end(windows.size());
  int64_t running = std::numeric_limits<int64_t>::min();
  for (size_t k = 0; k < by_begin.size(); ++k) {
    const Interval w = windows[by_begin[k]].time;
    begins[k] = w.begin;
    running = std::max(running, w.end);
    max_end[k] = running;
  }
  // A shim call's activities belong to every window its span overlaps (compute_step needs them all).
  std::unordered_map<uint64_t, Interval> span_of_seq;
  for (const Activity& a : activities)
    if (a.call_seq != 0 && (a.cls == ActivityClass::communication || a.cls == ActivityClass::call_mark)) {
      auto [it, inserted] = span_of_seq.try_emplace(a.call_seq, a.time);
      if (!inserted) widen(it->second, a.time);
    }
  std::vector<std::vector<uint32_t>> members(windows.size());
  for (size_t i = 0; i < activities.size(); ++i) {
    const Activity& a = activities[i];
    const bool in_call = a.call_seq != 0 && (a.cls == ActivityClass::communication || a.cls == ActivityClass::call_mark);
    const Interval t = in_call ? span_of_seq.at(a.call_seq) : a.time;
    if (t.empty()) continue;  // contributes to no window (compute_step clips it away)
    const size_t hi = static_cast<size_t>(std::lower_bound(begins.begin(), begins.end(), t.end) - begins.begin());
    size_t k = static_cast<size_t>(std::upper_bound(max_end.begin(), max_end.end(), t.begin) - max_end.begin());
    for (; k < hi; ++k) {
      const Interval w = windows[by_begin[k]].time;
      if (w.end > t.begin && w.begin < t.end) members[by_begin[k]].push_back(static_cast<uint32_t>(i));
    }
  }
  std::vector<StepReport> out;
  out.reserve(windows.size());
  std::vector<Activity> inside;
  for (size_t w = 0; w < windows.size(); ++w) {
    inside.clear();
    for (uint32_t i : members[w]) inside.push_back(activities[i]);
    std::vector<uint32_t>().swap(members[w]);
    StepInput input;
    input.window = windows[w];
    input.activities = inside;
    input.calls = calls;
    input.names = names;
    input.top_n = top_n;
    input.rank = rank;
    out.push_back(compute_step(input));
  }
  return out;
}

Collector::Collector(CollectorOptions options) : options_(options) {
  // Preallocated once, so the steady state never grows these vectors.
  activities_.reserve(options_.max_activities);
  calls_.reserve(options_.max_calls);
}

void Collector::add_activity(const Activity& a) {
  if (any_step_ && a.time.end <= reported_until_) {
    ++counters_.late_activities;
    return;
  }
  if (activities_.size() >= options_.max_activities) {
    ++counters_.dropped_activities;
    return;
  }
  counters_.call_marks += a.cls == ActivityClass::call_mark;
  activities_.push_back(a);
}

void Collector::add_call(const CallInfo& c) {
  if (calls_.size() >= options_.max_calls) {
    ++counters_.dropped_calls;
    return;
  }
  calls_.push_back(c);
}

void Collector::add_external(uint32_t correlation, uint64_t call_seq, uint64_t range_hash) {
  if (correlation == 0) return;
  ++counters_.external_records;
  if (externals_.size() >= options_.max_externals) {
    // Entries stay after they are claimed (a graph launch's kernels share one id) and the kernel
    // record may come before or after its launch's, so the table is bounded by age instead:
    // forget the older half by correlation id (CUPTI numbers API calls in order).
    const uint32_t half = static_cast<uint32_t>(options_.max_externals / 2);
    const uint32_t horizon = newest_correlation_ > half ? newest_correlation_ - half : 0;
    const size_t before = externals_.size();
    std::erase_if(externals_, [horizon](const auto& kv) { return kv.first < horizon; });
    counters_.dropped_externals += before - externals_.size();
    if (externals_.size() >= options_.max_externals) {  // ids out of order: drop everything
      counters_.dropped_externals += externals_.size();
      externals_.clear();
    }
  }
  External& e = externals_[correlation];
  if (call_seq) e.call_seq = call_seq;
  if (range_hash) e.range_hash = range_hash;
  newest_correlation_ = std::max(newest_correlation_, correlation);
}

void Collector::name_range(uint64_t range_hash, std::string_view name) {
  if (range_hash) range_names_.try_emplace(range_hash, names_.intern(name));
}

uint32_t Collector::range_name(uint64_t range_hash) const {
  const auto it = range_names_.find(range_hash);
  return it == range_names_.end() ? kNoName : it->second;
}

void Collector::resolve_externals() {
  for (Activity& a : activities_) {
    if (a.correlation == 0) continue;
    const auto it = externals_.find(a.correlation);
    if (it == externals_.end()) continue;  // maybe later: its record may still be on the way
    if (a.call_seq == 0) a.call_seq = it->second.call_seq;
    if (a.range == kNoName && it->second.range_hash != 0) {
      const auto name = range_names_.find(it->second.range_hash);
      if (name == range_names_.end()) continue;  // the name is posted before the launch; retry later
      a.range = name->second;
    }
    a.correlation = 0;  // resolved
    ++counters_.joined_activities;
  }
}

void Collector::step_begin(int64_t step, int64_t t) {
  if (open_step_) {
    ++counters_.nested_step_begins;
    return;
  }
  open_step_ = StepWindow{step, {t, t}};
  any_step_ = true;
}

void Collector::step_end(int64_t step, int64_t t) {
  if (!open_step_ || (step >= 0 && step != open_step_->step)) {
    ++counters_.unmatched_step_ends;
    return;
  }
  open_step_->time.end = std::max(t, open_step_->time.begin);
  closed_steps_.push_back(*open_step_);
  open_step_.reset();
}

std::vector<Collector::Finalized> Collector::finalize(int64_t now, bool everything) {
  if (everything && !any_step_) {
    if (activities_.empty()) return {};
    Interval whole{std::numeric_limits<int64_t>::max(), std::numeric_limits<int64_t>::min()};
    for (const Activity& a : activities_) {
      whole.begin = std::min(whole.begin, a.time.begin);
      whole.end = std::max(whole.end, a.time.end);
    }
    closed_steps_.push_back({-1, whole});
    any_step_ = true;
  }
  if (everything && open_step_) {
    // The job ended inside a step: report it up to its last recorded activity.
    int64_t last = open_step_->time.begin;
    for (const Activity& a : activities_) last = std::max(last, a.time.end);
    open_step_->time.end = last;
    closed_steps_.push_back(*open_step_);
    open_step_.reset();
  }

  size_t ready = 0;
  while (ready < closed_steps_.size() &&
         (everything || closed_steps_[ready].time.end + options_.settle_ns <= now))
    ++ready;
  return report_first(ready);
}

std::vector<Collector::Finalized> Collector::finalize_closed() { return report_first(closed_steps_.size()); }

std::vector<Collector::Finalized> Collector::report_first(size_t ready) {
  std::vector<Finalized> out;
  if (ready == 0) return out;
  resolve_externals();
  for (size_t i = 0; i < ready; ++i) {
    StepInput input;
    input.window = closed_steps_[i];
    input.activities = activities_;
    input.calls = calls_;
    input.names = &names_;
    input.top_n = options_.top_n;
    input.rank = options_.rank;
    Finalized f;
    f.report = compute_step(input, &f.timeline);
    out.push_back(std::move(f));
    reported_until_ = std::max(reported_until_, closed_steps_[i].time.end);
    ++counters_.steps_reported;
  }
  closed_steps_.erase(closed_steps_.begin(), closed_steps_.begin() + static_cast<std::ptrdiff_t>(ready));

  if (ready > 0) {
    // Records that end before every unreported step begins can no longer matter.
    int64_t watermark = reported_until_;
    if (!closed_steps_.empty()) watermark = std::min(watermark, closed_steps_.front().time.begin);
    if (open_step_) watermark = std::min(watermark, open_step_->time.begin);
    // A call reaching past the watermark keeps all its records: its span starts at its earliest.
    std::unordered_set<uint64_t> open_calls;
    for (const Activity& a : activities_)
      if (a.call_seq != 0 && a.time.end > watermark) open_calls.insert(a.call_seq);
    std::erase_if(activities_, [this, watermark, &open_calls](const Activity& a) {
      if (a.time.end > watermark || (a.call_seq != 0 && open_calls.contains(a.call_seq))) return false;
      // Kernels launched outside any NVTX range or shim call have no external ids: expected.
      if (a.correlation != 0) ++counters_.unjoined_activities;
      return true;
    });
    std::erase_if(calls_, [watermark](const CallInfo& c) { return c.issue_ns < watermark; });
  }
  return out;
}

}  // namespace fp8wire::prof
