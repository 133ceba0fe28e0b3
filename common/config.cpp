// Configuration: one descriptor per key. Every source (TOML file, environment) is read
// by walking the same table, so a key cannot be known to one source and missing from another, and
// to_toml() prints exactly the keys the parser accepts.
#include "common/config.hpp"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <string_view>

#include <fmt/format.h>

#include "common/commands.hpp"
#include "common/toml.hpp"
#include "common/toml_guard.hpp"

extern char** environ;

namespace fp8wire {

const char* to_string(Fp8Format v) {
  switch (v) {
    case Fp8Format::e4m3: return "e4m3";
    case Fp8Format::e5m2: return "e5m2";
  }
  return "?";
}
const char* to_string(ScaleType v) {
  switch (v) {
    case ScaleType::fp32: return "fp32";
    case ScaleType::bf16: return "bf16";
    case ScaleType::e8m0: return "e8m0";
  }
  return "?";
}
const char* to_string(Rounding v) {
  switch (v) {
    case Rounding::nearest: return "nearest";
    case Rounding::stochastic: return "stochastic";
  }
  return "?";
}
// "auto" rather than "automatic": the string is what a config file says, so it must parse back.
const char* to_string(ConvertPath v) {
  switch (v) {
    case ConvertPath::automatic: return "auto";
    case ConvertPath::native: return "native";
    case ConvertPath::software: return "software";
  }
  return "?";
}
const char* to_string(Algorithm v) {
  switch (v) {
    case Algorithm::automatic: return "auto";
    case Algorithm::two_shot: return "two_shot";
    case Algorithm::one_shot: return "one_shot";
    case Algorithm::ring: return "ring";
  }
  return "?";
}
const char* to_string(GatherMethod v) {
  switch (v) {
    case GatherMethod::automatic: return "auto";
    case GatherMethod::allgather: return "allgather";
    case GatherMethod::sendrecv: return "sendrecv";
  }
  return "?";
}
const char* to_string(DirectMode v) {
  switch (v) {
    case DirectMode::off: return "off";
    case DirectMode::automatic: return "auto";
    case DirectMode::peer_memory: return "peer_memory";
    case DirectMode::host_memory: return "host_memory";
  }
  return "?";
}
const char* to_string(DirectProtocol v) {
  switch (v) {
    case DirectProtocol::automatic: return "auto";
    case DirectProtocol::kernels: return "kernels";
    case DirectProtocol::copy_engine: return "copy_engine";
  }
  return "?";
}
const char* to_string(Fabric v) {
  switch (v) {
    case Fabric::nvlink: return "nvlink";
    case Fabric::pcie: return "pcie";
    case Fabric::net: return "net";
  }
  return "?";
}
const char* to_string(Collective v) {
  switch (v) {
    case Collective::all_reduce: return "all_reduce";
    case Collective::reduce_scatter: return "reduce_scatter";
    case Collective::all_gather: return "all_gather";
    case Collective::all_to_all: return "all_to_all";
    case Collective::send_recv: return "send_recv";
  }
  return "?";
}

std::string ConfigError::message() const {
  if (key.empty()) return fmt::format("{}: '{}': expected {}", source, value, expected);
  return fmt::format("{}: {} = '{}': expected {}", source, key, value, expected);
}

// ------------------------------------------------------------------------------------------------
// Sizes
// ------------------------------------------------------------------------------------------------

std::optional<uint64_t> parse_size(const std::string& text) {
  size_t pos = 0;
  while (pos < text.size() && std::isspace(static_cast<unsigned char>(text[pos]))) ++pos;
  const size_t digits_begin = pos;
  uint64_t number = 0;
  while (pos < text.size() && std::isdigit(static_cast<unsigned char>(text[pos]))) {
    const uint64_t digit = static_cast<uint64_t>(text[pos] - '0');
    if (number > (UINT64_MAX - digit) / 10) return std::nullopt;
    number = number * 10 + digit;
    ++pos;
  }
  if (pos == digits_begin) return std::nullopt;
  while (pos < text.size() && std::isspace(static_cast<unsigned char>(text[pos]))) ++pos;
  size_t end = text.size();
  while (end > pos && std::isspace(static_cast<unsigned char>(text[end - 1]))) --end;
  std::string suffix = text.substr(pos, end - pos);
  std::transform(suffix.begin(), suffix.end(), suffix.begin(),
                 [](unsigned char ch) { return static_cast<char>(std::tolower(ch)); });
  // Decimal units (KB, MB, GB) are refused rather than guessed: "64MB" could mean either.
  int shift = -1;
  if (suffix.empty() || suffix == "b") shift = 0;
  else if (suffix == "k" || suffix == "kib") shift = 10;
  else if (suffix == "m" || suffix == "mib") shift = 20;
  else if (suffix == "g" || suffix == "gib") shift = 30;
  else if (suffix == "t" || suffix == "tib") shift = 40;
  if (shift < 0) return std::nullopt;
  if (shift > 0 && number > (UINT64_MAX >> shift)) return std::nullopt;
  return number << shift;
}

std::string format_size(uint64_t bytes) {
  static constexpr std::pair<int, const char*> kUnits[] = {{40, "TiB"}, {30, "GiB"}, {20, "MiB"}, {10, "KiB"}};
  if (bytes == 0) return "0";
  for (const auto& [shift, name] : kUnits) {
    const uint64_t unit = 1ull << shift;
    if (bytes % unit == 0) return fmt::format("{}{}", bytes >> shift, name);
  }
  return std::to_string(bytes);
}

namespace {

// ------------------------------------------------------------------------------------------------
// A value as one source wrote it, before conversion to the field's type
// ------------------------------------------------------------------------------------------------

struct RawValue {
  // text: an environment variable or a TOML string; the others are TOML's own types.
  enum class Kind { text, integer, floating, boolean, array, other };
  Kind kind = Kind::text;
  std::string text;                // as written, for error messages
  int64_t integer = 0;
  double floating = 0;
  bool boolean = false;
  std::vector<std::string> items;  // arrays: the elements (all must be strings to be used)
  bool items_are_strings = true;
};

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char ch) { return static_cast<char>(std::tolower(ch)); });
  return s;
}

