#include "profiler/classify.hpp"

#include <algorithm>
#include <array>
#include <cctype>

namespace fp8wire::prof {

namespace {
char lower(char c) { return static_cast<char>(std::tolower(static_cast<unsigned char>(c))); }

bool contains_ignore_case(std::string_view haystack, std::string_view lower_needle) {
  if (lower_needle.empty() || lower_needle.size() > haystack.size()) return false;
  return std::search(haystack.begin(), haystack.end(), lower_needle.begin(), lower_needle.end(),
                     [](char h, char n) { return lower(h) == n; }) != haystack.end();
}
}  // namespace

const char* to_string(ActivityClass c) {
  switch (c) {
    case ActivityClass::compute: return "compute";
    case ActivityClass::communication: return "communication";
    case ActivityClass::memory: return "memory";
    case ActivityClass::call_mark: return "call_mark";
  }
  return "?";
}

KernelClassifier::KernelClassifier(std::string_view extra_patterns) {
  patterns_ = {"nccl", "fp8wire"};
  size_t start = 0;
  while (start <= extra_patterns.size()) {
    size_t bar = extra_patterns.find('|', start);
    if (bar == std::string_view::npos) bar = extra_patterns.size();
    // Surrounding blanks are trimmed: a pattern of spaces would match most demangled names.
    std::string_view raw = extra_patterns.substr(start, bar - start);
    while (!raw.empty() && std::isspace(static_cast<unsigned char>(raw.front()))) raw.remove_prefix(1);
    while (!raw.empty() && std::isspace(static_cast<unsigned char>(raw.back()))) raw.remove_suffix(1);
    std::string piece(raw);
    std::transform(piece.begin(), piece.end(), piece.begin(), lower);
    if (!piece.empty()) patterns_.push_back(std::move(piece));
    start = bar + 1;
  }
}

ActivityClass KernelClassifier::classify_kernel(std::string_view kernel_name) const {
  if (contains_ignore_case(kernel_name, kCallMarkKernel) && contains_ignore_case(kernel_name, "fp8wire"))
    return ActivityClass::call_mark;
  for (const std::string& p : patterns_)
    if (contains_ignore_case(kernel_name, p)) return ActivityClass::communication;
  return ActivityClass::compute;
}

std::string_view nccl_collective_of(std::string_view kernel_name) {
  // Longest names first so "ReduceScatter" is not reported as "Reduce".
  static constexpr std::array<std::string_view, 8> kCollectives = {
      "ReduceScatter", "AllReduce", "AllGather", "AllToAll", "Broadcast", "SendRecv", "Reduce", "Send"};
  if (!contains_ignore_case(kernel_name, "nccl")) return {};
  for (std::string_view c : kCollectives)
    if (kernel_name.find(c) != std::string_view::npos) return c;
  return {};
}

}  // namespace fp8wire::prof
