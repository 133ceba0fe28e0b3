// fp8wire-prof: runs a job under the exposure profiler and merges the per-rank reports.
//
//   fp8wire-prof [--out DIR] [--shim] [--comm-pattern P] [--report-every N] -- <command> [args...]
//       sets LD_PRELOAD (libfp8wire_prof.so, plus libfp8wire.so with --shim), NVTX_INJECTION64_PATH,
//       FP8WIRE_PROFILER_*, and LD_LIBRARY_PATH so libcupti is found; runs the command (every process
//       it starts inherits this, so torchrun's ranks are profiled); then merges DIR/*.jsonl. With
//       --shim an invalid configuration (FP8WIRE_CONFIG, FP8WIRE_*) is refused before the job starts;
//       a run that records nothing leaves no folder it created.
//   fp8wire-prof report DIR [--json FILE]        merges an earlier run again
//   fp8wire-prof analyze TRACE.json[.gz] [--json FILE] the same figures from a PyTorch profiler trace
//
// The merged report (max and mean over ranks per step) is printed as a table and written as JSON
// (DIR/report.json, or --json); the per-rank traces are joined into DIR/trace.json.
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "common/command_line.hpp"
#include "common/config.hpp"
#include "common/cuda_devices.hpp"
#include "common/input_limits.hpp"
#include "common/output_file.hpp"
#include "common/output_folder.hpp"
#include "profiler/classify.hpp"
#include "profiler/kineto.hpp"
#include "profiler/report.hpp"

namespace fs = std::filesystem;
using namespace fp8wire::prof;
using fp8wire::write_file_atomically;

namespace {

fs::path executable_dir() {
  std::error_code ec;
  const fs::path self = fs::read_symlink("/proc/self/exe", ec);
  return ec ? fs::current_path() : self.parent_path();
}

std::optional<fs::path> first_existing(const std::vector<fs::path>& candidates) {
  for (const fs::path& p : candidates) {
    std::error_code ec;
    if (!p.empty() && fs::exists(p, ec)) return fs::weakly_canonical(p, ec);
  }
  return std::nullopt;
}

std::string env_or(const char* name, const std::string& fallback = {}) {
  const char* v = std::getenv(name);
  return v && *v ? std::string(v) : fallback;
}

bool has_cupti(const fs::path& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return false;
  for (const auto& entry : fs::directory_iterator(dir, ec))
    if (entry.path().filename().string().starts_with("libcupti.so")) return true;
  return false;
}

// CUPTI ships with the toolkit or inside PyTorch's pip dependencies (nvidia/cu13/lib); the machine
// that runs a job need not be the one that built it, so look in all of them at run time.
std::optional<fs::path> find_cupti_dir() {
  std::vector<fs::path> candidates;
  if (const std::string dir = env_or("FP8WIRE_CUPTI_DIR"); !dir.empty()) candidates.push_back(dir);
  const std::string cuda = env_or("CUDA_HOME", "/usr/local/cuda");
  for (const char* sub : {"extras/CUPTI/lib64", "lib64", "lib", "targets/x86_64-linux/lib"})
    candidates.push_back(fs::path(cuda) / sub);
  if (FILE* p = popen("python3 -c 'import importlib.util as u; s = u.find_spec(\"nvidia\"); "
                      "print(list(s.submodule_search_locations)[0])' 2>/dev/null", "r")) {
    char line[4096] = {};
    if (std::fgets(line, sizeof line, p)) {
      std::string dir(line);
      while (!dir.empty() && (dir.back() == '\n' || dir.back() == '\r')) dir.pop_back();
      for (const char* sub : {"cu13/lib", "cuda_cupti/lib"}) candidates.push_back(fs::path(dir) / sub);
    }
    pclose(p);
  }
  for (const fs::path& c : candidates)
    if (has_cupti(c)) return c;
  return std::nullopt;
}

std::string prepend(const std::string& value, const std::string& existing, char sep) {
  return existing.empty() ? value : value + sep + existing;
}

std::vector<std::string> rank_files(const fs::path& dir) {
  std::vector<std::string> files;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec))
    if (entry.path().extension() == ".jsonl") files.push_back(entry.path().string());
  std::sort(files.begin(), files.end());
  return files;
}