std::string trim(std::string_view s) {
  size_t b = 0, e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
  return std::string(s.substr(b, e - b));
}

std::optional<bool> as_bool(const RawValue& v) {
  switch (v.kind) {
    case RawValue::Kind::boolean: return v.boolean;
    case RawValue::Kind::integer:
      if (v.integer == 0 || v.integer == 1) return v.integer == 1;
      return std::nullopt;
    case RawValue::Kind::text: {
      const std::string t = lower(trim(v.text));
      if (t == "true" || t == "1" || t == "on" || t == "yes") return true;
      if (t == "false" || t == "0" || t == "off" || t == "no") return false;
      return std::nullopt;
    }
    default: return std::nullopt;
  }
}

// Plain unsigned integers: decimal, or hexadecimal with 0x (seeds are often written that way).
std::optional<uint64_t> parse_unsigned(const std::string& raw) {
  const std::string text = trim(raw);
  if (text.empty() || text[0] == '-' || text[0] == '+') return std::nullopt;
  const bool hex = text.size() > 2 && text[0] == '0' && (text[1] == 'x' || text[1] == 'X');
  errno = 0;
  char* end = nullptr;
  const unsigned long long value = std::strtoull(text.c_str(), &end, hex ? 16 : 10);
  if (errno != 0 || end == text.c_str() || *end != '\0') return std::nullopt;
  return static_cast<uint64_t>(value);
}

std::optional<uint64_t> as_unsigned(const RawValue& v) {
  if (v.kind == RawValue::Kind::integer) {
    if (v.integer < 0) return std::nullopt;
    return static_cast<uint64_t>(v.integer);
  }
  if (v.kind == RawValue::Kind::text) return parse_unsigned(v.text);
  return std::nullopt;
}

std::optional<uint64_t> as_size(const RawValue& v) {
  if (v.kind == RawValue::Kind::integer) {
    if (v.integer < 0) return std::nullopt;
    return static_cast<uint64_t>(v.integer);
  }
  if (v.kind == RawValue::Kind::text) return parse_size(v.text);
  return std::nullopt;
}

std::optional<double> as_double(const RawValue& v) {
  double d = 0;
  if (v.kind == RawValue::Kind::floating) {
    d = v.floating;
  } else if (v.kind == RawValue::Kind::integer) {
    d = static_cast<double>(v.integer);
  } else if (v.kind == RawValue::Kind::text) {
    const std::string text = trim(v.text);
    if (text.empty()) return std::nullopt;
    char* end = nullptr;
    errno = 0;
    d = std::strtod(text.c_str(), &end);
    if (errno != 0 || *end != '\0') return std::nullopt;
  } else {
    return std::nullopt;
  }
  if (!std::isfinite(d)) return std::nullopt;
  return d;
}

std::optional<std::string> as_string(const RawValue& v) {
  if (v.kind != RawValue::Kind::text) return std::nullopt;
  return v.text;
}

// A TOML array of strings, or (environment) a comma-separated list.
std::optional<std::vector<std::string>> as_string_list(const RawValue& v) {
  std::vector<std::string> out;
  if (v.kind == RawValue::Kind::array) {
    if (!v.items_are_strings) return std::nullopt;
    out = v.items;
  } else if (v.kind == RawValue::Kind::text) {
    std::string_view rest = v.text;
    if (trim(rest).empty()) return out;
    while (true) {
      const size_t comma = rest.find(',');
      out.push_back(trim(rest.substr(0, comma)));
      if (comma == std::string_view::npos) break;
      rest.remove_prefix(comma + 1);
    }
  } else {
    return std::nullopt;
  }
  for (const auto& item : out)
    if (item.empty()) return std::nullopt;
  return out;
}

std::string toml_quote(std::string_view s) {
  std::string out = "\"";
  for (const char ch : s) {
    switch (ch) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      case '\r': out += "\\r"; break;
      default:
        if (static_cast<unsigned char>(ch) < 0x20 || ch == 0x7f)
          out += fmt::format("\\u{:04X}", static_cast<unsigned>(static_cast<unsigned char>(ch)));
        else
          out += ch;
    }
  }
  return out + "\"";
}

// ------------------------------------------------------------------------------------------------
// Measured routes
// ------------------------------------------------------------------------------------------------

// An FP8 variant's name: the all-reduce's algorithm, or "fp8" for a collective with one FP8 path.
bool parse_variant(std::string_view name, Collective collective, Algorithm* algorithm) {
  if (collective != Collective::all_reduce) {
    *algorithm = Algorithm::automatic;
    return name == "fp8";
  }
  for (Algorithm a : {Algorithm::two_shot, Algorithm::one_shot, Algorithm::ring})
    if (name == to_string(a)) {
      *algorithm = a;
      return true;
    }
  return false;
}

}  // namespace

