// libFuzzer target: the FP8WIRE_* environment side of the configuration (common/config.cpp). The
// input is split at newlines into NAME=value entries (a leading FP8WIRE_ is added where missing, so
// the fuzzer spends its time on values and key names, not on the prefix). Oracle on success:
// to_toml() of the result parses back to the same configuration.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "common/config.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  std::vector<std::string> env;
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    std::string entry = text.substr(start, end - start);
    if (entry.rfind("FP8WIRE_", 0) != 0) entry = "FP8WIRE_" + entry;
    env.push_back(std::move(entry));
    start = end + 1;
  }
  const fp8wire::ConfigResult r = fp8wire::load_config("", env);
  for (const auto& e : r.errors) (void)e.message();
  if (r.ok()) {
    const std::string printed = fp8wire::to_toml(r.config);
    const fp8wire::ConfigResult back = fp8wire::parse_config_toml(printed, "printed.toml", fp8wire::Config{});
    if (!back.ok() || fp8wire::to_toml(back.config) != printed) std::abort();
  }
  return 0;
}
