#pragma once
// How a message names one of fp8wire's tools. After `pip install` only the `fp8wire` command is on
// PATH (`fp8wire config`, `fp8wire bench`, `fp8wire prof` run the packaged programs); a CMake build
// has the programs themselves under build/. A library or tool cannot tell which install its reader
// has, so every message names both, the package's form first.
#include <string>
#include <string_view>

#include <fmt/format.h>

namespace fp8wire {

// sub: "config", "bench" or "prof"; args: what follows it ("--defaults").
inline std::string tool_command(std::string_view sub, std::string_view args) {
  std::string_view program = "shim/fp8wire-config";
  if (sub == "bench") program = "bench/fp8wire-bench";
  if (sub == "prof") program = "profiler/fp8wire-prof";
  const std::string tail = args.empty() ? std::string() : fmt::format(" {}", args);
  return fmt::format("`fp8wire {}{}` (in a build tree: `build/{}{}`)", sub, tail, program, tail);
}

}  // namespace fp8wire