std::optional<MeasuredRoute> parse_measured_route(std::string_view text, Collective collective) {
  // "<ranks> ranks from <size>: <nccl | variant[/allgather|/sendrecv]>"
  MeasuredRoute r;
  const size_t colon = text.find(':');
  if (colon == std::string_view::npos) return std::nullopt;
  const std::string head = trim(text.substr(0, colon)), what = trim(text.substr(colon + 1));
  const size_t ranks_end = head.find(" ranks from ");
  if (ranks_end == std::string::npos) return std::nullopt;
  const auto ranks = parse_size(head.substr(0, ranks_end));
  const auto from = parse_size(head.substr(ranks_end + 12));
  if (!ranks || *ranks < 2 || *ranks > 65536 || !from) return std::nullopt;
  r.ranks = static_cast<uint32_t>(*ranks);
  r.from_bytes = *from;
  if (what == "nccl") return r;
  r.fp8 = true;
  const size_t slash = what.find('/');
  if (!parse_variant(std::string_view(what).substr(0, slash), collective, &r.algorithm)) return std::nullopt;
  if (slash == std::string::npos) return r;
  // Only where the path gathers (every FP8 all-reduce and the all-gather).
  if (collective != Collective::all_reduce && collective != Collective::all_gather) return std::nullopt;
  const std::string gather = what.substr(slash + 1);
  if (gather == "allgather") r.gather = GatherMethod::allgather;
  else if (gather == "sendrecv") r.gather = GatherMethod::sendrecv;
  else return std::nullopt;
  return r;
}

std::string to_string(const MeasuredRoute& r) {
  std::string what = !r.fp8                                 ? "nccl"
                     : r.algorithm == Algorithm::automatic ? "fp8"
                                                           : to_string(r.algorithm);
  if (r.fp8 && r.gather != GatherMethod::automatic) what += fmt::format("/{}", to_string(r.gather));
  return fmt::format("{} ranks from {}: {}", r.ranks, format_size(r.from_bytes), what);
}

