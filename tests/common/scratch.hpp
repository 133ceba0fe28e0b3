// Scratch folders and file reads for the CPU tests of common/ (each test removes what it made).
#pragma once

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <fmt/format.h>

namespace fp8wire::test {

// An empty folder of this process's own, named after the test file and case.
inline std::filesystem::path fresh_dir(const std::string& test, const std::string& name) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / fmt::format("fp8wire_test_{}_{}_{}", test, ::getpid(), name);
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

inline std::string read_text(const std::filesystem::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace fp8wire::test