// All ranks' traces in one file (one process per rank in Perfetto). Per-rank files are streamed
// and unbounded in count; past a size where loading them whole would hurt, they stay separate.
// False (after printing why) when the merged trace cannot be written.
bool merge_traces(const fs::path& dir) {
  constexpr uintmax_t kMaxMergedBytes = 512ull << 20;
  std::vector<fs::path> traces;
  uintmax_t total = 0;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.ends_with(".trace.json")) {
      traces.push_back(entry.path());
      total += fs::file_size(entry.path(), ec);
    }
  }
  if (traces.empty() || total > kMaxMergedBytes) return true;
  std::sort(traces.begin(), traces.end());
  nlohmann::json all = nlohmann::json::array();
  for (const fs::path& t : traces) {
    std::ifstream in(t);
    std::stringstream text;
    text << in.rdbuf();
    if (const std::string problem = fp8wire::json_check_text(text.str()); !problem.empty()) {
      fmt::print(stderr, "fp8wire-prof: {}: {}; skipped\n", t.string(), problem);
      continue;
    }
    nlohmann::json events = nlohmann::json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
    if (events.is_discarded()) {
      // A rank that was killed never wrote the closing bracket; the events before it are whole.
      events = nlohmann::json::parse(text.str() + "\n]", nullptr, /*allow_exceptions=*/false);
    }
    if (!events.is_array()) {
      fmt::print(stderr, "fp8wire-prof: {} is not a complete trace (the rank may have been killed); skipped\n",
                 t.string());
      continue;
    }
    for (auto& e : events) all.push_back(std::move(e));
  }
  const fs::path out = dir / "trace.json";
  std::string error;
  if (!write_file_atomically(out.string(), dump_json(all) + "\n", error)) {
    fmt::print(stderr, "fp8wire-prof: merged trace: {}\n", error);
    return false;
  }
  fmt::print("merged trace (chrome://tracing, ui.perfetto.dev): {}\n", out.string());
  return true;
}

// Reads every rank's report; false (after printing every problem) when any report is damaged, so
// no figures are shown or written from part of the data.
bool read_rank_reports(const std::vector<std::string>& files, std::vector<StepReport>& steps) {
  std::vector<std::string> errors, warnings;
  steps = read_step_reports(files, errors, warnings);
  for (const std::string& w : warnings) fmt::print(stderr, "fp8wire-prof: warning: {}\n", w);
  for (const std::string& e : errors) fmt::print(stderr, "fp8wire-prof: {}\n", e);
  if (!errors.empty())
    fmt::print(stderr, "fp8wire-prof: no report written ({} problem(s) with the per-rank reports above)\n",
               errors.size());
  return errors.empty();
}

int merge_and_print(const fs::path& dir, const std::string& json_path, size_t top) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    fmt::print(stderr,
               "fp8wire-prof: no per-rank reports: '{}' is not a directory (expected the folder given to "
               "fp8wire-prof --out or fp8wire run --profile)\n",
               dir.string());
    return 1;
  }
  const std::vector<std::string> files = rank_files(dir);
  if (files.empty()) {
    fmt::print(stderr, "fp8wire-prof: no per-rank reports (*.jsonl) in '{}'\n", dir.string());
    return 1;
  }
  std::vector<StepReport> steps;
  if (!read_rank_reports(files, steps)) return 1;
  const MergedReport merged = merge_ranks(steps, top);
  fmt::print("{}", format_table(merged));
  const std::string out = json_path.empty() ? (dir / "report.json").string() : json_path;
  std::string error;
  if (!write_file_atomically(out, dump_json(to_json(merged), 2) + "\n", error)) {
    fmt::print(stderr, "fp8wire-prof: merged report: {}\n", error);
    return 1;
  }
  fmt::print("merged report: {}\n", out);
  return merge_traces(dir) ? 0 : 1;
}

// With --shim the job runs libfp8wire.so, which reads FP8WIRE_CONFIG and the FP8WIRE_* variables
// when it loads; an invalid configuration would only be logged by each rank while the job ran
// without FP8. So, as `fp8wire run` does, the job is not started. False after printing the errors.
bool configuration_valid() {
  const fp8wire::ConfigResult result = fp8wire::load_config();
  if (result.ok()) return true;
  for (const fp8wire::ConfigError& e : result.errors) fmt::print(stderr, "fp8wire-prof: error: {}\n", e.message());
  fmt::print(stderr, "fp8wire-prof: the configuration above is invalid; the job was not started (with it, every "
                     "rank would run libfp8wire.so in pass-through, without FP8)\n");
  return false;
}