namespace {

// ------------------------------------------------------------------------------------------------
// The key table
// ------------------------------------------------------------------------------------------------

struct KeySpec {
  std::string key;        // dotted TOML path
  std::string env;        // FP8WIRE_ + key upper-cased, '.' -> '_'
  std::string expected;   // for error messages and the to_toml comment
  // Converts and stores the value; false (config untouched) when it is not acceptable.
  std::function<bool(Config&, const RawValue&)> set;
  // The field as a TOML literal that `set` accepts back.
  std::function<std::string(const Config&)> get;
};

std::string env_name_for(const std::string& key) {
  std::string env = "FP8WIRE_";
  for (const char ch : key) env += ch == '.' ? '_' : static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  return env;
}

// `Ref` is a generic lambda returning a reference to the field, so one accessor serves both the
// setter (Config&) and the getter (const Config&).
template <class Ref>
KeySpec bool_key(std::string key, Ref ref) {
  return {std::move(key), {}, "a boolean: true/false, 1/0, on/off, yes/no",
          [ref](Config& c, const RawValue& v) {
            auto b = as_bool(v);
            if (!b) return false;
            ref(c) = *b;
            return true;
          },
          [ref](const Config& c) -> std::string { return ref(c) ? "true" : "false"; }};
}

template <class Ref>
KeySpec size_key(std::string key, Ref ref, uint64_t min_bytes, uint64_t max_bytes = UINT64_MAX) {
  std::string expected = "a size in bytes or with a binary suffix (767KiB, 64MiB, 1GiB, 1TiB; K/M/G/T mean the same)";
  if (min_bytes > 0) expected += fmt::format(", at least {}", format_size(min_bytes));
  if (max_bytes < UINT64_MAX) expected += fmt::format(", at most {}", format_size(max_bytes));
  return {std::move(key), {}, std::move(expected),
          [ref, min_bytes, max_bytes](Config& c, const RawValue& v) {
            auto bytes = as_size(v);
            if (!bytes || *bytes < min_bytes || *bytes > max_bytes) return false;
            ref(c) = *bytes;
            return true;
          },
          [ref](const Config& c) { return toml_quote(format_size(ref(c))); }};
}

template <class Ref>
KeySpec uint_key(std::string key, Ref ref, uint64_t min_value, uint64_t max_value) {
  std::string expected = max_value == UINT64_MAX
                             ? fmt::format("an unsigned integer (decimal or 0x hex)")
                             : fmt::format("an integer in [{}, {}]", min_value, max_value);
  return {std::move(key), {}, std::move(expected),
          [ref, min_value, max_value](Config& c, const RawValue& v) {
            auto n = as_unsigned(v);
            if (!n || *n < min_value || *n > max_value) return false;
            ref(c) = static_cast<std::remove_reference_t<decltype(ref(c))>>(*n);
            return true;
          },
          [ref](const Config& c) -> std::string {
            const uint64_t n = ref(c);
            // TOML integers are signed 64-bit; larger values are written as a string, which
            // the setter also accepts.
            return n <= static_cast<uint64_t>(INT64_MAX) ? std::to_string(n) : toml_quote(std::to_string(n));
          }};
}

template <class Ref>
KeySpec string_key(std::string key, Ref ref, std::string expected) {
  return {std::move(key), {}, std::move(expected),
          [ref](Config& c, const RawValue& v) {
            auto s = as_string(v);
            if (!s) return false;
            ref(c) = *s;
            return true;
          },
          [ref](const Config& c) { return toml_quote(ref(c)); }};
}

template <class E>
std::string choices_text(const std::vector<std::pair<std::string, E>>& choices) {
  std::string out = "one of";
  for (size_t i = 0; i < choices.size(); ++i) out += fmt::format("{} \"{}\"", i ? "," : "", choices[i].first);
  return out;
}

template <class E, class Ref>
KeySpec choice_key(std::string key, Ref ref, std::vector<std::pair<std::string, E>> choices) {
  std::string expected = choices_text(choices);
  return {std::move(key), {}, std::move(expected),
          [ref, choices](Config& c, const RawValue& v) {
            auto s = as_string(v);
            if (!s) return false;
            for (const auto& [name, value] : choices)
              if (name == *s) {
                ref(c) = value;
                return true;
              }
            return false;
          },
          [ref, choices](const Config& c) -> std::string {
            for (const auto& [name, value] : choices)
              if (value == ref(c)) return toml_quote(name);
            return toml_quote("?");
          }};
}

// A bound of the guard: a finite number >= 0 (a fraction; the relative error may exceed 1).
template <class Ref>
KeySpec fraction_key(std::string key, Ref ref) {
  return {std::move(key), {}, "a finite number >= 0 (a fraction: 0.01 = 1 %)",
          [ref](Config& c, const RawValue& v) {
            auto d = as_double(v);
            if (!d || !std::isfinite(*d) || *d < 0) return false;
            ref(c) = *d;
            return true;
          },
          [ref](const Config& c) { return fmt::format("{}", ref(c)); }};
}

// A cost-model number. 0 means "not measured" (the default, so the defaults round-trip); giving a
// positive number marks that fabric's model calibrated, since a profile that gives numbers clearly
// means them to be used.
KeySpec cost_key(int fabric, const char* field, double CostModel::*member) {
  return {fmt::format("cost_model.{}.{}", to_string(static_cast<Fabric>(fabric)), field), {},
          "a finite number >= 0 (0 = not measured)",
          [=](Config& c, const RawValue& v) {
            auto d = as_double(v);
            if (!d || *d < 0) return false;
            c.cost_model[fabric].*member = *d;
            if (*d > 0) c.cost_model[fabric].calibrated = true;
            return true;
          },
          [=](const Config& c) { return fmt::format("{}", c.cost_model[fabric].*member); }};
}

// A job-shape count of the cost model (hosts, ranks per host): a whole number, since the planner
// compares it with a communicator's own shape. 0 = not recorded; like the figures above, a positive
// count marks that fabric's model calibrated. The bound keeps every count exact in the double it is
// stored in, and printed back as an integer.
KeySpec cost_count_key(int fabric, const char* field, double CostModel::*member) {
  constexpr uint64_t kMaxCount = 1 << 24;
  return {fmt::format("cost_model.{}.{}", to_string(static_cast<Fabric>(fabric)), field), {},
          fmt::format("an integer in [0, {}] (0 = not recorded)", kMaxCount),
          [=](Config& c, const RawValue& v) {
            auto n = as_unsigned(v);
            if (!n || *n > kMaxCount) return false;
            c.cost_model[fabric].*member = static_cast<double>(*n);
            if (*n > 0) c.cost_model[fabric].calibrated = true;
            return true;
          },
          [=](const Config& c) { return fmt::format("{}", c.cost_model[fabric].*member); }};
}

std::vector<KeySpec> build_key_table() {
  std::vector<KeySpec> t;
  // Order matters twice: to_toml() prints in this order (root keys first, then one table per
  // prefix), and keys are applied in this order (cost_model.*.calibrated after the numbers).
  t.push_back(bool_key("enable", [](auto& c) -> auto& { return c.enable; }));
  t.push_back(choice_key<Fp8Format>("format", [](auto& c) -> auto& { return c.format; },
                                    {{"e4m3", Fp8Format::e4m3}, {"e5m2", Fp8Format::e5m2}}));
  {
    KeySpec block = uint_key("block_size", [](auto& c) -> auto& { return c.block_size; }, 32, 4096);
    block.expected = "a power of two in [32, 4096]";
    auto range_set = block.set;
    block.set = [range_set](Config& c, const RawValue& v) {
      Config trial = c;
      if (!range_set(trial, v)) return false;
      if ((trial.block_size & (trial.block_size - 1)) != 0) return false;
      c.block_size = trial.block_size;
      return true;
    };
    t.push_back(std::move(block));
  }
  t.push_back(choice_key<ScaleType>("scale_type", [](auto& c) -> auto& { return c.scale_type; },
                                    {{"fp32", ScaleType::fp32}, {"bf16", ScaleType::bf16}, {"e8m0", ScaleType::e8m0}}));
  t.push_back(choice_key<Rounding>("rounding", [](auto& c) -> auto& { return c.rounding; },
                                   {{"nearest", Rounding::nearest}, {"stochastic", Rounding::stochastic}}));
  t.push_back(uint_key("seed", [](auto& c) -> auto& { return c.seed; }, 0, UINT64_MAX));
  t.push_back(choice_key<ConvertPath>(
      "convert_path", [](auto& c) -> auto& { return c.convert_path; },
      {{"auto", ConvertPath::automatic}, {"native", ConvertPath::native}, {"software", ConvertPath::software}}));
  t.push_back(choice_key<Algorithm>("algorithm", [](auto& c) -> auto& { return c.algorithm; },
                                    {{"auto", Algorithm::automatic},
                                     {"two_shot", Algorithm::two_shot},
                                     {"one_shot", Algorithm::one_shot},
                                     {"ring", Algorithm::ring}}));
  t.push_back(choice_key<GatherMethod>("gather_transport", [](auto& c) -> auto& { return c.gather_transport; },
                                          {{"auto", GatherMethod::automatic},
                                           {"allgather", GatherMethod::allgather},
                                           {"sendrecv", GatherMethod::sendrecv}}));
  t.push_back(choice_key<std::optional<Fabric>>(
      "fabric", [](auto& c) -> auto& { return c.fabric_override; },
      {{"auto", std::nullopt}, {"nvlink", Fabric::nvlink}, {"pcie", Fabric::pcie}, {"net", Fabric::net}}));
  t.push_back({"setup_timeout_s", {}, "seconds, a finite number in [0, 86400] (0 = no deadline)",
               [](Config& c, const RawValue& v) {
                 auto d = as_double(v);
                 if (!d || !std::isfinite(*d) || *d < 0 || *d > 86400) return false;
                 c.setup_timeout_s = *d;
                 return true;
               },
               [](const Config& c) { return fmt::format("{}", c.setup_timeout_s); }});

  for (int k = 0; k < kCollectiveCount; ++k)
    t.push_back(bool_key(fmt::format("collectives.{}", to_string(static_cast<Collective>(k))),
                         [k](auto& c) -> auto& { return c.collective_enable[k]; }));
  for (int k = 0; k < kCollectiveCount; ++k)
    for (int f = 0; f < kFabricCount; ++f)
      t.push_back(size_key(fmt::format("thresholds.{}.{}", to_string(static_cast<Collective>(k)),
                                       to_string(static_cast<Fabric>(f))),
                           [k, f](auto& c) -> auto& { return c.thresholds[k][f]; }, 0));
  for (int f = 0; f < kFabricCount; ++f) {
    t.push_back(cost_key(f, "op_latency_us", &CostModel::op_latency_us));
    t.push_back(cost_key(f, "bus_bandwidth_gbps", &CostModel::bus_bandwidth_gbps));
    t.push_back(cost_key(f, "codec_gbps", &CostModel::codec_gbps));
    t.push_back(cost_key(f, "kernel_launch_us", &CostModel::kernel_launch_us));
    t.push_back(cost_key(f, "allreduce_latency_us", &CostModel::allreduce_latency_us));
    t.push_back(cost_key(f, "allgather_latency_us", &CostModel::allgather_latency_us));
    t.push_back(cost_key(f, "reduce_scatter_latency_us", &CostModel::reduce_scatter_latency_us));
    t.push_back(cost_key(f, "alltoall_latency_us", &CostModel::alltoall_latency_us));
    t.push_back(cost_key(f, "allreduce_bandwidth_gbps", &CostModel::allreduce_bandwidth_gbps));
    t.push_back(cost_key(f, "allgather_bandwidth_gbps", &CostModel::allgather_bandwidth_gbps));
    t.push_back(cost_key(f, "reduce_scatter_bandwidth_gbps", &CostModel::reduce_scatter_bandwidth_gbps));
    t.push_back(cost_key(f, "alltoall_bandwidth_gbps", &CostModel::alltoall_bandwidth_gbps));
    t.push_back(cost_key(f, "direct_latency_us", &CostModel::direct_latency_us));
    t.push_back(cost_key(f, "direct_bandwidth_gbps", &CostModel::direct_bandwidth_gbps));
    // The direct pipeline's shape: 0 = the built-in figures; not figures of time, so giving them does
    // not mark the model calibrated.
    const std::string fabric = to_string(static_cast<Fabric>(f));
    t.push_back(size_key(fmt::format("cost_model.{}.direct_stage_bytes", fabric),
                         [f](auto& c) -> auto& { return c.cost_model[f].direct_stage_bytes; }, 0));
    t.push_back(uint_key(fmt::format("cost_model.{}.direct_max_stages", fabric),
                         [f](auto& c) -> auto& { return c.cost_model[f].direct_max_stages; }, 0, 4096));
    t.push_back(uint_key(fmt::format("cost_model.{}.direct_shared_max_stages", fabric),
                         [f](auto& c) -> auto& { return c.cost_model[f].direct_shared_max_stages; }, 0, 4096));
    t.push_back(size_key(fmt::format("cost_model.{}.direct_shared_stage_bytes", fabric),
                         [f](auto& c) -> auto& { return c.cost_model[f].direct_shared_stage_bytes; }, 0));
    t.push_back(cost_count_key(f, "hosts", &CostModel::hosts));
    t.push_back(cost_count_key(f, "ranks_per_host", &CostModel::ranks_per_host));
    t.push_back(bool_key(fmt::format("cost_model.{}.calibrated", to_string(static_cast<Fabric>(f))),
                         [f](auto& c) -> auto& { return c.cost_model[f].calibrated; }));
  }

  for (int c = 0; c < kCollectiveCount; ++c)
    for (int f = 0; f < kFabricCount; ++f) {
      const auto collective = static_cast<Collective>(c);
      const std::string variants = collective == Collective::all_reduce ? "two_shot|one_shot|ring[/allgather|/sendrecv]"
                                   : collective == Collective::all_gather ? "fp8[/allgather|/sendrecv]"
                                                                          : "fp8";
      t.push_back({fmt::format("routes.{}.{}", to_string(collective), to_string(static_cast<Fabric>(f))), {},
                   fmt::format("a list of measured winners \"<ranks> ranks from <size>: nccl|{}\", at most one "
                               "per rank count and size, as fp8wire-bench sweep writes them (TOML array of strings; "
                               "env: comma-separated)",
                               variants),
                   [c, f, collective](Config& cfg, const RawValue& v) {
                     auto list = as_string_list(v);
                     if (!list) return false;
                     std::vector<MeasuredRoute> routes;
                     for (const auto& item : *list) {
                       auto r = parse_measured_route(item, collective);
                       if (!r) return false;
                       routes.push_back(*r);
                     }
                     auto key = [](const MeasuredRoute& r) { return std::pair(r.ranks, r.from_bytes); };
                     std::sort(routes.begin(), routes.end(), [&](auto& a, auto& b) { return key(a) < key(b); });
                     for (size_t i = 1; i < routes.size(); ++i)
                       if (key(routes[i]) == key(routes[i - 1])) return false;  // two winners of one size
                     cfg.routes[c][f] = std::move(routes);
                     return true;
                   },
                   [c, f](const Config& cfg) {
                     std::string out = "[";
                     const auto& routes = cfg.routes[c][f];
                     for (size_t i = 0; i < routes.size(); ++i) out += (i ? ", " : "") + toml_quote(to_string(routes[i]));
                     return out + "]";
                   }});
    }

  t.push_back(bool_key("hierarchy.enable", [](auto& c) -> auto& { return c.hierarchy_enable; }));
  t.push_back(uint_key("hierarchy.ranks_per_host", [](auto& c) -> auto& { return c.hierarchy_ranks_per_host; }, 0, 128));
  t.push_back(choice_key<DirectMode>("direct.transport", [](auto& c) -> auto& { return c.direct_transport; },
                                     {{"off", DirectMode::off},
                                      {"auto", DirectMode::automatic},
                                      {"peer_memory", DirectMode::peer_memory},
                                      {"host_memory", DirectMode::host_memory}}));
  t.push_back(bool_key("direct.assume_one_host", [](auto& c) -> auto& { return c.direct_assume_one_host; }));
  t.push_back(size_key("direct.window_bytes", [](auto& c) -> auto& { return c.direct_window_bytes; }, 64ull << 10));
  t.push_back(uint_key("direct.sets", [](auto& c) -> auto& { return c.direct_sets; }, 2, 4));
  t.push_back(uint_key("direct.ctas", [](auto& c) -> auto& { return c.direct_ctas; }, 1, 1024));
  t.push_back(choice_key<DirectProtocol>("direct.protocol", [](auto& c) -> auto& { return c.direct_protocol; },
                                         {{"auto", DirectProtocol::automatic},
                                          {"kernels", DirectProtocol::kernels},
                                          {"copy_engine", DirectProtocol::copy_engine}}));
  t.push_back(bool_key("coalesce.enable", [](auto& c) -> auto& { return c.coalesce_enable; }));
  t.push_back(size_key("coalesce.max_bytes", [](auto& c) -> auto& { return c.coalesce_max_bytes; }, 1));
  t.push_back(uint_key("coalesce.max_calls", [](auto& c) -> auto& { return c.coalesce_max_calls; }, 1, 1u << 16));
  t.push_back(size_key("scratch.max_bytes", [](auto& c) -> auto& { return c.scratch_max_bytes; }, 1));
  t.push_back(size_key("scratch.process_max_bytes", [](auto& c) -> auto& { return c.scratch_process_max_bytes; }, 0));
  t.push_back(size_key("pipeline.chunk_bytes", [](auto& c) -> auto& { return c.pipeline_chunk_bytes; }, 1));
  t.push_back(bool_key("error_feedback.enable", [](auto& c) -> auto& { return c.error_feedback; }));
  t.push_back(size_key("error_feedback.max_bytes", [](auto& c) -> auto& { return c.error_feedback_max_bytes; }, 0));
  t.push_back(uint_key("telemetry.sample_every", [](auto& c) -> auto& { return c.telemetry_sample_every; }, 0, UINT32_MAX));
  t.push_back(bool_key("guard.enable", [](auto& c) -> auto& { return c.guard_enable; }));
  t.push_back(uint_key("guard.retry_after", [](auto& c) -> auto& { return c.guard_retry_after; }, 0, UINT32_MAX));
  t.push_back(uint_key("guard.decide_after", [](auto& c) -> auto& { return c.guard_decide_after; }, 1, 1u << 20));
  t.push_back(fraction_key("guard.max_rel_error", [](auto& c) -> auto& { return c.guard_max_rel_error; }));
  t.push_back(fraction_key("guard.max_saturated", [](auto& c) -> auto& { return c.guard_max_saturated; }));
  t.push_back(fraction_key("guard.max_flushed", [](auto& c) -> auto& { return c.guard_max_flushed; }));
  t.push_back(fraction_key("guard.max_nonfinite", [](auto& c) -> auto& { return c.guard_max_nonfinite; }));
  t.push_back(uint_key("audit.every", [](auto& c) -> auto& { return c.audit_every; }, 0, UINT32_MAX));

  t.push_back(choice_key<std::string>("log.level", [](auto& c) -> auto& { return c.log_level; },
                                      {{"off", "off"}, {"error", "error"}, {"warn", "warn"},
                                       {"info", "info"}, {"debug", "debug"}, {"trace", "trace"}}));
  t.push_back(string_key("log.file", [](auto& c) -> auto& { return c.log_file; },
                         "a path (\"\" = stderr; %r = rank, %p = process id)"));
  t.push_back(string_key("nccl.library", [](auto& c) -> auto& { return c.nccl_library; },
                         "a path to libnccl.so.2 (\"\" = only the already-loaded NCCL)"));

  t.push_back(bool_key("profiler.enable", [](auto& c) -> auto& { return c.profiler_enable; }));
  t.push_back({"profiler.step_ranges", {},
               "a list of non-empty NVTX range name prefixes (TOML array of strings; env: comma-separated)",
               [](Config& c, const RawValue& v) {
                 auto list = as_string_list(v);
                 if (!list) return false;
                 c.profiler_step_ranges = *list;
                 return true;
               },
               [](const Config& c) {
                 std::string out = "[";
                 for (size_t i = 0; i < c.profiler_step_ranges.size(); ++i)
                   out += (i ? ", " : "") + toml_quote(c.profiler_step_ranges[i]);
                 return out + "]";
               }});
  t.push_back(uint_key("profiler.report_every", [](auto& c) -> auto& { return c.profiler_report_every; }, 0, UINT32_MAX));
  t.push_back(string_key("profiler.output", [](auto& c) -> auto& { return c.profiler_output; },
                         "a path prefix (\"\" = next to the log)"));
  t.push_back(uint_key("profiler.top", [](auto& c) -> auto& { return c.profiler_top; }, 1, 100000));
  t.push_back(size_key("profiler.buffer_bytes", [](auto& c) -> auto& { return c.profiler_buffer_bytes; }, 4096));
  t.push_back(uint_key("profiler.device_buffers", [](auto& c) -> auto& { return c.profiler_device_buffers; }, 1, 200));
  t.push_back(size_key("profiler.device_buffer_bytes", [](auto& c) -> auto& { return c.profiler_device_buffer_bytes; },
                       64 << 10, 256ull << 20));
  t.push_back(string_key("profiler.comm_pattern", [](auto& c) -> auto& { return c.profiler_comm_pattern; },
                         "extra kernel-name substrings counted as communication, '|'-separated (\"\" = none)"));

  for (auto& spec : t) spec.env = env_name_for(spec.key);
  return t;
}

// A field added to Config without a key here could be neither set nor printed. This trips when
// Config changes size: add the field's key to build_key_table() (and to the round-trip test in
// tests/common/test_config.cpp), then update the number.
static_assert(sizeof(Config) == 1408 || sizeof(void*) != 8,
              "fp8wire::Config changed: give the new field a key in build_key_table() (common/config.cpp)");

const std::vector<KeySpec>& key_table() {
  static const std::vector<KeySpec> table = build_key_table();
  return table;
}

// FP8WIRE_* variables that are not configuration keys: the config file itself; the build-time
// variables of cmake/Fp8wireDeps.cmake and of the project's scripts (install-deps, build, test,
// sanitize, the GPU checks), which are often still exported in the shell that runs the job; and the
// variables fp8wire's own tools pass to the processes they start (fp8wire-train's rank rendezvous,
// fp8wire-prof's library locations, the launchers' MPS switch and testbed mode). Without these, a job started by fp8wire-train or fp8wire-prof,
// or by a script given FP8WIRE_BUILD, would see a config error and run in pass-through.
bool is_non_key_variable(std::string_view name) {
  static constexpr std::string_view kNames[] = {
      "FP8WIRE_CONFIG",        "FP8WIRE_NCCL_ROOT",     "FP8WIRE_EXTRA_INCLUDE", "FP8WIRE_SKIP_TORCH",
      "FP8WIRE_BUILD",         "FP8WIRE_BUILD_TRAINER", "FP8WIRE_TORCH_PYTHON",  "FP8WIRE_SANITIZE",
      "FP8WIRE_FUZZ",          "FP8WIRE_FUZZ_SECONDS",  "FP8WIRE_SKIP_PACKAGE",  "FP8WIRE_TRAIN_STORE",
      "FP8WIRE_PROF_LIB",      "FP8WIRE_SHIM_LIB",      "FP8WIRE_CUPTI_DIR",     "FP8WIRE_MPS",
      "FP8WIRE_TESTBED_MODE",  "FP8WIRE_BOOTSTRAP_SECRET"};
  return std::find(std::begin(kNames), std::end(kNames), name) != std::end(kNames);
}

size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = up;
    }
  }
  return row[b.size()];
}

