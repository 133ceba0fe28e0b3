#include "bench/host/units.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <limits>

#include <fmt/format.h>

namespace fp8wire::bench {

namespace {
std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}
}  // namespace

std::optional<uint64_t> parse_bytes(std::string_view text) {
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.front()))) text.remove_prefix(1);
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) text.remove_suffix(1);
  size_t digits_end = 0;
  bool seen_dot = false, seen_digit = false;
  while (digits_end < text.size()) {
    const char c = text[digits_end];
    if (std::isdigit(static_cast<unsigned char>(c))) {
      seen_digit = true;
    } else if (c == '.' && !seen_dot) {
      seen_dot = true;
    } else {
      break;
    }
    ++digits_end;
  }
  if (!seen_digit) return std::nullopt;
  std::string unit = lower(text.substr(digits_end));
  while (!unit.empty() && unit.front() == ' ') unit.erase(unit.begin());
  uint64_t multiplier = 0;
  if (unit.empty() || unit == "b") multiplier = 1;
  else if (unit == "k" || unit == "kib") multiplier = 1ull << 10;
  else if (unit == "m" || unit == "mib") multiplier = 1ull << 20;
  else if (unit == "g" || unit == "gib") multiplier = 1ull << 30;
  else if (unit == "t" || unit == "tib") multiplier = 1ull << 40;
  else return std::nullopt;

  const std::string number(text.substr(0, digits_end));
  // long double holds every integer below 2^64 exactly, so "1GiB" etc. stay exact.
  long double value = 0;
  try {
    value = std::stold(number);
  } catch (...) {
    return std::nullopt;
  }
  const long double bytes = value * static_cast<long double>(multiplier);
  if (bytes >= static_cast<long double>(std::numeric_limits<uint64_t>::max())) return std::nullopt;
  if (bytes != std::floor(bytes)) return std::nullopt;  // "1.3B" or "0.1KiB": not a whole byte count
  return static_cast<uint64_t>(bytes);
}

std::string format_bytes(uint64_t bytes) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int unit = 0;
  while (unit < 4 && bytes >= (1ull << (10 * (unit + 1)))) ++unit;
  if (unit == 0) return fmt::format("{} B", bytes);
  const uint64_t base = 1ull << (10 * unit);
  if (bytes % base == 0) return fmt::format("{} {}", bytes / base, kUnits[unit]);
  return fmt::format("{:.1f} {}", static_cast<double>(bytes) / static_cast<double>(base), kUnits[unit]);
}

std::vector<uint64_t> size_series(uint64_t min_bytes, uint64_t max_bytes, double step, uint64_t granule) {
  std::vector<uint64_t> out;
  if (step <= 1.0 || min_bytes == 0 || max_bytes < min_bytes || granule == 0) return out;
  // Multiplying a long double accumulator avoids drift over ~20 steps; the small epsilon keeps
  // max_bytes itself in the series when the steps land on it exactly.
  for (long double s = min_bytes; s <= static_cast<long double>(max_bytes) * (1 + 1e-12L); s *= step) {
    const uint64_t rounded = static_cast<uint64_t>(s) / granule * granule;
    if (rounded == 0) continue;
    if (!out.empty() && out.back() == rounded) continue;
    out.push_back(rounded);
  }
  return out;
}

const char* to_string(DType t) {
  switch (t) {
    case DType::bf16: return "bf16";
    case DType::f16: return "fp16";
    case DType::f32: return "fp32";
  }
  return "?";
}

std::optional<DType> parse_dtype(std::string_view text) {
  const std::string s = lower(text);
  if (s == "bf16" || s == "bfloat16") return DType::bf16;
  if (s == "fp16" || s == "f16" || s == "half" || s == "float16") return DType::f16;
  if (s == "fp32" || s == "f32" || s == "float" || s == "float32") return DType::f32;
  return std::nullopt;
}

std::optional<Collective> parse_collective(std::string_view text) {
  const std::string s = lower(text);
  if (s == "all_reduce" || s == "allreduce" || s == "ar") return Collective::all_reduce;
  if (s == "reduce_scatter" || s == "reducescatter" || s == "rs") return Collective::reduce_scatter;
  if (s == "all_gather" || s == "allgather" || s == "ag") return Collective::all_gather;
  if (s == "all_to_all" || s == "alltoall" || s == "a2a") return Collective::all_to_all;
  if (s == "send_recv" || s == "sendrecv" || s == "p2p") return Collective::send_recv;
  return std::nullopt;
}

