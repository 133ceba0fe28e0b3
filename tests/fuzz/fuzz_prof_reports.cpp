// libFuzzer target: the per-rank report reader (profiler/report.cpp read_step_reports, as fp8wire-prof
// report reads a folder: bounded lines, the nesting limit, typed fields, duplicate (rank, step)
// reports, files with no profiler line) and the merge and table built from what it accepts, on
// arbitrary JSON lines. Oracles: a refusal says why; an accepted set of reports has no (rank, step)
// twice.
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "profiler/report.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // One in-memory file, rewritten for each input, read through its path as a file of a folder is.
  static const int fd = ::memfd_create("fuzz_prof_reports.jsonl", 0);
  static const std::string path = "/proc/self/fd/" + std::to_string(fd);
  if (fd < 0 || ::ftruncate(fd, 0) != 0 || ::pwrite(fd, data, size, 0) != static_cast<ssize_t>(size)) std::abort();
  std::vector<std::string> errors, warnings;
  const std::vector<fp8wire::prof::StepReport> steps = fp8wire::prof::read_step_reports({path}, errors, warnings);
  for (const std::string& e : errors)
    if (e.empty()) std::abort();
  std::set<std::pair<int, int64_t>> seen;
  for (const auto& s : steps)
    if (!seen.emplace(s.rank, s.step).second) std::abort();  // a (rank, step) accepted twice
  const auto merged = fp8wire::prof::merge_ranks(steps, 5);
  (void)fp8wire::prof::format_table(merged);
  (void)fp8wire::prof::dump_json(fp8wire::prof::to_json(merged));
  return 0;
}
