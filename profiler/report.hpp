// Report formats of the exposure profiler:
//  - JSON lines, one file per rank: {"type":"step",...} per step, {"type":"summary",...} at the end;
//  - a Chrome/Perfetto trace per rank (JSON array format) with steps, compute, communication,
//    exposed-communication, exposed-wait and exposed-memcpy tracks, plus the top collectives of each step;
//  - a merge of all ranks (max and mean over ranks per step) as a text table and as JSON.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "profiler/exposure.hpp"

namespace fp8wire::prof {

// JSON text that never throws: names come from the application (NVTX ranges) and may hold bytes
// that are not UTF-8; those are replaced rather than aborting the process from a CUPTI thread.
std::string dump_json(const nlohmann::json& j, int indent = -1);

nlohmann::json to_json(const CollectiveReport& c);
nlohmann::json to_json(const StepReport& r);
nlohmann::json to_json(const CollectorCounters& c);
// Reads what to_json(StepReport) wrote. Missing keys keep their defaults; a key of the wrong type
// (a damaged or foreign file) is an error naming it ("\"step\" is \"abc\", expected an integer").
bool step_report_from_json(const nlohmann::json& j, StepReport& out, std::string& error);

// Reads the "type":"step" lines of one or more JSON-lines files. Problems are "file:line: reason":
//  - `warnings`: the last line of a file is not complete JSON (a rank killed while writing it; the
//    steps before it are whole), skipped; a file with no line this profiler writes ("type" "step" or
//    "summary": an empty file of a rank killed before its first step) while others have some;
//  - `errors`: a file that cannot be read, any other line that is not a JSON object, a line over
//    kMaxReportLineBytes or nested deeper than common/input_limits.hpp allows, a field of the wrong
//    type, a (rank, step) reported twice (the first kDuplicatesNamed by place, then their count), or
//    no line this profiler writes in any file. The caller must not report figures when there are
//    errors.
inline constexpr size_t kMaxReportLineBytes = 64u << 20;  // a step of profiler.top = 100000 collectives: ~40 MiB
inline constexpr size_t kDuplicatesNamed = 5;
std::vector<StepReport> read_step_reports(const std::vector<std::string>& paths, std::vector<std::string>& errors,
                                          std::vector<std::string>& warnings);

struct Stat {
  double max = 0;
  double mean = 0;
};

struct RankedCollective {
  int rank = 0;
  int64_t step = 0;
  CollectiveReport collective;
};

struct MergedStep {
  int64_t step = 0;
  int ranks = 0;
  Stat step_ms, compute_ms, comm_ms, exposed_comm_ms, exposed_wait_ms, exposed_memcpy_ms, idle_ms, overlap_pct;
  uint64_t app_bytes = 0;   // summed over ranks
  uint64_t wire_bytes = 0;
  uint64_t plain_wire_bytes = 0;
  uint64_t calls = 0;       // summed over ranks
};

struct MergedReport {
  std::vector<MergedStep> steps;  // by step number
  int ranks = 0;                  // distinct ranks seen
  MergedStep mean;                // every figure averaged over steps (step = -1)
  std::vector<RankedCollective> top;  // most exposed collectives over the whole run
};

MergedReport merge_ranks(const std::vector<StepReport>& reports, size_t top_n = 10);
nlohmann::json to_json(const MergedReport& m);
// Human-readable table: one row per step (at most max_rows, then the mean), then the top collectives.
std::string format_table(const MergedReport& m, size_t max_rows = 40);

// One rank's trace, written as steps are reported so nothing accumulates in memory. Events beyond
// max_events are dropped and counted. The file is a complete JSON array once close() ran.
class TraceWriter {
 public:
  explicit TraceWriter(uint64_t max_events = 4'000'000) : max_events_(max_events) {}
  ~TraceWriter();
  TraceWriter(const TraceWriter&) = delete;
  TraceWriter& operator=(const TraceWriter&) = delete;

  // False with `error` ("cannot write '<path>': <reason>") when the file cannot be created; a
  // symbolic link at the path is refused (common/output_file.hpp).
  bool open(const std::string& path, int rank, std::string& error);
  void write_step(const StepReport& report, const StepTimeline& timeline);
  void close();
  uint64_t dropped_events() const { return dropped_; }

 private:
  void event(const char* name, int track, int64_t begin_ns, int64_t duration_ns, const nlohmann::json* args);
  FILE* file_ = nullptr;
  int rank_ = 0;
  uint64_t events_ = 0;
  uint64_t max_events_;
  uint64_t dropped_ = 0;
};

}  // namespace fp8wire::prof
