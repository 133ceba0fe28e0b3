// libFuzzer target: the trainer's preset parser (trainer/config.cpp, compiled in: it needs toml++
// and fmt only) on arbitrary TOML text. Every problem must come back as an error string. Oracle on
// success: the configuration validates and describe() prints.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "trainer/config.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  fp8wire::trainer::Config c;
  if (fp8wire::trainer::load_config_string(text, c).empty()) {
    if (!fp8wire::trainer::validate(c).empty()) std::abort();  // accepted yet invalid
    (void)fp8wire::trainer::describe(c);
  }
  return 0;
}