int run_job(const std::vector<std::string>& command, const fs::path& out_dir, bool with_shim,
            const std::string& comm_pattern, uint32_t report_every, size_t top) {
  // What the user gave is checked before what was installed: a mistake of theirs is named first.
  if (out_dir.empty()) {
    fmt::print(stderr, "fp8wire-prof: --out: an empty path was given (expected a folder for the reports, e.g. out/prof)\n");
    return 2;
  }
  if (with_shim && !configuration_valid()) return 2;
  const fs::path here = executable_dir();
  const auto prof_lib = first_existing({env_or("FP8WIRE_PROF_LIB"), here / "libfp8wire_prof.so",
                                        here / "../lib/libfp8wire_prof.so"});
  if (!prof_lib) {
    fmt::print(stderr, "fp8wire-prof: libfp8wire_prof.so not found next to {} (set FP8WIRE_PROF_LIB)\n",
               here.string());
    return 2;
  }
  std::optional<fs::path> shim_lib;
  if (with_shim) {
    // Build tree (build/profiler/fp8wire-prof next to build/shim/libfp8wire.so), then an install
    // (bin/ and lib/), then the same folder.
    const std::vector<fs::path> candidates = {env_or("FP8WIRE_SHIM_LIB"), here.parent_path() / "shim/libfp8wire.so",
                                              here.parent_path() / "lib/libfp8wire.so", here / "libfp8wire.so"};
    shim_lib = first_existing(candidates);
    if (!shim_lib) {
      std::vector<std::string> tried;
      for (const fs::path& p : candidates)
        if (!p.empty()) tried.push_back(p.string());
      fmt::print(stderr,
                 "fp8wire-prof: --shim given but libfp8wire.so not found (looked at {}; was it built? set "
                 "FP8WIRE_SHIM_LIB to its path)\n",
                 fmt::join(tried, ", "));
      return 2;
    }
  }
  const auto cupti_dir = find_cupti_dir();
  if (!cupti_dir)
    fmt::print(stderr, "fp8wire-prof: warning: libcupti not found (set FP8WIRE_CUPTI_DIR); relying on the "
                       "library's run path\n");

  fp8wire::OutputFolder folder;
  if (std::string error; !folder.create(out_dir, error)) {
    // Named without its option: the folder may come from fp8wire-prof --out or fp8wire run --profile.
    fmt::print(stderr, "fp8wire-prof: reports: {}\n", error);
    return 2;
  }
  std::error_code ec;
  // Reports of an earlier run in the same folder would be merged with this one.
  for (const auto& entry : fs::directory_iterator(out_dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.ends_with(".jsonl") || name.ends_with(".trace.json") || name == "trace.json" || name == "report.json")
      fs::remove(entry.path(), ec);
  }

  std::string preload = prof_lib->string();
  if (shim_lib) preload = shim_lib->string() + ":" + preload;
  setenv("LD_PRELOAD", prepend(preload, env_or("LD_PRELOAD"), ':').c_str(), 1);
  setenv("NVTX_INJECTION64_PATH", prof_lib->c_str(), 1);
  setenv("FP8WIRE_PROFILER_ENABLE", "1", 1);
  setenv("FP8WIRE_PROFILER_OUTPUT", (fs::absolute(out_dir).string() + "/").c_str(), 1);
  if (report_every) setenv("FP8WIRE_PROFILER_REPORT_EVERY", std::to_string(report_every).c_str(), 1);
  if (!comm_pattern.empty()) setenv("FP8WIRE_PROFILER_COMM_PATTERN", comm_pattern.c_str(), 1);
  // Appended, not prepended: the toolkit's lib folder also holds cudart/NCCL, and putting it first
  // could swap the libraries PyTorch loads through its run path.
  if (cupti_dir) {
    const std::string existing = env_or("LD_LIBRARY_PATH");
    setenv("LD_LIBRARY_PATH", (existing.empty() ? cupti_dir->string() : existing + ":" + cupti_dir->string()).c_str(), 1);
  }

  std::vector<char*> argv;
  for (const std::string& a : command) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  // The job gets Ctrl-C; we stay to merge what it wrote.
  signal(SIGINT, SIG_IGN);
  const pid_t child = fork();
  if (child < 0) {
    perror("fp8wire-prof: fork");
    folder.remove_if_empty();
    return 2;
  }
  if (child == 0) {
    signal(SIGINT, SIG_DFL);
    // If fp8wire-prof is killed (a time limit), the job must not run on without anyone waiting.
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    execvp(argv[0], argv.data());
    fmt::print(stderr, "fp8wire-prof: cannot run '{}': {}\n", command[0], strerror(errno));
    _exit(127);
  }
  int status = 0;
  while (waitpid(child, &status, 0) < 0 && errno == EINTR) {
  }
  const int rc = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  if (rc != 0) fmt::print(stderr, "fp8wire-prof: the job exited with status {}\n", rc);
  if (rank_files(out_dir).empty()) {
    folder.remove_if_empty();
    // Without a GPU there is nothing to record: say so once and give the job's own status, which a
    // missing report would otherwise replace.
    if (fp8wire::visible_cuda_devices() == 0) {
      fmt::print(stderr, "fp8wire-prof: no GPU: the profiler recorded nothing\n");
      return rc;
    }
    fmt::print(stderr, "fp8wire-prof: no per-rank reports (*.jsonl) in '{}'\n", out_dir.string());
    return rc != 0 ? rc : 1;
  }
  const int merge_rc = merge_and_print(out_dir, {}, top);
  return rc != 0 ? rc : merge_rc;
}

