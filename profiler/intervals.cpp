#include "profiler/intervals.hpp"

#include <algorithm>

namespace fp8wire::prof {

IntervalSet IntervalSet::from(std::span<const Interval> intervals) {
  IntervalSet set;
  set.assign(intervals);
  return set;
}

IntervalSet IntervalSet::from(std::vector<Interval>&& intervals) {
  IntervalSet set;
  set.parts_ = std::move(intervals);
  set.normalize();
  return set;
}

void IntervalSet::assign(std::span<const Interval> intervals) {
  parts_.assign(intervals.begin(), intervals.end());
  normalize();
}

void IntervalSet::normalize() {
  std::erase_if(parts_, [](const Interval& i) { return i.empty(); });
  std::sort(parts_.begin(), parts_.end(),
            [](const Interval& a, const Interval& b) { return a.begin < b.begin; });
  size_t out = 0;
  for (size_t i = 0; i < parts_.size(); ++i) {
    // Touching intervals merge too, so the representation of a set is unique (operator== works).
    if (out > 0 && parts_[i].begin <= parts_[out - 1].end) {
      parts_[out - 1].end = std::max(parts_[out - 1].end, parts_[i].end);
    } else {
      parts_[out++] = parts_[i];
    }
  }
  parts_.resize(out);
}

int64_t IntervalSet::measure() const {
  int64_t total = 0;
  for (const Interval& i : parts_) total += i.length();
  return total;
}

IntervalSet IntervalSet::unite(const IntervalSet& other) const {
  std::vector<Interval> all;
  all.reserve(parts_.size() + other.parts_.size());
  all.insert(all.end(), parts_.begin(), parts_.end());
  all.insert(all.end(), other.parts_.begin(), other.parts_.end());
  return from(std::move(all));
}

IntervalSet IntervalSet::intersect(const IntervalSet& other) const {
  IntervalSet result;
  size_t i = 0, j = 0;
  while (i < parts_.size() && j < other.parts_.size()) {
    const Interval& a = parts_[i];
    const Interval& b = other.parts_[j];
    const Interval overlap{std::max(a.begin, b.begin), std::min(a.end, b.end)};
    if (!overlap.empty()) result.parts_.push_back(overlap);
    // Advance whichever ends first; the other may still overlap the next part.
    if (a.end < b.end) ++i; else ++j;
  }
  return result;  // already sorted and disjoint; parts from one pair never touch another's
}

IntervalSet IntervalSet::minus(const IntervalSet& other) const {
  IntervalSet result;
  size_t j = 0;
  for (const Interval& a : parts_) {
    int64_t cursor = a.begin;
    // Skip holes that end before this part starts; they cannot affect later parts either.
    while (j < other.parts_.size() && other.parts_[j].end <= a.begin) ++j;
    size_t k = j;
    while (k < other.parts_.size() && other.parts_[k].begin < a.end) {
      const Interval& hole = other.parts_[k];
      if (hole.begin > cursor) result.parts_.push_back({cursor, hole.begin});
      cursor = std::max(cursor, hole.end);
      ++k;
    }
    if (cursor < a.end) result.parts_.push_back({cursor, a.end});
  }
  return result;
}

IntervalSet IntervalSet::clip(Interval window) const {
  IntervalSet result;
  for (const Interval& a : parts_) {
    const Interval c{std::max(a.begin, window.begin), std::min(a.end, window.end)};
    if (!c.empty()) result.parts_.push_back(c);
  }
  return result;
}

int64_t IntervalSet::covered_length(Interval interval) const {
  if (interval.empty()) return 0;
  // First part that ends after the interval begins.
  auto it = std::upper_bound(parts_.begin(), parts_.end(), interval.begin,
                             [](int64_t t, const Interval& p) { return t < p.end; });
  int64_t covered = 0;
  for (; it != parts_.end() && it->begin < interval.end; ++it)
    covered += Interval{std::max(it->begin, interval.begin), std::min(it->end, interval.end)}.length();
  return covered;
}

int64_t IntervalSet::uncovered_length(Interval interval) const {
  return interval.length() - covered_length(interval);
}

}  // namespace fp8wire::prof
