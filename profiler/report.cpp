#include "profiler/report.hpp"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <limits>
#include <map>
#include <set>

#include <fmt/format.h>

#include "common/input_limits.hpp"
#include "common/output_file.hpp"

namespace fp8wire::prof {

using nlohmann::json;

std::string dump_json(const json& j, int indent) {
  return j.dump(indent, ' ', /*ensure_ascii=*/false, json::error_handler_t::replace);
}

json to_json(const CollectiveReport& c) {
  return json{{"seq", c.seq},           {"ordinal", c.ordinal},       {"name", c.name},
              {"kernel", c.kernel},     {"range", c.range},           {"dtype", c.dtype},
              {"path", c.path},         {"transport", c.transport},   {"app_bytes", c.app_bytes},
              {"wire_bytes", c.wire_bytes}, {"plain_wire_bytes", c.plain_wire_bytes}, {"kernels", c.kernels},
              {"begin_ns", c.begin_ns}, {"duration_ms", c.duration_ms}, {"exposed_ms", c.exposed_ms},
              {"exposed_data_ms", c.exposed_data_ms}, {"exposed_wait_ms", c.exposed_wait_ms},
              {"rel_error", c.rel_error}};
}

json to_json(const StepReport& r) {
  json top = json::array();
  for (const CollectiveReport& c : r.top) top.push_back(to_json(c));
  return json{{"type", "step"},
              {"rank", r.rank},
              {"step", r.step},
              {"begin_ns", r.begin_ns},
              {"end_ns", r.end_ns},
              {"step_ms", r.step_ms},
              {"compute_ms", r.compute_ms},
              {"comm_ms", r.comm_ms},
              {"exposed_comm_ms", r.exposed_comm_ms},
              {"exposed_data_ms", r.exposed_data_ms},
              {"exposed_wait_ms", r.exposed_wait_ms},
              {"exposed_memcpy_ms", r.exposed_memcpy_ms},
              {"idle_ms", r.idle_ms},
              {"overlap_pct", r.overlap_pct},
              {"app_bytes", r.app_bytes},
              {"wire_bytes", r.wire_bytes},
              {"plain_wire_bytes", r.plain_wire_bytes},
              {"calls", r.calls},
              {"compute_kernels", r.compute_kernels},
              {"comm_kernels", r.comm_kernels},
              {"memory_ops", r.memory_ops},
              {"top", std::move(top)}};
}

json to_json(const CollectorCounters& c) {
  return json{{"dropped_activities", c.dropped_activities}, {"dropped_calls", c.dropped_calls},
              {"late_activities", c.late_activities},       {"unmatched_step_ends", c.unmatched_step_ends},
              {"nested_step_begins", c.nested_step_begins}, {"steps_reported", c.steps_reported},
              {"dropped_externals", c.dropped_externals},   {"external_records", c.external_records},
              {"joined_activities", c.joined_activities},   {"unjoined_activities", c.unjoined_activities},
              {"call_marks", c.call_marks}};
}

namespace {
// Typed reads for step_report_from_json: absent keys keep the default, other types are errors.
std::string shown(const json& v) {
  std::string text = dump_json(v);
  return text.size() > 40 ? text.substr(0, 40) + "..." : text;
}

template <class T>
bool read_field(const json& j, const char* key, T& out, std::string& error) {
  const auto it = j.find(key);
  if (it == j.end()) return true;
  const json& v = *it;
  bool ok = false;
  if constexpr (std::is_same_v<T, std::string>) {
    ok = v.is_string();
    if (ok) out = v.get<std::string>();
    if (!ok) error = fmt::format("\"{}\" is {}, expected a string", key, shown(v));
    return ok;
  } else if constexpr (std::is_same_v<T, double>) {
    ok = v.is_number();
    if (ok) out = v.get<double>();
    if (!ok) error = fmt::format("\"{}\" is {}, expected a number", key, shown(v));
    return ok;
  } else {
    static_assert(std::is_integral_v<T>);
    if (v.is_number_unsigned()) {
      const uint64_t u = v.get<uint64_t>();
      ok = u <= static_cast<uint64_t>(std::numeric_limits<T>::max());
      if (ok) out = static_cast<T>(u);
    } else if (v.is_number_integer()) {
      const int64_t i = v.get<int64_t>();
      ok = i >= static_cast<int64_t>(std::numeric_limits<T>::min()) &&
           (i < 0 || static_cast<uint64_t>(i) <= static_cast<uint64_t>(std::numeric_limits<T>::max()));
      if (ok) out = static_cast<T>(i);
    }
    if (!ok)
      error = fmt::format("\"{}\" is {}, expected {}", key, shown(v),
                          std::is_signed_v<T> ? "an integer" : "a non-negative integer");
    return ok;
  }
}
}  // namespace

bool step_report_from_json(const json& j, StepReport& r, std::string& error) {
  r = StepReport{};
  if (!j.is_object()) {
    error = fmt::format("a step report is {}, expected a JSON object", shown(j));
    return false;
  }
  const bool ok = read_field(j, "rank", r.rank, error) && read_field(j, "step", r.step, error) &&
                  read_field(j, "begin_ns", r.begin_ns, error) && read_field(j, "end_ns", r.end_ns, error) &&
                  read_field(j, "step_ms", r.step_ms, error) && read_field(j, "compute_ms", r.compute_ms, error) &&
                  read_field(j, "comm_ms", r.comm_ms, error) &&
                  read_field(j, "exposed_comm_ms", r.exposed_comm_ms, error) &&
                  read_field(j, "exposed_data_ms", r.exposed_data_ms, error) &&
                  read_field(j, "exposed_wait_ms", r.exposed_wait_ms, error) &&
                  read_field(j, "exposed_memcpy_ms", r.exposed_memcpy_ms, error) &&
                  read_field(j, "idle_ms", r.idle_ms, error) && read_field(j, "overlap_pct", r.overlap_pct, error) &&
                  read_field(j, "app_bytes", r.app_bytes, error) && read_field(j, "wire_bytes", r.wire_bytes, error) &&
                  read_field(j, "plain_wire_bytes", r.plain_wire_bytes, error) &&
                  read_field(j, "calls", r.calls, error) &&
                  read_field(j, "compute_kernels", r.compute_kernels, error) &&
                  read_field(j, "comm_kernels", r.comm_kernels, error) &&
                  read_field(j, "memory_ops", r.memory_ops, error);
  if (!ok) return false;
  const auto top = j.find("top");
  if (top == j.end()) return true;
  if (!top->is_array()) {
    error = fmt::format("\"top\" is {}, expected an array", shown(*top));
    return false;
  }
  for (size_t i = 0; i < top->size(); ++i) {
    const json& t = (*top)[i];
    CollectiveReport c;
    std::string why;
    const bool good = t.is_object() && read_field(t, "seq", c.seq, why) && read_field(t, "ordinal", c.ordinal, why) &&
                      read_field(t, "name", c.name, why) && read_field(t, "kernel", c.kernel, why) &&
                      read_field(t, "range", c.range, why) && read_field(t, "dtype", c.dtype, why) &&
                      read_field(t, "path", c.path, why) && read_field(t, "transport", c.transport, why) &&
                      read_field(t, "app_bytes", c.app_bytes, why) &&
                      read_field(t, "wire_bytes", c.wire_bytes, why) &&
                      read_field(t, "plain_wire_bytes", c.plain_wire_bytes, why) &&
                      read_field(t, "kernels", c.kernels, why) &&
                      read_field(t, "begin_ns", c.begin_ns, why) && read_field(t, "duration_ms", c.duration_ms, why) &&
                      read_field(t, "exposed_ms", c.exposed_ms, why) &&
                      read_field(t, "exposed_data_ms", c.exposed_data_ms, why) &&
                      read_field(t, "exposed_wait_ms", c.exposed_wait_ms, why) &&
                      (!t.contains("rel_error") || read_field(t, "rel_error", c.rel_error, why));
    if (!good) {
      error = fmt::format("\"top\"[{}]: {}", i, why.empty() ? fmt::format("is {}, expected an object", shown(t)) : why);
      return false;
    }
    r.top.push_back(std::move(c));
  }
  return true;
}

namespace {
// One line of `in` into `line`, at most `limit` bytes of it; false at the end of the input. A longer
// line is cut at the limit (`too_long` set) and the rest of it skipped, so memory stays bounded.
bool read_line_bounded(std::istream& in, std::string& line, size_t limit, bool& too_long) {
  line.clear();
  too_long = false;
  std::streambuf* buf = in.rdbuf();
  bool any = false;
  for (;;) {
    const int c = buf->sbumpc();
    if (c == std::char_traits<char>::eof()) {
      in.setstate(std::ios::eofbit);
      return any;
    }
    any = true;
    if (c == '\n') return true;
    if (line.size() < limit) line.push_back(static_cast<char>(c));
    else too_long = true;
  }
}

// "a, b, c and 2 more": files named in one message, the first few of them.
std::string some_files(const std::vector<std::string>& files) {
  constexpr size_t kShown = 4;
  std::string out;
  for (size_t i = 0; i < files.size() && i < kShown; ++i) out += (i ? ", " : "") + files[i];
  if (files.size() > kShown) out += fmt::format(" and {} more", files.size() - kShown);
  return out;
}
}  // namespace

std::vector<StepReport> read_step_reports(const std::vector<std::string>& paths, std::vector<std::string>& errors,
                                          std::vector<std::string>& warnings) {
  std::vector<StepReport> out;
  // Where each (rank, step) was first read: a second report of one is an error, never a second sample.
  std::map<std::pair<int, int64_t>, std::string> first_seen;
  size_t duplicates = 0;
  std::vector<std::string> without_reports;  // files with no line this profiler writes
  for (const std::string& path : paths) {
    std::ifstream in(path);
    if (!in) {
      errors.push_back(fmt::format("{}: cannot open: {}", path, std::strerror(errno)));
      continue;
    }
    std::string line;
    bool too_long = false;
    bool recognised = false;   // a "type":"step" or "type":"summary" line
    const size_t errors_before = errors.size();
    int pending_bad_line = 0;  // a line that did not parse; an error unless it turns out to be the last
    for (int number = 1; read_line_bounded(in, line, kMaxReportLineBytes, too_long); ++number) {
      if (too_long) {
        errors.push_back(fmt::format("{}:{}: a line longer than the limit of {} for a profiler report line", path,
                                     number, fp8wire::bytes_and_mib(kMaxReportLineBytes)));
        continue;
      }
      if (line.empty()) continue;
      if (pending_bad_line) {
        errors.push_back(fmt::format("{}:{}: not a JSON object", path, pending_bad_line));
        pending_bad_line = 0;
      }
      fp8wire::JsonScan scan;
      if (!scan.feed(line)) {
        errors.push_back(fmt::format("{}:{}: column {}: {}", path, number, scan.column(), scan.what()));
        continue;
      }
      json j = json::parse(line, nullptr, /*allow_exceptions=*/false);
      if (j.is_discarded() || !j.is_object()) {
        pending_bad_line = number;
        continue;
      }
      const auto type = j.find("type");
      if (type != j.end() && !type->is_string()) {
        errors.push_back(fmt::format("{}:{}: \"type\" is {}, expected a string", path, number, shown(*type)));
        continue;
      }
      if (type == j.end()) continue;
      const std::string& kind = type->get_ref<const std::string&>();
      recognised |= kind == "step" || kind == "summary";
      if (kind != "step") continue;
      StepReport r;
      std::string error;
      if (!step_report_from_json(j, r, error)) {
        errors.push_back(fmt::format("{}:{}: {}", path, number, error));
        continue;
      }
      const std::string here = fmt::format("{}:{}", path, number);
      const auto [it, fresh] = first_seen.emplace(std::pair{r.rank, r.step}, here);
      if (!fresh) {
        // Reports of two runs in one folder would otherwise be averaged together. The first few are
        // named; the count says how many more.
        if (++duplicates <= kDuplicatesNamed)
          errors.push_back(fmt::format("{}: rank {} step {} was already reported at {} (reports of two runs in one "
                                       "folder? fp8wire-prof --out empties its folder first; merge one run's "
                                       "files at a time)",
                                       here, r.rank, r.step, it->second));
        continue;
      }
      out.push_back(std::move(r));
    }
    if (in.bad()) errors.push_back(fmt::format("{}: read error", path));
    if (pending_bad_line)
      warnings.push_back(fmt::format("{}:{}: incomplete last line skipped (the process was killed while writing it?)",
                                     path, pending_bad_line));
    if (!recognised && errors.size() == errors_before) without_reports.push_back(path);
  }
  if (duplicates > kDuplicatesNamed)
    errors.push_back(fmt::format("{} more (rank, step) reports that repeat an earlier one", duplicates - kDuplicatesNamed));
  constexpr const char* kRecognised =
      "JSON lines such as {\"type\":\"step\",\"rank\":0,\"step\":1,\"step_ms\":...}, which libfp8wire_prof.so "
      "writes into the folder given to fp8wire-prof --out";
  if (!without_reports.empty() && without_reports.size() == paths.size() && errors.empty()) {
    errors.push_back(fmt::format("no profiler report line in {}: expected {}", some_files(without_reports), kRecognised));
  } else if (!without_reports.empty()) {
    // A rank killed before its first step leaves an empty file; the other ranks' reports stand.
    warnings.push_back(fmt::format("no profiler report line in {}; skipped (expected {})", some_files(without_reports),
                                   kRecognised));
  }
  return out;
}

namespace {
struct Accumulator {
  double max = -1e300;
  double sum = 0;
  int n = 0;
  void add(double v) {
    max = std::max(max, v);
    sum += v;
    ++n;
  }
  Stat stat() const { return n ? Stat{max, sum / n} : Stat{}; }
};

struct StepAccumulator {
  Accumulator step_ms, compute_ms, comm_ms, exposed_comm_ms, exposed_wait_ms, exposed_memcpy_ms, idle_ms, overlap_pct;
  uint64_t app_bytes = 0, wire_bytes = 0, plain_wire_bytes = 0, calls = 0;
  int ranks = 0;
};

json stat_json(const Stat& s) { return json{{"max", s.max}, {"mean", s.mean}}; }
}  // namespace

MergedReport merge_ranks(const std::vector<StepReport>& reports, size_t top_n) {
  MergedReport m;
  std::map<int64_t, StepAccumulator> by_step;
  std::set<int> ranks;
  for (const StepReport& r : reports) {
    StepAccumulator& a = by_step[r.step];
    a.step_ms.add(r.step_ms);
    a.compute_ms.add(r.compute_ms);
    a.comm_ms.add(r.comm_ms);
    a.exposed_comm_ms.add(r.exposed_comm_ms);
    a.exposed_wait_ms.add(r.exposed_wait_ms);
    a.exposed_memcpy_ms.add(r.exposed_memcpy_ms);
    a.idle_ms.add(r.idle_ms);
    a.overlap_pct.add(r.overlap_pct);
    a.app_bytes += r.app_bytes;
    a.wire_bytes += r.wire_bytes;
    a.plain_wire_bytes += r.plain_wire_bytes;
    a.calls += r.calls;
    ++a.ranks;
    ranks.insert(r.rank);
    for (const CollectiveReport& c : r.top) m.top.push_back({r.rank, r.step, c});
  }
  m.ranks = static_cast<int>(ranks.size());

  // The mean row averages each per-step statistic over steps (mean of maxima, mean of means).
  constexpr int kFields = 8;
  Accumulator mean_fields[kFields][2];
  uint64_t app = 0, wire = 0, plain_wire = 0, calls = 0;
  for (const auto& [step, a] : by_step) {
    MergedStep s;
    s.step = step;
    s.ranks = a.ranks;
    s.step_ms = a.step_ms.stat();
    s.compute_ms = a.compute_ms.stat();
    s.comm_ms = a.comm_ms.stat();
    s.exposed_comm_ms = a.exposed_comm_ms.stat();
    s.exposed_wait_ms = a.exposed_wait_ms.stat();
    s.exposed_memcpy_ms = a.exposed_memcpy_ms.stat();
    s.idle_ms = a.idle_ms.stat();
    s.overlap_pct = a.overlap_pct.stat();
    s.app_bytes = a.app_bytes;
    s.wire_bytes = a.wire_bytes;
    s.plain_wire_bytes = a.plain_wire_bytes;
    s.calls = a.calls;
    const Stat* fields[kFields] = {&s.step_ms, &s.compute_ms, &s.comm_ms, &s.exposed_comm_ms,
                                   &s.exposed_wait_ms, &s.exposed_memcpy_ms, &s.idle_ms, &s.overlap_pct};
    for (int f = 0; f < kFields; ++f) {
      mean_fields[f][0].add(fields[f]->max);
      mean_fields[f][1].add(fields[f]->mean);
    }
    app += s.app_bytes;
    wire += s.wire_bytes;
    plain_wire += s.plain_wire_bytes;
    calls += s.calls;
    m.steps.push_back(s);
  }
  m.mean.step = -1;
  m.mean.ranks = m.ranks;
  Stat* fields[kFields] = {&m.mean.step_ms, &m.mean.compute_ms, &m.mean.comm_ms, &m.mean.exposed_comm_ms,
                           &m.mean.exposed_wait_ms, &m.mean.exposed_memcpy_ms, &m.mean.idle_ms, &m.mean.overlap_pct};
  for (int f = 0; f < kFields; ++f) {
    fields[f]->max = mean_fields[f][0].stat().mean;
    fields[f]->mean = mean_fields[f][1].stat().mean;
  }
  if (!m.steps.empty()) {
    const uint64_t n = m.steps.size();
    m.mean.app_bytes = app / n;
    m.mean.wire_bytes = wire / n;
    m.mean.plain_wire_bytes = plain_wire / n;
    m.mean.calls = calls / n;
  }

  const size_t keep = std::min(top_n, m.top.size());
  std::partial_sort(m.top.begin(), m.top.begin() + static_cast<std::ptrdiff_t>(keep), m.top.end(),
                    [](const RankedCollective& a, const RankedCollective& b) {
                      return a.collective.exposed_ms > b.collective.exposed_ms;
                    });
  m.top.resize(keep);
  return m;
}

json to_json(const MergedReport& m) {
  auto step_json = [](const MergedStep& s) {
    return json{{"step", s.step},
                {"ranks", s.ranks},
                {"step_ms", stat_json(s.step_ms)},
                {"compute_ms", stat_json(s.compute_ms)},
                {"comm_ms", stat_json(s.comm_ms)},
                {"exposed_comm_ms", stat_json(s.exposed_comm_ms)},
                {"exposed_wait_ms", stat_json(s.exposed_wait_ms)},
                {"exposed_memcpy_ms", stat_json(s.exposed_memcpy_ms)},
                {"idle_ms", stat_json(s.idle_ms)},
                {"overlap_pct", stat_json(s.overlap_pct)},
                {"app_bytes", s.app_bytes},
                {"wire_bytes", s.wire_bytes},
                {"plain_wire_bytes", s.plain_wire_bytes},
                {"calls", s.calls}};
  };
  json steps = json::array();
  for (const MergedStep& s : m.steps) steps.push_back(step_json(s));
  json top = json::array();
  for (const RankedCollective& t : m.top) {
    json c = to_json(t.collective);
    c["rank"] = t.rank;
    c["step"] = t.step;
    top.push_back(std::move(c));
  }
  return json{{"ranks", m.ranks}, {"steps", std::move(steps)}, {"mean", step_json(m.mean)}, {"top", std::move(top)}};
}

namespace {
std::string bytes_text(uint64_t b) {
  if (b == 0) return "-";
  if (b >= (1ull << 30)) return fmt::format("{:.2f}G", static_cast<double>(b) / (1ull << 30));
  if (b >= (1ull << 20)) return fmt::format("{:.1f}M", static_cast<double>(b) / (1ull << 20));
  if (b >= (1ull << 10)) return fmt::format("{:.1f}K", static_cast<double>(b) / (1ull << 10));
  return fmt::format("{}", b);
}

std::string row(const std::string& label, const MergedStep& s) {
  return fmt::format(
      "{:>6} {:>5} {:>9.3f} {:>9.3f} {:>9.3f} {:>9.3f} {:>9.3f} {:>9.3f} {:>9.3f} {:>9.3f} {:>9.3f} {:>7.1f} {:>9} "
      "{:>9} {:>9}\n",
      label, s.ranks, s.step_ms.max, s.step_ms.mean, s.compute_ms.mean, s.comm_ms.mean, s.exposed_comm_ms.max,
      s.exposed_comm_ms.mean, s.exposed_wait_ms.mean, s.exposed_memcpy_ms.mean, s.idle_ms.mean, s.overlap_pct.mean,
      bytes_text(s.app_bytes), bytes_text(s.wire_bytes), bytes_text(s.plain_wire_bytes));
}
}  // namespace

std::string format_table(const MergedReport& m, size_t max_rows) {
  std::string out = fmt::format("fp8wire exposure report: {} rank(s), {} step(s); ms unless noted\n",
                                m.ranks, m.steps.size());
  // expo.wait: the part of expo.avg spent inside collectives with none of their kernels running.
  // nccl.wire: what NCCL's own algorithms send for the same calls (computed), beside what went on the wire.
  out += fmt::format("{:>6} {:>5} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>7} {:>9} {:>9} {:>9}\n",
                     "step", "ranks", "step.max", "step.avg", "compute", "comm", "expo.max", "expo.avg", "expo.wait",
                     "memcpy", "idle", "ovl%", "app", "wire", "nccl.wire");
  for (size_t i = 0; i < m.steps.size(); ++i) {
    if (i == max_rows && m.steps.size() > max_rows) {
      out += fmt::format("{:>6} ({} more steps)\n", "...", m.steps.size() - max_rows);
      break;
    }
    out += row(std::to_string(m.steps[i].step), m.steps[i]);
  }
  if (!m.steps.empty()) out += row("mean", m.mean);
  if (!m.top.empty()) {
    out += "top exposed collectives:\n";
    // exposed = data (a kernel of it running) + wait (inside it, none running: peers, its other lane)
    // err%: the relative quantization error of a measured call's inputs (telemetry), "-" otherwise
    out += fmt::format("{:>4} {:>6} {:>6} {:>5} {:>14} {:>9} {:>9} {:>9} {:>9} {:>6} {:>11} {:>11} {:>9} {:>6}  {}\n",
                       "rank", "step", "seq", "#", "collective", "dur", "exposed", "data", "wait", "dtype", "path",
                       "transport", "bytes", "err%", "nvtx range");
    for (const RankedCollective& t : m.top) {
      const CollectiveReport& c = t.collective;
      out += fmt::format("{:>4} {:>6} {:>6} {:>5} {:>14} {:>9.3f} {:>9.3f} {:>9.3f} {:>9.3f} {:>6} {:>11} {:>11} {:>9} {:>6}  {}\n",
                         t.rank, t.step, c.seq, c.ordinal, c.name.substr(0, 14), c.duration_ms, c.exposed_ms,
                         c.exposed_data_ms, c.exposed_wait_ms, c.dtype.empty() ? "-" : c.dtype,
                         c.path.empty() ? "-" : c.path, c.transport.empty() ? "-" : c.transport.substr(0, 11),
                         bytes_text(c.app_bytes), c.rel_error < 0 ? "-" : fmt::format("{:.2f}", 100 * c.rel_error),
                         c.range.empty() ? "-" : c.range);
    }
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// Trace

namespace {
enum Track : int {
  kSteps = 0, kCompute = 1, kComm = 2, kExposedComm = 3, kExposedWait = 4, kExposedMemcpy = 5, kCollectives = 6
};
constexpr const char* kTrackNames[] = {"steps", "compute", "communication", "exposed communication",
                                       "exposed wait for peers", "exposed memcpy", "top exposed collectives"};
}  // namespace

TraceWriter::~TraceWriter() { close(); }

bool TraceWriter::open(const std::string& path, int rank, std::string& error) {
  close();
  file_ = fopen_output(path, OutputMode::truncate, error);
  if (!file_) return false;
  rank_ = rank;
  events_ = 0;
  std::fputs("[\n", file_);
  std::fprintf(file_, "{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":%d,\"args\":{\"name\":\"rank %d\"}}", rank,
               rank);
  for (int t = 0; t <= kCollectives; ++t)
    std::fprintf(file_,
                 ",\n{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":%d,\"tid\":%d,\"args\":{\"name\":\"%s\"}}"
                 ",\n{\"ph\":\"M\",\"name\":\"thread_sort_index\",\"pid\":%d,\"tid\":%d,\"args\":{\"sort_index\":%d}}",
                 rank, t, kTrackNames[t], rank, t, t);
  return true;
}

void TraceWriter::event(const char* name, int track, int64_t begin_ns, int64_t duration_ns, const json* args) {
  if (!file_) return;
  if (events_ >= max_events_) {
    ++dropped_;
    return;
  }
  ++events_;
  // Chrome trace times are microseconds; three decimals keep nanosecond resolution.
  std::fprintf(file_, ",\n{\"ph\":\"X\",\"name\":%s,\"pid\":%d,\"tid\":%d,\"ts\":%.3f,\"dur\":%.3f",
               dump_json(json(name)).c_str(), rank_, track, static_cast<double>(begin_ns) * 1e-3,
               static_cast<double>(duration_ns) * 1e-3);
  if (args) std::fprintf(file_, ",\"args\":%s", dump_json(*args).c_str());
  std::fputs("}", file_);
}

void TraceWriter::write_step(const StepReport& r, const StepTimeline& timeline) {
  if (!file_) return;
  const json step_args{{"compute_ms", r.compute_ms},     {"comm_ms", r.comm_ms},
                       {"exposed_comm_ms", r.exposed_comm_ms}, {"exposed_wait_ms", r.exposed_wait_ms},
                       {"exposed_memcpy_ms", r.exposed_memcpy_ms},
                       {"idle_ms", r.idle_ms},           {"overlap_pct", r.overlap_pct}};
  event(fmt::format("step {}", r.step).c_str(), kSteps, r.begin_ns, r.end_ns - r.begin_ns, &step_args);
  for (const Interval& i : timeline.compute.intervals()) event("compute", kCompute, i.begin, i.length(), nullptr);
  for (const Interval& i : timeline.comm.intervals()) event("communication", kComm, i.begin, i.length(), nullptr);
  for (const Interval& i : timeline.exposed_comm.intervals())
    event("exposed", kExposedComm, i.begin, i.length(), nullptr);
  for (const Interval& i : timeline.exposed_wait.intervals())
    event("waiting", kExposedWait, i.begin, i.length(), nullptr);
  for (const Interval& i : timeline.exposed_memcpy.intervals())
    event("exposed memcpy", kExposedMemcpy, i.begin, i.length(), nullptr);
  for (const CollectiveReport& c : r.top) {
    const json args = to_json(c);
    event(c.name.c_str(), kCollectives, std::max(c.begin_ns, r.begin_ns),
          static_cast<int64_t>(c.duration_ms * 1e6), &args);
  }
  std::fflush(file_);
}

void TraceWriter::close() {
  if (!file_) return;
  std::fputs("\n]\n", file_);
  std::fclose(file_);
  file_ = nullptr;
}

}  // namespace fp8wire::prof