int analyze(const std::string& trace, const std::string& json_path, const std::string& comm_pattern,
            const std::vector<std::string>& prefixes, size_t top) {
  KinetoOptions options;
  if (!prefixes.empty()) options.step_prefixes = prefixes;
  options.top_n = top;
  KinetoAnalysis analysis;
  std::string error;
  if (!analyze_kineto_file(trace, KernelClassifier(comm_pattern), options, analysis, error)) {
    fmt::print(stderr, "fp8wire-prof analyze: {}\n", error);
    return 1;
  }
  // Without a step there is nothing to report: an empty table and status 0 would read as "no
  // exposed communication".
  if (analysis.steps.empty()) {
    fmt::print(stderr,
               "fp8wire-prof analyze: no step windows in '{}' ({} kernel(s), {} communication): expected "
               "user_annotation events named {}*, as torch.profiler records with a schedule and prof.step() "
               "(--step-prefix names others)\n",
               trace, analysis.kernels, analysis.comm_kernels, fmt::join(options.step_prefixes, "* / "));
    return 1;
  }
  fmt::print("{} kernels ({} communication), {} memcpy/memset\n", analysis.kernels, analysis.comm_kernels,
             analysis.memory_ops);
  const MergedReport merged = merge_ranks(analysis.steps, top);
  fmt::print("{}", format_table(merged));
  if (!json_path.empty()) {
    nlohmann::json j = to_json(merged);
    j["per_step"] = nlohmann::json::array();
    for (const StepReport& r : analysis.steps) j["per_step"].push_back(to_json(r));
    if (!write_file_atomically(json_path, dump_json(j, 2) + "\n", error)) {
      fmt::print(stderr, "fp8wire-prof analyze: --json: {}\n", error);
      return 1;
    }
    fmt::print("report: {}\n", json_path);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"fp8wire-prof: exposed-communication profiler (runs a job, merges ranks, reads Kineto traces)"};
  std::string out_dir = "fp8wire-prof-out";
  bool with_shim = false;
  std::string comm_pattern;
  uint32_t report_every = 0;
  size_t top = 10;
  std::vector<std::string> command;
  app.add_option("--out", out_dir, "folder for per-rank reports, traces and report.json");
  app.add_flag("--shim", with_shim, "also preload libfp8wire.so (FP8 on the wire)");
  app.add_option("--comm-pattern", comm_pattern,
                 "extra '|'-separated kernel-name substrings counted as communication");
  app.add_option("--report-every", report_every, "print a table every N steps (0: only at exit)");
  app.add_option("--top", top, "collectives listed in the report")->check(CLI::Range(1, 100000));
  app.add_option("command", command, "the job to run, after --");

  std::string report_dir, json_path;
  CLI::App* report = app.add_subcommand("report", "merge the per-rank reports of an earlier run");
  report->add_option("dir", report_dir, "folder given to --out (or to fp8wire run --profile)")->required();
  report->add_option("--json", json_path, "where to write the merged JSON (default DIR/report.json)");

  std::string trace;
  std::vector<std::string> prefixes;
  CLI::App* analyze_cmd = app.add_subcommand("analyze", "exposure per ProfilerStep from a PyTorch profiler trace");
  analyze_cmd->add_option("trace", trace, "Kineto trace (JSON, or gzip-compressed JSON such as .json.gz)")
      ->required()
      ->check(CLI::ExistingFile);
  analyze_cmd->add_option("--json", json_path, "write the report as JSON here");
  analyze_cmd->add_option("--step-prefix", prefixes, "user_annotation name prefixes of steps (default ProfilerStep#, step)");
  analyze_cmd->add_option("--comm-pattern", comm_pattern, "extra communication kernel-name substrings");
  app.require_subcommand(0, 1);

  if (const auto status = fp8wire::parse_command_line(app, argc, argv, "fp8wire-prof")) return *status;
  if (*report) return merge_and_print(report_dir, json_path, top);
  if (*analyze_cmd) return analyze(trace, json_path, comm_pattern, prefixes, top);
  if (command.empty()) {
    fmt::print(stderr, "fp8wire-prof: give a command after --, or a subcommand (report, analyze)\n{}", app.help());
    return 2;
  }
  return run_job(command, out_dir, with_shim, comm_pattern, report_every, top);
}