std::string unknown_key_expected(std::string_view name, bool env) {
  const KeySpec* best = nullptr;
  size_t best_distance = SIZE_MAX;
  for (const auto& spec : key_table()) {
    const size_t d = edit_distance(lower(std::string(name)), lower(env ? spec.env : spec.key));
    if (d < best_distance) {
      best_distance = d;
      best = &spec;
    }
  }
  std::string out = env ? "a known FP8WIRE_* variable" : "a known key";
  if (best && best_distance <= std::max<size_t>(2, name.size() / 4))
    out += fmt::format(" (did you mean {}?)", env ? best->env : best->key);
  return out + "; " + tool_command("config", "--defaults") + " lists every key";
}

RawValue raw_from_toml(const toml::node& node) {
  RawValue v;
  if (auto s = node.as_string()) {
    v.kind = RawValue::Kind::text;
    v.text = s->get();
  } else if (auto i = node.as_integer()) {
    v.kind = RawValue::Kind::integer;
    v.integer = i->get();
    v.text = std::to_string(v.integer);
  } else if (auto f = node.as_floating_point()) {
    v.kind = RawValue::Kind::floating;
    v.floating = f->get();
    v.text = fmt::format("{}", v.floating);
  } else if (auto b = node.as_boolean()) {
    v.kind = RawValue::Kind::boolean;
    v.boolean = b->get();
    v.text = v.boolean ? "true" : "false";
  } else if (auto a = node.as_array()) {
    v.kind = RawValue::Kind::array;
    v.text = "[";
    for (size_t i = 0; i < a->size(); ++i) {
      const toml::node& item = *a->get(i);
      if (auto s = item.as_string()) {
        v.items.push_back(s->get());
        v.text += (i ? ", " : "") + toml_quote(s->get());
      } else {
        v.items_are_strings = false;
        v.text += i ? ", <not a string>" : "<not a string>";
      }
    }
    v.text += "]";
  } else {
    v.kind = RawValue::Kind::other;
    v.text = node.is_table() ? "<a table>" : "<a date/time>";
  }
  return v;
}

