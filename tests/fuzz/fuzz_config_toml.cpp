// libFuzzer target: the fp8wire configuration parser on arbitrary TOML text (common/config.cpp).
// Must never crash, hang or trip a sanitizer; every problem must come back as ConfigError. Oracle
// on success: to_toml() of the result parses back to the same configuration.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "common/config.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  const fp8wire::ConfigResult r = fp8wire::parse_config_toml(text, "fuzz.toml", fp8wire::Config{});
  for (const auto& e : r.errors) (void)e.message();
  if (r.ok()) {
    const std::string printed = fp8wire::to_toml(r.config);
    const fp8wire::ConfigResult back = fp8wire::parse_config_toml(printed, "printed.toml", fp8wire::Config{});
    if (!back.ok() || fp8wire::to_toml(back.config) != printed) std::abort();  // the round trip broke
  }
  return 0;
}