std::optional<Fabric> parse_fabric(std::string_view text) {
  const std::string s = lower(text);
  if (s == "nvlink") return Fabric::nvlink;
  if (s == "pcie") return Fabric::pcie;
  if (s == "net") return Fabric::net;
  return std::nullopt;
}

double busbw_factor(Collective c, int nranks) {
  if (nranks <= 1) return 0.0;  // nothing crosses a link
  const double n = nranks;
  if (c == Collective::send_recv) return 1.0;  // sendrecv_perf: each rank's message crosses whole
  return c == Collective::all_reduce ? 2.0 * (n - 1) / n : (n - 1) / n;  // alltoall_perf: (n-1)/n too
}

double algbw_gbps(uint64_t bytes, double time_us) {
  return time_us > 0 ? static_cast<double>(bytes) / (time_us * 1e3) : 0.0;
}

CallCounts call_counts(Collective c, uint64_t full_bytes, DType t, int nranks) {
  const uint64_t total = full_bytes / dtype_size(t);
  const uint64_t per_rank = nranks > 0 ? total / static_cast<uint64_t>(nranks) : 0;
  switch (c) {
    case Collective::all_reduce: return {total, total, total};
    case Collective::reduce_scatter: return {per_rank * nranks, per_rank, per_rank};
    case Collective::all_gather: return {per_rank, per_rank * nranks, per_rank};
    // The send buffer, as alltoall_perf reports it: per_rank elements to and from every rank.
    case Collective::all_to_all: return {per_rank * nranks, per_rank * nranks, per_rank};
    case Collective::send_recv: return {total, total, total};  // one message
  }
  return {0, 0, 0};
}

const char* collective_name(Collective c) { return to_string(c); }

const char* fabric_name(Fabric f) {
  switch (f) {
    case Fabric::nvlink: return "nvlink";
    case Fabric::pcie: return "pcie";
    case Fabric::net: return "net";
  }
  return "?";
}

const char* path_name(Path p) { return fp8wire::to_string(p); }

std::optional<Path> parse_path(std::string_view text) {
  const std::string s = lower(text);
  if (s == "passthrough" || s == "nccl" || s == "baseline") return Path::passthrough;
  if (s == "two_shot" || s == "twoshot" || s == "a2a") return Path::two_shot;
  if (s == "one_shot" || s == "oneshot") return Path::one_shot;
  if (s == "ring") return Path::ring;
  if (s == "hierarchical") return Path::hierarchical;
  return std::nullopt;
}

const char* gather_transport_name(GatherMethod t) {
  switch (t) {
    case GatherMethod::automatic: return "auto";
    case GatherMethod::allgather: return "allgather";
    case GatherMethod::sendrecv: return "sendrecv";
  }
  return "?";
}

std::optional<GatherMethod> parse_gather_transport(std::string_view text) {
  const std::string s = lower(text);
  if (s == "auto") return GatherMethod::automatic;
  if (s == "allgather") return GatherMethod::allgather;
  if (s == "sendrecv") return GatherMethod::sendrecv;
  return std::nullopt;
}

std::optional<std::vector<GatherMethod>> parse_gather_transport_option(std::string_view text) {
  if (lower(text) == "both") return std::vector{GatherMethod::allgather, GatherMethod::sendrecv};
  const auto one = parse_gather_transport(text);
  if (!one) return std::nullopt;
  if (*one == GatherMethod::automatic) return std::vector<GatherMethod>{};
  return std::vector{*one};
}

std::string gather_transport_option_name(const std::vector<GatherMethod>& transports) {
  if (transports.empty()) return "auto";
  if (transports.size() == 1) return gather_transport_name(transports.front());
  return "both";
}

std::vector<Path> paths_for(Collective c, const std::vector<Path>& requested) {
  std::vector<Path> out = {Path::passthrough};
  bool any_fp8 = false;
  for (Path p : requested) {
    if (p == Path::passthrough || p == Path::fallback) continue;
    any_fp8 = true;
    if (c == Collective::all_reduce && std::find(out.begin(), out.end(), p) == out.end()) out.push_back(p);
  }
  if (any_fp8 && c != Collective::all_reduce) out.push_back(only_fp8_path(c));
  return out;
}

std::vector<std::string> split_list(std::string_view text) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find(',', start);
    if (end == std::string_view::npos) end = text.size();
    std::string item(text.substr(start, end - start));
    item.erase(0, item.find_first_not_of(" \t"));
    item.erase(item.find_last_not_of(" \t") + 1);
    if (!item.empty()) out.push_back(item);
    start = end + 1;
  }
  return out;
}

}  // namespace fp8wire::bench