std::string file_source(const std::string& name, const toml::node& node) {
  return fmt::format("file {}:{}", name, node.source().begin.line);
}

// An error in a file, with where it is: the errors are reported in the file's order.
struct FileError {
  toml::source_position at;
  ConfigError error;
};

// Reports every leaf of the document that is not a key of the table.
void find_unknown_keys(const toml::table& table, const std::string& prefix, const std::string& source_name,
                       std::vector<FileError>& errors) {
  for (const auto& [name, node] : table) {
    const std::string path = prefix.empty() ? std::string(name.str()) : prefix + "." + std::string(name.str());
    if (auto sub = node.as_table()) {
      find_unknown_keys(*sub, path, source_name, errors);
      continue;
    }
    const bool known = std::any_of(key_table().begin(), key_table().end(),
                                   [&](const KeySpec& s) { return s.key == path; });
    if (!known)
      errors.push_back({node.source().begin, {file_source(source_name, node), path, raw_from_toml(node).text,
                                              unknown_key_expected(path, false)}});
  }
}

std::string toml_limits_text() {
  return fmt::format("a TOML file within the input limits: at most {}, nested at most {} levels deep",
                     bytes_and_mib(kMaxTomlBytes), kMaxInputDepth);
}

void apply_toml(const std::string& text, const std::string& source_name, ConfigResult& result) {
  // Before toml++ sees it: some non-ASCII placements send toml++ 3.3 into undefined behaviour.
  if (const TomlTextProblem p = toml_check_text(text)) {
    result.errors.push_back({fmt::format("file {}:{}:{}", source_name, p.line, p.column), "", p.what,
                             p.over_limit ? toml_limits_text() : "valid TOML"});
    return;
  }
  toml::table doc;
  try {
    doc = toml::parse(text, source_name);
  } catch (const toml::parse_error& e) {
    result.errors.push_back({fmt::format("file {}:{}", source_name, e.source().begin.line), "",
                             std::string(e.description()), "valid TOML"});
    return;
  }
  // Keys are applied in the table's order (it matters: cost_model.*.calibrated after the figures),
  // but a reader goes through the file from the top, so that is the order of the errors.
  std::vector<FileError> errors;
  for (const auto& spec : key_table()) {
    toml::node_view<toml::node> node = doc.at_path(spec.key);
    if (!node) continue;
    const RawValue raw = raw_from_toml(*node.node());
    if (!spec.set(result.config, raw))
      errors.push_back({node.node()->source().begin,
                        {file_source(source_name, *node.node()), spec.key, raw.text, spec.expected}});
  }
  find_unknown_keys(doc, "", source_name, errors);
  std::stable_sort(errors.begin(), errors.end(), [](const FileError& a, const FileError& b) {
    return a.at.line != b.at.line ? a.at.line < b.at.line : a.at.column < b.at.column;
  });
  for (FileError& e : errors) result.errors.push_back(std::move(e.error));
}

