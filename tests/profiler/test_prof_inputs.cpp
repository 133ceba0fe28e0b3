// Bad and large inputs of the profiler's host code: Kineto traces with wrongly typed fields,
// out-of-range times, gzip (whole and damaged), traces with many ranges and communication kernels
// (near-linear time, checked against the brute-force definitions), per-rank reports with wrongly
// typed fields or a torn last line.
#include <doctest/doctest.h>
#include <zlib.h>

#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <random>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "profiler/exposure.hpp"
#include "profiler/kineto.hpp"
#include "profiler/report.hpp"

using namespace fp8wire::prof;
using nlohmann::json;

namespace {

// A well-formed one-step trace whose event `index` (0-based) gets `field` replaced by `value`.
std::string trace_with(const std::string& field_path, const json& value) {
  json events = json::array();
  events.push_back({{"ph", "X"}, {"cat", "user_annotation"}, {"name", "ProfilerStep#1"}, {"pid", 1}, {"tid", 1},
                    {"ts", 0}, {"dur", 100}});
  events.push_back({{"ph", "X"}, {"cat", "kernel"}, {"name", "ncclDevKernel_AllReduce"}, {"pid", 1}, {"tid", 2},
                    {"ts", 10}, {"dur", 20}, {"args", {{"correlation", 5}}}});
  json doc = {{"traceEvents", events}, {"distributedInfo", {{"rank", 0}}}};
  doc[json::json_pointer(field_path)] = value;
  return doc.dump();
}

bool analyze(const std::string& text, std::string& error, KinetoAnalysis* out = nullptr) {
  KinetoAnalysis a;
  const bool ok = analyze_kineto_text(text, KernelClassifier(), KinetoOptions{}, a, error);
  if (out) *out = std::move(a);
  return ok;
}

std::string temp_path(const std::string& name) {
  return fmt::format("/tmp/fp8wire_test_prof_inputs_{}_{}", ::getpid(), name);
}

void write_gzip(const std::string& path, const std::string& text) {
  gzFile f = gzopen(path.c_str(), "wb");
  REQUIRE(f != nullptr);
  REQUIRE(gzwrite(f, text.data(), static_cast<unsigned>(text.size())) == static_cast<int>(text.size()));
  REQUIRE(gzclose(f) == Z_OK);
}

}  // namespace

TEST_CASE("kineto: a field of the wrong JSON type is an error naming the event and the field, not a crash") {
  std::string error;
  KinetoAnalysis good;
  REQUIRE(analyze(trace_with("/traceEvents/1/dur", 20), error, &good));
  REQUIRE(good.steps.size() == 1);
  CHECK(good.steps[0].exposed_comm_ms == doctest::Approx(0.02));

  const struct {
    const char* path;
    json value;
    const char* expected;
  } cases[] = {
      {"/traceEvents/1/cat", 7, "event 2 (name \"ncclDevKernel_AllReduce\"): \"cat\" is 7, expected a string"},
      {"/traceEvents/1/ph", 5, "\"ph\" is 5, expected a string"},
      {"/traceEvents/1/name", json::array({"a"}), "event 2 (cat \"kernel\"): \"name\" is an array, expected a string"},
      {"/traceEvents/1/args/correlation", "abc", "\"args.correlation\" is \"abc\", expected an integer"},
      {"/traceEvents/1/args", 3, "\"args\" is 3, expected an object"},
      {"/traceEvents/1/pid", json::object(), "\"pid\" is an object, expected an integer or a string"},
      {"/distributedInfo/rank", "zero", "\"distributedInfo.rank\" is \"zero\", expected a non-negative integer"},
      {"/distributedInfo/rank", -1, "\"distributedInfo.rank\" is -1, expected a non-negative integer"},
      {"/distributedInfo", "rank0", "\"distributedInfo\" is \"rank0\", expected an object"},
      {"/traceEvents/1", 42, "event 2: expected an object, got 42"},
      {"/traceEvents/1", json::array(), "event 2: expected an object, got an array"},
      {"/traceEvents", json::object(), "\"traceEvents\" is an object, expected an array"},
      {"/traceEvents/1/ts", "soon", "\"ts\" and \"dur\" must be numbers (microseconds), got ts \"soon\""},
  };
  for (const auto& c : cases) {
    CAPTURE(c.path);
    error.clear();
    CHECK(!analyze(trace_with(c.path, c.value), error));
    CHECK(error.find(c.expected) != std::string::npos);
    CHECK(error.find('\n') == std::string::npos);  // one line
  }
  CHECK(!analyze("42", error));
  CHECK(error.find("traceEvents") != std::string::npos);
  CHECK(!analyze("", error));
  CHECK(error.starts_with("not valid JSON"));
}

