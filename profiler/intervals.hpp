// Interval arithmetic on one timeline (nanoseconds), the ground every exposure figure stands on
// (docs/DESIGN.md "Exposed communication"): unions of kernel intervals, differences (comm not covered by
// compute), intersections with a step window. Intervals are half-open [begin, end), so two kernels
// that touch end-to-start neither overlap nor leave a gap.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace fp8wire::prof {

struct Interval {
  int64_t begin = 0;
  int64_t end = 0;  // exclusive; an interval with end <= begin is empty
  int64_t length() const { return end > begin ? end - begin : 0; }
  bool empty() const { return end <= begin; }
  friend bool operator==(const Interval&, const Interval&) = default;
};

// A set of points on the timeline, kept as sorted, disjoint, non-touching, non-empty intervals.
class IntervalSet {
 public:
  IntervalSet() = default;
  // Any order, overlaps and empty intervals allowed; they are merged.
  static IntervalSet from(std::span<const Interval> intervals);
  static IntervalSet from(std::vector<Interval>&& intervals);

  // Replaces the contents with the union of `intervals`, reusing this set's storage (no allocation
  // once the set has grown to the largest input it has seen).
  void assign(std::span<const Interval> intervals);

  const std::vector<Interval>& intervals() const { return parts_; }
  bool empty() const { return parts_.empty(); }
  int64_t measure() const;  // total covered length

  IntervalSet unite(const IntervalSet& other) const;
  IntervalSet intersect(const IntervalSet& other) const;
  IntervalSet minus(const IntervalSet& other) const;
  IntervalSet clip(Interval window) const;

  // |interval \ this| without building a set: the part of `interval` this set does not cover.
  int64_t uncovered_length(Interval interval) const;
  // |interval ∩ this|.
  int64_t covered_length(Interval interval) const;

  friend bool operator==(const IntervalSet&, const IntervalSet&) = default;

 private:
  void normalize();  // sorts and merges parts_ in place
  std::vector<Interval> parts_;
};

}  // namespace fp8wire::prof