void apply_env(const std::vector<std::string>& env, ConfigResult& result) {
  // Later entries win, as with a real environment built by successive exports.
  std::map<std::string, std::string> vars;
  for (const auto& entry : env) {
    const size_t eq = entry.find('=');
    if (eq == std::string::npos || entry.compare(0, 8, "FP8WIRE_") != 0) continue;
    vars[entry.substr(0, eq)] = entry.substr(eq + 1);
  }
  std::vector<std::string> used;
  for (const auto& spec : key_table()) {
    auto it = vars.find(spec.env);
    if (it == vars.end()) continue;
    RawValue raw;
    raw.kind = RawValue::Kind::text;
    raw.text = it->second;
    // As in a TOML file: text is UTF-8 (a value that is not could not be printed back by to_toml).
    if (!detail::utf8_valid(raw.text))
      result.errors.push_back({"env " + spec.env, spec.key, "<bytes that are not UTF-8>", "UTF-8 text"});
    else if (!spec.set(result.config, raw))
      result.errors.push_back({"env " + spec.env, spec.key, raw.text, spec.expected});
    used.push_back(spec.env);
    vars.erase(it);
  }
  for (const auto& [name, value] : vars) {
    if (is_non_key_variable(name)) continue;
    result.errors.push_back({"env " + name, "", value, unknown_key_expected(name, true)});
  }
  if (!used.empty()) {
    std::string joined = "env";
    for (size_t i = 0; i < used.size(); ++i) joined += (i ? ", " : " ") + used[i];
    result.sources.insert(result.sources.begin(), joined);
  }
}

}  // namespace