TEST_CASE("kineto: pids and tids given as strings (hashed to any 64-bit value) identify threads without overflow") {
  // Found by fuzz_kineto under UBSan: the thread key multiplied a hashed pid in signed arithmetic.
  json doc = json::parse(trace_with("/traceEvents/1/dur", 20));
  doc["traceEvents"].push_back({{"ph", "X"}, {"cat", "cuda_runtime"}, {"name", "cudaLaunchKernel"},
                                {"pid", "Spans of a long name"}, {"tid", "thread 9"}, {"ts", 1}, {"dur", 1},
                                {"args", {{"correlation", 5}}}});
  doc["traceEvents"].push_back({{"ph", "X"}, {"cat", "user_annotation"}, {"name", "bucket"},
                                {"pid", "Spans of a long name"}, {"tid", "thread 9"}, {"ts", 0}, {"dur", 5}});
  KinetoAnalysis a;
  std::string error;
  REQUIRE(analyze(doc.dump(), error, &a));
  REQUIRE(a.steps.size() == 1);
  REQUIRE(a.steps[0].top.size() == 1);
  CHECK(a.steps[0].top[0].range == "bucket");
}

TEST_CASE("kineto: times that do not fit the nanosecond timeline and negative durations are errors") {
  std::string error;
  CHECK(!analyze(trace_with("/traceEvents/1/ts", 1e300), error));
  CHECK(error.find("\"ts\" is 1e+300, expected microseconds within +-4e+15") != std::string::npos);
  CHECK(!analyze(trace_with("/traceEvents/1/ts", -1e300), error));
  CHECK(!analyze(trace_with("/traceEvents/1/dur", 1e300), error));
  CHECK(error.find("\"dur\" is 1e+300") != std::string::npos);
  CHECK(!analyze(trace_with("/traceEvents/1/dur", -5), error));
  CHECK(error.find("\"dur\" is -5, expected a duration of 0 or more microseconds") != std::string::npos);
  CHECK(!analyze(trace_with("/traceEvents/0/dur", -0.5), error));  // the step window too
  CHECK(error.find("event 1 (cat \"user_annotation\"") != std::string::npos);
  CHECK(!analyze(trace_with("/traceEvents/1/ts", 18446744073709551615ull), error));
  // The largest accepted values still add up without overflow (checked under UBSan in CI).
  KinetoAnalysis a;
  std::string text = trace_with("/traceEvents/1/ts", kMaxTraceMicroseconds);
  text = json::parse(text).dump();
  json doc = json::parse(text);
  doc["traceEvents"][1]["dur"] = kMaxTraceMicroseconds;
  doc["traceEvents"][0]["ts"] = kMaxTraceMicroseconds;
  doc["traceEvents"][0]["dur"] = kMaxTraceMicroseconds;
  REQUIRE(analyze(doc.dump(), error, &a));
  REQUIRE(a.steps.size() == 1);
  CHECK(a.steps[0].comm_ms == doctest::Approx(kMaxTraceMicroseconds * 1e-3));
}

