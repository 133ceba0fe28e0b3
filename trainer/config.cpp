#include "trainer/config.hpp"

#include <sys/stat.h>

#include <charconv>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <functional>
#include <sstream>
#include <tuple>
#include <variant>

#include <fmt/format.h>

#include "common/toml.hpp"
#include "common/toml_guard.hpp"

namespace fp8wire::trainer {
namespace {

using FieldRef = std::variant<int64_t*, uint64_t*, double*, std::string*, bool*>;
struct Field {
  std::string key;
  FieldRef ref;
};

// One table drives TOML parsing, --set overrides and describe(), so the three cannot disagree.
std::vector<Field> fields(Config& c) {
  auto& m = c.model;
  auto& d = c.data;
  auto& t = c.train;
  return {
      {"model.image_size", &m.image_size}, {"model.patch_size", &m.patch_size},
      {"model.vision_width", &m.vision_width}, {"model.vision_depth", &m.vision_depth},
      {"model.vision_mlp", &m.vision_mlp}, {"model.vision_heads", &m.vision_heads},
      {"model.vocab_size", &m.vocab_size}, {"model.width", &m.width}, {"model.depth", &m.depth},
      {"model.mlp", &m.mlp}, {"model.heads", &m.heads}, {"model.kv_heads", &m.kv_heads},
      {"model.head_dim", &m.head_dim}, {"model.expert_width", &m.expert_width},
      {"model.expert_mlp", &m.expert_mlp}, {"model.action_dim", &m.action_dim},
      {"model.action_horizon", &m.action_horizon}, {"model.rope_base", &m.rope_base},
      {"model.time_min_period", &m.time_min_period}, {"model.time_max_period", &m.time_max_period},
      {"data.source", &d.source}, {"data.shard_dir", &d.shard_dir},
      {"data.num_images", &d.num_images}, {"data.camera_size", &d.camera_size},
      {"data.state_dim", &d.state_dim}, {"data.raw_action_dim", &d.raw_action_dim},
      {"data.max_token_len", &d.max_token_len}, {"data.prefetch", &d.prefetch},
      {"data.shuffle", &d.shuffle},
      {"train.device", &t.device}, {"train.dtype", &t.dtype}, {"train.micro_batch", &t.micro_batch},
      {"train.steps", &t.steps}, {"train.seed", &t.seed}, {"train.peak_lr", &t.peak_lr},
      {"train.end_lr", &t.end_lr}, {"train.warmup_steps", &t.warmup_steps},
      {"train.decay_steps", &t.decay_steps}, {"train.beta1", &t.beta1}, {"train.beta2", &t.beta2},
      {"train.eps", &t.eps}, {"train.weight_decay", &t.weight_decay},
      {"train.clip_norm", &t.clip_norm}, {"train.remat", &t.remat},
      {"train.remat_every", &t.remat_every}, {"train.fused_kernels", &t.fused_kernels},
      {"train.allreduce", &t.allreduce}, {"train.bucket_cap_mb", &t.bucket_cap_mb},
      {"train.log_jsonl", &t.log_jsonl}, {"train.out_dir", &t.out_dir},
      {"train.log_every", &t.log_every}, {"train.init_weights", &t.init_weights},
      {"train.save_path", &t.save_path}, {"train.save_every", &t.save_every},
      {"train.resume", &t.resume}, {"train.check_sync", &t.check_sync},
      {"train.peak_tflops", &t.peak_tflops}, {"train.plot", &t.plot},
      {"train.profile_from", &t.profile_from}, {"train.profile_steps", &t.profile_steps},
  };
}

Field* find_field(std::vector<Field>& all, const std::string& key) {
  for (auto& f : all)
    if (f.key == key) return &f;
  return nullptr;
}

const char* expected_type(const FieldRef& ref) {
  return std::visit(
      [](auto* p) -> const char* {
        using T = std::remove_pointer_t<decltype(p)>;
        if constexpr (std::is_same_v<T, int64_t>) return "an integer";
        if constexpr (std::is_same_v<T, uint64_t>) return "a non-negative integer";
        if constexpr (std::is_same_v<T, double>) return "a number";
        if constexpr (std::is_same_v<T, std::string>) return "a string";
        if constexpr (std::is_same_v<T, bool>) return "true or false";
      },
      ref);
}

// Parses text into the field; used for --set values (TOML values arrive already typed).
bool parse_into(const FieldRef& ref, const std::string& text) {
  return std::visit(
      [&](auto* p) -> bool {
        using T = std::remove_pointer_t<decltype(p)>;
        const char* b = text.data();
        const char* e = b + text.size();
        if constexpr (std::is_same_v<T, std::string>) {
          *p = text;
          return true;
        } else if constexpr (std::is_same_v<T, bool>) {
          if (text == "true" || text == "1") *p = true;
          else if (text == "false" || text == "0") *p = false;
          else return false;
          return true;
        } else {
          T value{};
          auto [end, ec] = std::from_chars(b, e, value);
          if (ec != std::errc() || end != e) return false;
          *p = value;
          return true;
        }
      },
      ref);
}

std::string toml_kind(const toml::node& node) {
  if (auto v = node.value<std::string>()) return "the string \"" + *v + "\"";
  if (node.is_integer()) return fmt::format("the integer {}", *node.value<int64_t>());
  if (node.is_floating_point()) return fmt::format("the number {}", *node.value<double>());
  if (node.is_boolean()) return *node.value<bool>() ? "true" : "false";
  if (node.is_table()) return "a table";
  if (node.is_array()) return "an array";
  return "a date/time";
}

std::string assign_toml(const Field& f, const toml::node& node) {
  return std::visit(
      [&](auto* p) -> std::string {
        using T = std::remove_pointer_t<decltype(p)>;
        if constexpr (std::is_same_v<T, std::string>) {
          if (auto v = node.value<std::string>()) { *p = *v; return ""; }
        } else if constexpr (std::is_same_v<T, bool>) {
          if (node.is_boolean()) { *p = *node.value<bool>(); return ""; }
        } else if constexpr (std::is_same_v<T, double>) {
          if (node.is_number()) { *p = *node.value<double>(); return ""; }
        } else {
          if (node.is_integer()) {
            const int64_t v = *node.value<int64_t>();
            if (std::is_same_v<T, uint64_t> && v < 0) return fmt::format("{}: got {}, expected {}", f.key, v, expected_type(f.ref));
            *p = static_cast<T>(v);
            return "";
          }
        }
        return fmt::format("{}: got {}, expected {}", f.key, toml_kind(node), expected_type(f.ref));
      },
      f.ref);
}

std::string load_table(const toml::table& root, Config& config) {
  auto all = fields(config);
  for (auto&& [section_key, section] : root) {
    const std::string section_name(section_key.str());
    if (section_name == "preset") {
      auto v = section.value<std::string>();
      if (!v) return fmt::format("preset: got {}, expected a string (the preset's name)", toml_kind(section));
      config.preset_name = *v;
      continue;
    }
    const auto* table = section.as_table();
    if (!table) return fmt::format("'{}': expected a table [model], [data] or [train]", section_name);
    for (auto&& [key, node] : *table) {
      const std::string full = section_name + "." + std::string(key.str());
      Field* f = find_field(all, full);
      if (!f) return fmt::format("unknown config key '{}'", full);
      if (auto err = assign_toml(*f, node); !err.empty()) return err;
    }
  }
  return validate(config);
}

}  // namespace

namespace {
// toml_guard.hpp first: some non-ASCII placements send toml++ 3.3 into undefined behaviour.
std::string parse_and_load(const std::string& text, const std::string& source, Config& config) {
  if (const TomlTextProblem p = toml_check_text(text))
    return fmt::format("TOML error at line {}, column {}: {}", p.line, p.column, p.what);
  try {
    return load_table(toml::parse(text, source), config);
  } catch (const toml::parse_error& e) {
    return fmt::format("TOML error at line {}: {}", e.source().begin.line, e.description());
  }
}
}  // namespace

std::string load_config_string(const std::string& toml_text, Config& config) {
  return parse_and_load(toml_text, "string", config);
}

std::string load_config_file(const std::string& path, Config& config) {
  // A directory opens like an empty file, which would silently mean "every default" (the full
  // pi05 model), so the kind of path is checked before reading. POSIX stat rather than
  // std::filesystem: in this binary the latter may resolve to LibTorch's copy.
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return fmt::format("{}: cannot read: {}", path, std::strerror(errno));
  if (S_ISDIR(st.st_mode))
    return fmt::format("{}: is a directory, expected a TOML preset file (e.g. trainer/configs/pi05.toml)", path);
  if (S_ISREG(st.st_mode) && static_cast<uint64_t>(st.st_size) > kMaxTomlBytes)  // before reading it all
    return fmt::format("{}: {} bytes, more than the limit of {} for a TOML preset", path, st.st_size,
                       bytes_and_mib(kMaxTomlBytes));
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  if (in) text << in.rdbuf();
  if (!in || in.bad()) return fmt::format("{}: cannot read: {}", path, std::strerror(errno));
  if (auto err = parse_and_load(text.str(), path, config); !err.empty()) return path + ": " + err;
  return "";
}

std::string apply_override(const std::string& key_equals_value, Config& config) {
  const auto eq = key_equals_value.find('=');
  if (eq == std::string::npos)
    return fmt::format("--set '{}': expected key=value, e.g. train.steps=20", key_equals_value);
  const std::string key = key_equals_value.substr(0, eq);
  const std::string value = key_equals_value.substr(eq + 1);
  auto all = fields(config);
  Field* f = find_field(all, key);
  if (!f) return fmt::format("--set: unknown config key '{}'", key);
  if (!parse_into(f->ref, value))
    return fmt::format("--set {}: got '{}', expected {}", key, value, expected_type(f->ref));
  return "";
}

std::string validate(const Config& c) {
  const auto& m = c.model;
  const auto& t = c.train;
  // NaN passes every "<= 0" test and Inf most upper bounds, so every real-valued key is checked for
  // finiteness first, then for its range.
  for (auto [key, v, low, low_inclusive] : std::initializer_list<std::tuple<const char*, double, double, bool>>{
           {"model.rope_base", m.rope_base, 0.0, false}, {"model.time_min_period", m.time_min_period, 0.0, false},
           {"model.time_max_period", m.time_max_period, 0.0, false}, {"train.peak_lr", t.peak_lr, 0.0, true},
           {"train.end_lr", t.end_lr, 0.0, true}, {"train.beta1", t.beta1, 0.0, true},
           {"train.beta2", t.beta2, 0.0, true}, {"train.eps", t.eps, 0.0, false},
           {"train.weight_decay", t.weight_decay, 0.0, true}, {"train.clip_norm", t.clip_norm, 0.0, true},
           {"train.bucket_cap_mb", t.bucket_cap_mb, 0.0, false}, {"train.peak_tflops", t.peak_tflops, 0.0, false}}) {
    if (!std::isfinite(v)) return fmt::format("{}: got {}, expected a finite number", key, v);
    if (low_inclusive ? v < low : v <= low)
      return fmt::format("{}: got {}, expected a {} number", key, v, low_inclusive ? "non-negative" : "positive");
  }
  if (t.beta1 >= 1 || t.beta2 >= 1)
    return fmt::format("train.beta1/beta2: got {} and {}, expected numbers in [0, 1)", t.beta1, t.beta2);
  if (m.time_min_period >= m.time_max_period)
    return fmt::format("model.time_min_period {} must be below model.time_max_period {}", m.time_min_period,
                       m.time_max_period);
  auto positive = [](const char* key, int64_t v) -> std::string {
    return v > 0 ? "" : fmt::format("{}: got {}, expected a positive integer", key, v);
  };
  for (auto [key, v] : std::initializer_list<std::pair<const char*, int64_t>>{
           {"model.image_size", m.image_size}, {"model.patch_size", m.patch_size},
           {"model.vision_width", m.vision_width}, {"model.vision_depth", m.vision_depth},
           {"model.vision_mlp", m.vision_mlp}, {"model.vision_heads", m.vision_heads},
           {"model.vocab_size", m.vocab_size}, {"model.width", m.width}, {"model.depth", m.depth},
           {"model.mlp", m.mlp}, {"model.heads", m.heads}, {"model.kv_heads", m.kv_heads},
           {"model.head_dim", m.head_dim}, {"model.expert_width", m.expert_width},
           {"model.expert_mlp", m.expert_mlp}, {"model.action_dim", m.action_dim},
           {"model.action_horizon", m.action_horizon}, {"data.camera_size", c.data.camera_size},
           {"data.state_dim", c.data.state_dim}, {"data.raw_action_dim", c.data.raw_action_dim},
           {"data.max_token_len", c.data.max_token_len}, {"data.prefetch", c.data.prefetch},
           {"train.micro_batch", c.train.micro_batch}, {"train.log_every", c.train.log_every}})
    if (auto e = positive(key, v); !e.empty()) return e;
  if (c.data.num_images < 0)
    return fmt::format("data.num_images: got {}, expected 0 or more", c.data.num_images);
  if (m.image_size % m.patch_size != 0)
    return fmt::format("model.image_size {} is not a multiple of model.patch_size {}", m.image_size, m.patch_size);
  if (m.vision_width % m.vision_heads != 0)
    return fmt::format("model.vision_width {} is not a multiple of model.vision_heads {}", m.vision_width, m.vision_heads);
  if (m.heads % m.kv_heads != 0)
    return fmt::format("model.heads {} is not a multiple of model.kv_heads {}", m.heads, m.kv_heads);
  if (m.head_dim % 2 != 0) return fmt::format("model.head_dim: got {}, expected an even number (RoPE)", m.head_dim);
  if (m.expert_width % 2 != 0)
    return fmt::format("model.expert_width: got {}, expected an even number (sin/cos time embedding)", m.expert_width);
  if (c.data.raw_action_dim > m.action_dim)
    return fmt::format("data.raw_action_dim {} exceeds model.action_dim {}", c.data.raw_action_dim, m.action_dim);
  if (c.data.source != "synthetic" && c.data.source != "shards")
    return fmt::format("data.source: got '{}', expected \"synthetic\" or \"shards\"", c.data.source);
  if (c.train.device != "cuda" && c.train.device != "cpu")
    return fmt::format("train.device: got '{}', expected \"cuda\" or \"cpu\"", c.train.device);
  if (c.train.dtype != "bf16" && c.train.dtype != "fp32")
    return fmt::format("train.dtype: got '{}', expected \"bf16\" or \"fp32\"", c.train.dtype);
  if (c.train.remat != "none" && c.train.remat != "vision" && c.train.remat != "layers")
    return fmt::format("train.remat: got '{}', expected \"none\", \"vision\" or \"layers\"", c.train.remat);
  if (c.train.remat_every < 1)
    return fmt::format("train.remat_every: got {}, expected 1 or more (1 = every layer)", c.train.remat_every);
  if (c.train.allreduce != "overlap" && c.train.allreduce != "after_backward" && c.train.allreduce != "skip")
    return fmt::format("train.allreduce: got '{}', expected \"overlap\", \"after_backward\" or \"skip\"",
                       c.train.allreduce);
  if (c.train.steps < 0) return fmt::format("train.steps: got {}, expected 0 or more", c.train.steps);
  if (c.train.warmup_steps < 0 || c.train.decay_steps < 0)
    return fmt::format("train.warmup_steps/decay_steps: got {} and {}, expected 0 or more", c.train.warmup_steps,
                       c.train.decay_steps);
  if (c.train.save_every < 0) return fmt::format("train.save_every: got {}, expected 0 or more", c.train.save_every);
  if (c.train.profile_from < -1)
    return fmt::format("train.profile_from: got {}, expected a step index or -1 (off)", c.train.profile_from);
  if (c.train.profile_steps < 1)
    return fmt::format("train.profile_steps: got {}, expected 1 or more", c.train.profile_steps);
  return "";
}

std::string describe(const Config& config) {
  Config copy = config;
  std::string out;
  for (auto& f : fields(copy)) {
    out += f.key + " = ";
    std::visit(
        [&](auto* p) {
          using T = std::remove_pointer_t<decltype(p)>;
          if constexpr (std::is_same_v<T, std::string>) out += "\"" + *p + "\"";
          else out += fmt::format("{}", *p);
        },
        f.ref);
    out += "\n";
  }
  return out;
}

}  // namespace fp8wire::trainer