ConfigResult parse_config_toml(const std::string& toml_text, const std::string& source_name, const Config& base) {
  ConfigResult result;
  result.config = base;
  apply_toml(toml_text, source_name, result);
  result.sources.push_back("file " + source_name);
  return result;
}

ConfigResult load_config(const std::string& toml_path, const std::vector<std::string>& env) {
  ConfigResult result;
  result.sources.push_back("defaults");
  if (!toml_path.empty()) {
    std::ifstream in(toml_path, std::ios::binary);
    // A directory opens like a file and then reads as nothing: without this check FP8WIRE_CONFIG=
    // out/sweep (the folder fp8wire-bench writes, not its fp8wire-profile.toml) would silently give
    // the defaults.
    std::error_code is_dir_error;
    const bool is_dir = std::filesystem::is_directory(toml_path, is_dir_error);
    // Checked before reading: the whole file is read into memory.
    std::error_code size_error;
    const uintmax_t size = is_dir ? 0 : std::filesystem::file_size(toml_path, size_error);
    const bool too_large = in && !is_dir && !size_error && size > kMaxTomlBytes;
    std::stringstream text;
    if (in && !is_dir && !too_large) {
      errno = 0;
      text << in.rdbuf();
    }
    if (too_large) {
      result.errors.push_back({"file " + toml_path, "", fmt::format("{} bytes", size), toml_limits_text()});
    } else if (!in || is_dir || in.bad()) {
      const char* why = is_dir ? "it is a directory" : errno ? std::strerror(errno) : "read error";
      result.errors.push_back({"file " + toml_path, "", toml_path, fmt::format("a readable TOML file ({})", why)});
    } else {
      apply_toml(text.str(), toml_path, result);
      result.sources.insert(result.sources.begin(), "file " + toml_path);
    }
  }
  apply_env(env, result);
  return result;
}

ConfigResult load_config() {
  std::vector<std::string> env;
  for (char** e = environ; e && *e; ++e)
    if (std::strncmp(*e, "FP8WIRE_", 8) == 0) env.emplace_back(*e);
  const char* path = std::getenv("FP8WIRE_CONFIG");
  return load_config(path ? path : "", env);
}

std::string to_toml(const Config& config) {
  std::string out = "# fp8wire configuration (every key; precedence: FP8WIRE_* env > FP8WIRE_CONFIG file > defaults)\n";
  std::string current_table;
  for (const auto& spec : key_table()) {
    const size_t dot = spec.key.rfind('.');
    const std::string table = dot == std::string::npos ? "" : spec.key.substr(0, dot);
    const std::string leaf = dot == std::string::npos ? spec.key : spec.key.substr(dot + 1);
    if (table != current_table) {
      out += fmt::format("\n[{}]\n", table);
      current_table = table;
    }
    out += fmt::format("{} = {}  # {}\n", leaf, spec.get(config), spec.expected);
  }
  return out;
}

}  // namespace fp8wire