TEST_CASE("kineto: gzip traces read like plain ones; a damaged one is an error naming the file") {
  const std::string text = trace_with("/traceEvents/1/dur", 20);
  const std::string plain = temp_path("trace.json");
  const std::string gz = temp_path("trace.json.gz");
  const std::string gz_no_suffix = temp_path("trace_compressed");
  std::ofstream(plain) << text;
  write_gzip(gz, text);
  write_gzip(gz_no_suffix, text);
  KinetoAnalysis a, b, c;
  std::string error;
  REQUIRE(analyze_kineto_file(plain, KernelClassifier(), KinetoOptions{}, a, error));
  REQUIRE(analyze_kineto_file(gz, KernelClassifier(), KinetoOptions{}, b, error));
  REQUIRE(analyze_kineto_file(gz_no_suffix, KernelClassifier(), KinetoOptions{}, c, error));
  REQUIRE(a.steps.size() == 1);
  REQUIRE(b.steps.size() == 1);
  CHECK(to_json(a.steps[0]) == to_json(b.steps[0]));
  CHECK(to_json(a.steps[0]) == to_json(c.steps[0]));

  // Cut the compressed file in half: the stream ends early and zlib says so.
  std::string bytes;
  {
    std::ifstream in(gz, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  const std::string cut = temp_path("cut.json.gz");
  std::ofstream(cut, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size() / 2));
  CHECK(!analyze_kineto_file(cut, KernelClassifier(), KinetoOptions{}, a, error));
  CHECK(error.starts_with(cut + ": "));
  CHECK(error.find("gzip") != std::string::npos);
  // A flipped byte in the deflate data.
  std::string flipped = bytes;
  flipped[flipped.size() / 2] = static_cast<char>(flipped[flipped.size() / 2] ^ 0x5a);
  const std::string bad = temp_path("flipped.json.gz");
  std::ofstream(bad, std::ios::binary).write(flipped.data(), static_cast<std::streamsize>(flipped.size()));
  CHECK(!analyze_kineto_file(bad, KernelClassifier(), KinetoOptions{}, a, error));
  CHECK(error.starts_with(bad + ": "));

  CHECK(!analyze_kineto_file("/tmp", KernelClassifier(), KinetoOptions{}, a, error));
  CHECK(error == "cannot open '/tmp': not a regular file");
  for (const std::string& p : {plain, gz, gz_no_suffix, cut, bad}) std::remove(p.c_str());
}

namespace {
// Brute force: the innermost (shortest, then first) annotation of `thread` open at `when`.
uint32_t brute_range(const std::vector<std::tuple<int, int64_t, int64_t, uint32_t>>& ann, int thread, int64_t when) {
  uint32_t best = kNoName;
  int64_t best_length = INT64_MAX;
  for (const auto& [t, b, e, name] : ann)
    if (t == thread && b <= when && when < e && e - b < best_length) {
      best_length = e - b;
      best = name;
    }
  return best;
}
}  // namespace

TEST_CASE("kineto: range attribution and step figures match the brute-force definitions on random traces") {
  std::mt19937_64 rng(2024);
  for (int trial = 0; trial < 40; ++trial) {
    json events = json::array();
    std::vector<std::tuple<int, int64_t, int64_t, uint32_t>> ann;  // thread, begin, end (us), name index
    std::vector<std::tuple<int, int64_t>> launch_of;              // per comm kernel: thread, launch time
    for (int s = 0; s < 4; ++s)  // steps, some overlapping
      events.push_back({{"ph", "X"}, {"cat", "user_annotation"}, {"name", fmt::format("ProfilerStep#{}", s)},
                        {"pid", 1}, {"tid", 1}, {"ts", s * 200 + static_cast<int>(rng() % 50)},
                        {"dur", 150 + static_cast<int>(rng() % 150)}});
    for (int i = 0; i < 60; ++i) {
      const int thread = static_cast<int>(rng() % 3);
      const int64_t b = static_cast<int64_t>(rng() % 1000);
      const int64_t e = b + 1 + 2 * i;  // distinct lengths: "innermost" is unambiguous whatever the file order
      ann.emplace_back(thread, b, e, static_cast<uint32_t>(i));
      events.push_back({{"ph", "X"}, {"cat", "user_annotation"}, {"name", fmt::format("range{}", i)}, {"pid", 1},
                        {"tid", thread}, {"ts", b}, {"dur", e - b}});
    }
    std::vector<Activity> acts;
    for (int k = 0; k < 80; ++k) {
      const bool comm = rng() % 2;
      const int64_t b = static_cast<int64_t>(rng() % 1100);
      const int64_t d = static_cast<int64_t>(rng() % 60);
      events.push_back({{"ph", "X"}, {"cat", "kernel"}, {"name", comm ? "ncclKernel_x" : "gemm"}, {"pid", 0},
                        {"tid", 7}, {"ts", b}, {"dur", d}, {"args", {{"correlation", 1000 + k}}}});
      acts.push_back({{b * 1000, (b + d) * 1000}, comm ? ActivityClass::communication : ActivityClass::compute});
      if (comm) {
        const int thread = static_cast<int>(rng() % 3);
        const int64_t when = static_cast<int64_t>(rng() % 1000);
        launch_of.emplace_back(thread, when);
        events.push_back({{"ph", "X"}, {"cat", "cuda_runtime"}, {"name", "cudaLaunchKernel"}, {"pid", 1},
                          {"tid", thread}, {"ts", when}, {"dur", 1}, {"args", {{"correlation", 1000 + k}}}});
      }
    }
    std::shuffle(events.begin(), events.end(), rng);
    KinetoAnalysis a;
    std::string error;
    KinetoOptions options;
    options.top_n = 1000;
    REQUIRE(analyze_kineto_text(json{{"traceEvents", events}}.dump(), KernelClassifier(), options, a, error));
    // Expected figures: compute_step per window over every activity (the definition).
    std::vector<StepWindow> windows;
    for (const json& e : events)
      if (e["name"].get<std::string>().starts_with("ProfilerStep#"))
        windows.push_back({std::stoll(e["name"].get<std::string>().substr(13)),
                           {e["ts"].get<int64_t>() * 1000, (e["ts"].get<int64_t>() + e["dur"].get<int64_t>()) * 1000}});
    std::sort(windows.begin(), windows.end(),
              [](const StepWindow& x, const StepWindow& y) { return x.time.begin < y.time.begin; });
    REQUIRE(a.steps.size() == windows.size());
    for (size_t w = 0; w < windows.size(); ++w) {
      StepInput in;
      in.window = windows[w];
      in.activities = acts;
      const StepReport want = compute_step(in);
      CHECK(a.steps[w].step == want.step);
      CHECK(a.steps[w].compute_ms == doctest::Approx(want.compute_ms));
      CHECK(a.steps[w].exposed_comm_ms == doctest::Approx(want.exposed_comm_ms));
      CHECK(a.steps[w].idle_ms == doctest::Approx(want.idle_ms));
      CHECK(a.steps[w].calls == want.calls);
    }
    // Every reported collective's range is the brute-force innermost range at its launch.
    for (const StepReport& s : a.steps)
      for (const CollectiveReport& c : s.top) {
        // Kernel k is identified by its start; find the comm kernel of that start.
        bool found = false;
        size_t comm_index = 0;
        for (size_t k = 0; k < acts.size(); ++k) {
          if (acts[k].cls != ActivityClass::communication) continue;
          if (acts[k].time.begin == c.begin_ns && !found) {
            const auto [thread, when] = launch_of[comm_index];
            const uint32_t want = brute_range(ann, thread, when);
            const std::string want_name = want == kNoName ? "" : fmt::format("range{}", want);
            if (c.range == want_name) found = true;
          }
          ++comm_index;
        }
        CHECK(found);
      }
  }
}

TEST_CASE("kineto: many steps, ranges and communication kernels take near-linear time") {
  // 32k communication kernels and 32k annotation ranges on one thread took 143 s when every kernel
  // scanned every range and every step scanned every kernel. Judged by how the time grows, not by a
  // wall-clock figure (the sanitizer tier runs this beside other tests on a 2-core machine): four
  // times the trace must take less than eight times as long (linear: 4, n log n: ~4.4, quadratic: 16).
  constexpr int kSteps = 2000, kPerStep = 16;
  auto make_trace = [](int steps) {
    std::string text = "{\"traceEvents\":[";
    int64_t corr = 1;
    for (int s = 0; s < steps; ++s) {
      const int64_t base = int64_t{s} * 10'000;
      text += fmt::format(R"({{"ph":"X","cat":"user_annotation","name":"ProfilerStep#{}","pid":1,"tid":1,"ts":{},"dur":9000}},)",
                          s, base);
      for (int k = 0; k < kPerStep; ++k) {
        const int64_t t = base + 100 + k * 500;
        text += fmt::format(R"({{"ph":"X","cat":"user_annotation","name":"bucket_{}","pid":1,"tid":1,"ts":{},"dur":400}},)",
                            k, t);
        text += fmt::format(R"({{"ph":"X","cat":"cuda_runtime","name":"cudaLaunchKernel","pid":1,"tid":1,"ts":{},"dur":1,"args":{{"correlation":{}}}}},)",
                            t + 10, corr);
        text += fmt::format(R"({{"ph":"X","cat":"kernel","name":"ncclDevKernel_AllReduce_Sum_bf16_RING_LL","pid":0,"tid":7,"ts":{},"dur":300,"args":{{"correlation":{}}}}},)",
                            t + 20, corr);
        text += fmt::format(R"({{"ph":"X","cat":"kernel","name":"gemm","pid":0,"tid":8,"ts":{},"dur":200}},)", t + 50);
        ++corr;
      }
    }
    text.back() = ']';
    text += "}";
    return text;
  };
  auto timed = [](const std::string& text, KinetoAnalysis& out) {
    const auto start = std::chrono::steady_clock::now();
    std::string error;
    REQUIRE(analyze_kineto_text(text, KernelClassifier(), KinetoOptions{}, out, error));
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  KinetoAnalysis quarter;
  const std::string small = make_trace(kSteps / 4);
  // The faster of two runs of the small trace: a stall of the machine must not make it look cheap.
  const double t_small = std::min(timed(small, quarter), timed(small, quarter));
  const std::string text = make_trace(kSteps);
  KinetoAnalysis a;
  const double seconds = timed(text, a);
  MESSAGE(fmt::format("{} steps, {} kernels ({} communication), {} bytes: {:.2f} s; a quarter of it {:.2f} s ({:.1f}x)",
                      a.steps.size(), a.kernels, a.comm_kernels, text.size(), seconds, t_small, seconds / t_small));
  CHECK(seconds < 8.0 * t_small);
  CHECK(seconds < 120.0);  // a backstop: the quadratic version took 143 s for less
  REQUIRE(a.steps.size() == kSteps);
  CHECK(a.comm_kernels == kSteps * kPerStep);
  // Each all-reduce 20..320 us into its 400-us range, 150 us hidden behind the gemm at 50..250.
  CHECK(a.steps[kSteps / 2].comm_ms == doctest::Approx(kPerStep * 0.3));
  CHECK(a.steps[kSteps / 2].exposed_comm_ms == doctest::Approx(kPerStep * 0.1));
  REQUIRE(!a.steps.back().top.empty());
  CHECK(a.steps.back().top[0].range.starts_with("bucket_"));
}

TEST_CASE("per-rank reports: wrongly typed fields are errors, a torn last line a warning") {
  StepReport r;
  std::string error;
  CHECK(!step_report_from_json(json::parse(R"({"type":"step","step":"abc"})"), r, error));
  CHECK(error == "\"step\" is \"abc\", expected an integer");
  CHECK(!step_report_from_json(json::parse(R"({"step":1,"step_ms":"fast"})"), r, error));
  CHECK(error == "\"step_ms\" is \"fast\", expected a number");
  CHECK(!step_report_from_json(json::parse(R"({"app_bytes":-1})"), r, error));
  CHECK(error == "\"app_bytes\" is -1, expected a non-negative integer");
  CHECK(!step_report_from_json(json::parse(R"({"rank":1e20})"), r, error));
  CHECK(!step_report_from_json(json::parse(R"({"rank":4294967296})"), r, error));
  CHECK(!step_report_from_json(json::parse(R"({"top":[{"range":5}]})"), r, error));
  CHECK(error == "\"top\"[0]: \"range\" is 5, expected a string");
  CHECK(!step_report_from_json(json::parse(R"({"top":[7]})"), r, error));
  CHECK(error == "\"top\"[0]: is 7, expected an object");
  CHECK(!step_report_from_json(json::parse(R"({"top":{}})"), r, error));
  REQUIRE(step_report_from_json(json::parse(R"({"step":3,"step_ms":2,"rank":1})"), r, error));
  CHECK(r.step == 3);

  const std::string path = temp_path("rank0.jsonl");
  {
    std::ofstream out(path);
    out << R"({"type":"step","rank":0,"step":1,"step_ms":10})" << "\n"
        << R"({"type":"step","rank":0,"step":2,"step_ms":11})" << "\n"
        << R"({"type":"step","rank":0,"st)";  // killed while writing
  }
  std::vector<std::string> errors, warnings;
  CHECK(read_step_reports({path}, errors, warnings).size() == 2);
  CHECK(errors.empty());
  REQUIRE(warnings.size() == 1);
  CHECK(warnings[0] == path + ":3: incomplete last line skipped (the process was killed while writing it?)");
  {
    std::ofstream out(path);
    out << R"({"type":"step","rank":0,"step":"abc"})" << "\n" << R"({"type":5})" << "\n";
  }
  errors.clear();
  warnings.clear();
  CHECK(read_step_reports({path}, errors, warnings).empty());
  REQUIRE(errors.size() == 2);
  CHECK(errors[0] == path + ":1: \"step\" is \"abc\", expected an integer");
  CHECK(errors[1] == path + ":2: \"type\" is 5, expected a string");
  std::remove(path.c_str());
}

namespace {
std::string step_line(int rank, int64_t step) {
  return fmt::format(R"({{"type":"step","rank":{},"step":{},"step_ms":10,"exposed_comm_ms":2}})", rank, step) + "\n";
}
}  // namespace

TEST_CASE("per-rank reports: a (rank, step) reported twice is an error naming both places, never a second sample") {
  const std::string a = temp_path("dup_rank0.jsonl"), b = temp_path("dup_pid77.jsonl");
  std::ofstream(a) << step_line(0, 1) << step_line(0, 2) << step_line(1, 1);
  std::ofstream(b) << step_line(0, 1) << step_line(0, 2);  // an earlier run's file, named by pid
  std::vector<std::string> errors, warnings;
  read_step_reports({a, b}, errors, warnings);
  REQUIRE(errors.size() == 2);
  CHECK(errors[0] == b + ":1: rank 0 step 1 was already reported at " + a +
                         ":1 (reports of two runs in one folder? fp8wire-prof --out empties its folder first; merge one "
                         "run's files at a time)");
  CHECK(errors[1].starts_with(b + ":2: rank 0 step 2 was already reported at " + a + ":2"));
  // Within one file too; past kDuplicatesNamed the rest are counted in one line.
  {
    std::ofstream out(a);
    for (int round = 0; round < 2; ++round)
      for (int step = 0; step < 20; ++step) out << step_line(0, step);
  }
  errors.clear();
  read_step_reports({a}, errors, warnings);
  REQUIRE(errors.size() == kDuplicatesNamed + 1);
  CHECK(errors[0].starts_with(a + ":21: rank 0 step 0 was already reported at " + a + ":1"));
  CHECK(errors.back() == "15 more (rank, step) reports that repeat an earlier one");
  std::remove(a.c_str());
  std::remove(b.c_str());
}

TEST_CASE("per-rank reports: inputs with no line the profiler writes are refused, naming them and a recognised line") {
  const std::string foreign = temp_path("metrics.jsonl"), empty = temp_path("empty.jsonl"),
                    good = temp_path("good.jsonl");
  std::ofstream(foreign) << R"({"step":1,"loss":0.5})" << "\n" << R"({"type":"other"})" << "\n";
  std::ofstream(empty) << "";
  std::ofstream(good) << step_line(0, 1);
  const std::string recognised =
      "expected JSON lines such as {\"type\":\"step\",\"rank\":0,\"step\":1,\"step_ms\":...}, which libfp8wire_prof.so "
      "writes into the folder given to fp8wire-prof --out";
  std::vector<std::string> errors, warnings;
  CHECK(read_step_reports({foreign, empty}, errors, warnings).empty());
  REQUIRE(errors.size() == 1);
  CHECK(errors[0] == "no profiler report line in " + foreign + ", " + empty + ": " + recognised);
  // Beside real reports, such a file (a rank killed before its first step leaves an empty one) is
  // skipped with a warning and the reports stand.
  errors.clear();
  warnings.clear();
  CHECK(read_step_reports({good, empty}, errors, warnings).size() == 1);
  CHECK(errors.empty());
  REQUIRE(warnings.size() == 1);
  CHECK(warnings[0] == "no profiler report line in " + empty + "; skipped (" + recognised + ")");
  for (const std::string& p : {foreign, empty, good}) std::remove(p.c_str());
}

TEST_CASE("input limits: a report line or a trace nested a million deep is an error, never a stack overflow") {
  const size_t deep = 1'000'000;
  const std::string nest = std::string(deep, '[') + std::string(deep, ']');
  // A report line whose "rank" is such an array: nlohmann's parse, copy and dump recurse per level.
  const std::string path = temp_path("deep_rank0.jsonl");
  std::ofstream(path) << step_line(0, 1) << R"({"type":"step","rank":)" << nest << R"(,"step":2})" << "\n"
                      << step_line(0, 3);
  std::vector<std::string> errors, warnings;
  read_step_reports({path}, errors, warnings);
  REQUIRE(errors.size() == 1);
  CHECK(errors[0] == path + ":2: column 278: JSON nested deeper than its limit of 256 levels");
  // A line longer than the limit is refused without being held whole.
  {
    std::ofstream out(path);
    out << step_line(0, 1) << R"({"type":"step","name":")" << std::string(kMaxReportLineBytes, 'x') << "\"}\n";
  }
  errors.clear();
  read_step_reports({path}, errors, warnings);
  REQUIRE(errors.size() == 1);
  CHECK(errors[0] == path + ":2: a line longer than the limit of 67108864 bytes (64 MiB) for a profiler report line");
  std::remove(path.c_str());

  // Kineto: nested in an event's args, or in a key the reader skips, as text, file and gzip file.
  const std::string in_args = R"({"traceEvents":[{"ph":"X","cat":"kernel","name":"k","ts":1,"dur":1,"args":{"a":)" +
                              nest + "}}]}";
  const std::string in_other_key = R"({"deep":)" + nest + R"(,"traceEvents":[]})";
  std::string error;
  CHECK(!analyze(in_args, error));
  CHECK(error == "line 1, column 332: JSON nested deeper than its limit of 256 levels");
  CHECK(!analyze(in_other_key, error));
  CHECK(error == "line 1, column 264: JSON nested deeper than its limit of 256 levels");
  const std::string plain = temp_path("deep.json"), gz = temp_path("deep.json.gz");
  std::ofstream(plain) << in_other_key;
  write_gzip(gz, in_other_key);
  KinetoAnalysis a;
  for (const std::string& file : {plain, gz}) {
    CHECK(!analyze_kineto_file(file, KernelClassifier(), KinetoOptions{}, a, error));
    CHECK(error == file + ": line 1, column 264: JSON nested deeper than its limit of 256 levels");
  }
  std::remove(plain.c_str());
  std::remove(gz.c_str());
}

TEST_CASE("compute_steps equals compute_step per window, for overlapping and nested windows too") {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<Activity> acts;
    for (int i = 0, n = static_cast<int>(rng() % 50); i < n; ++i) {
      const int64_t b = static_cast<int64_t>(rng() % 1000);
      acts.push_back({{b, b + static_cast<int64_t>(rng() % 300)}, static_cast<ActivityClass>(rng() % 3)});
    }
    std::vector<StepWindow> windows;
    for (int w = 0, n = static_cast<int>(rng() % 8); w < n; ++w) {
      const int64_t b = static_cast<int64_t>(rng() % 1000);
      windows.push_back({w, {b, b + static_cast<int64_t>(rng() % 500)}});
    }
    const auto got = compute_steps(windows, acts, {}, nullptr, 5, 3);
    REQUIRE(got.size() == windows.size());
    for (size_t w = 0; w < windows.size(); ++w) {
      StepInput in;
      in.window = windows[w];
      in.activities = acts;
      in.top_n = 5;
      in.rank = 3;
      CHECK(to_json(got[w]) == to_json(compute_step(in)));
    }
  }
}
