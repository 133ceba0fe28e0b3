// fp8wire-config: checks configuration the way libfp8wire.so will read it, before a job starts.
//   fp8wire-config --check FILE   FILE plus the FP8WIRE_* environment: every error, or the effective
//                                 configuration; exit 0 when valid, 1 otherwise
//   fp8wire-config                the same with FP8WIRE_CONFIG (if set) as the file
//   fp8wire-config --defaults     every key with its default
// A usage error (an unknown option, --check with --defaults) exits 2; a file that cannot be read is
// a failed check like any other (1), reported by the configuration's own reader with its reason.
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "common/command_line.hpp"
#include "common/config.hpp"

extern char** environ;

int main(int argc, char** argv) {
  CLI::App app{"Validate fp8wire configuration (TOML file + FP8WIRE_* environment variables)"};
  std::string check_path;
  bool defaults = false;
  CLI::Option* check = app.add_option("--check", check_path, "TOML file to validate together with the environment");
  // --defaults prints the built-in values, never a file's: with both, one of them would be ignored.
  app.add_flag("--defaults", defaults, "print every key with its default value and exit")->excludes(check);
  if (const auto status = fp8wire::parse_command_line(app, argc, argv, "fp8wire-config")) return *status;

  if (defaults) {
    std::fputs(fp8wire::to_toml(fp8wire::Config{}).c_str(), stdout);
    return 0;
  }
  std::vector<std::string> env;
  for (char** e = environ; e && *e; ++e)
    if (std::strncmp(*e, "FP8WIRE_", 8) == 0) env.emplace_back(*e);
  if (check_path.empty()) {
    const char* from_env = std::getenv("FP8WIRE_CONFIG");
    check_path = from_env ? from_env : "";
  }
  const fp8wire::ConfigResult result = fp8wire::load_config(check_path, env);
  if (!result.ok()) {
    for (const auto& e : result.errors) std::fprintf(stderr, "error: %s\n", e.message().c_str());
    std::fprintf(stderr, "%zu error(s); libfp8wire.so would run in pass-through\n", result.errors.size());
    return 1;
  }
  std::printf("# sources (highest precedence first):");
  for (const auto& s : result.sources) std::printf(" %s;", s.c_str());
  std::printf("\n%s", fp8wire::to_toml(result.config).c_str());
  return 0;
}
