#include "profiler/kineto.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <fstream>
#include <sstream>
#include <unordered_map>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace fp8wire::prof {

using nlohmann::json;

bool match_step_name(std::string_view name, const std::vector<std::string>& prefixes, int64_t fallback,
                     int64_t& step) {
  for (const std::string& prefix : prefixes) {
    if (prefix.empty() || !name.starts_with(prefix)) continue;
    std::string_view rest = name.substr(prefix.size());
    // "step", "step 7", "step#7", "ProfilerStep#7": the first run of digits is the step number.
    const size_t digit = rest.find_first_of("0123456789");
    int64_t value = fallback;
    if (digit != std::string_view::npos && rest.find_first_not_of(" #_:=-") == digit) {
      const char* first = rest.data() + digit;
      const char* last = rest.data() + rest.size();
      if (std::from_chars(first, last, value).ec != std::errc()) value = fallback;
    } else if (!rest.empty() && rest.find_first_not_of(" ") != std::string_view::npos) {
      continue;  // "stepper": a different name that merely starts with "step"
    }
    step = value;
    return true;
  }
  return false;
}

namespace {
int64_t us_to_ns(const json& v) { return static_cast<int64_t>(std::llround(v.get<double>() * 1000.0)); }

struct Annotation {
  int64_t pid_tid_key;
  Interval time;
  uint32_t name;
};

int64_t thread_key(const json& e) {
  auto id = [](const json& v) -> int64_t {
    if (v.is_number_integer()) return v.get<int64_t>();
    if (v.is_string()) return static_cast<int64_t>(std::hash<std::string>{}(v.get<std::string>()));
    return 0;
  };
  return id(e.value("pid", json(0))) * 1000003 + id(e.value("tid", json(0)));
}
}  // namespace

bool analyze_kineto_text(const std::string& json_text, const KernelClassifier& classifier,
                         const KinetoOptions& options, KinetoAnalysis& out, std::string& error) {
  json root = json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded()) {
    error = "not valid JSON";
    return false;
  }
  const json* events = nullptr;
  if (root.is_array()) {
    events = &root;
  } else if (root.is_object() && root.contains("traceEvents") && root["traceEvents"].is_array()) {
    events = &root["traceEvents"];
    if (auto d = root.find("distributedInfo"); d != root.end() && d->is_object())
      out.rank = d->value("rank", 0);
  } else {
    error = "expected a JSON array of events or an object with a \"traceEvents\" array";
    return false;
  }

  NameTable names;
  std::vector<Activity> activities;
  std::vector<int64_t> kernel_correlation;  // parallel to activities
  std::vector<StepWindow> steps;
  std::vector<Annotation> annotations;
  std::unordered_map<int64_t, std::pair<int64_t, int64_t>> launch_of;  // correlation -> (thread, ts)
  int64_t unnumbered_steps = 0;

  size_t index = 0;
  for (const json& e : *events) {
    ++index;
    if (!e.is_object() || e.value("ph", "") != "X") continue;
    const std::string cat = e.value("cat", "");
    const auto ts = e.find("ts");
    const auto dur = e.find("dur");
    if (ts == e.end() || dur == e.end() || !ts->is_number() || !dur->is_number()) {
      if (cat == "kernel" || cat == "gpu_memcpy" || cat == "gpu_memset" || cat == "user_annotation") {
        error = fmt::format("event {} (cat \"{}\"): \"ts\" and \"dur\" must be numbers (microseconds)", index, cat);
        return false;
      }
      continue;
    }
    const Interval time{us_to_ns(*ts), us_to_ns(*ts) + us_to_ns(*dur)};
    const std::string name = e.value("name", "");
    const json args = e.value("args", json::object());
    const int64_t correlation = args.is_object() ? args.value("correlation", int64_t{-1}) : -1;
    if (cat == "kernel") {
      const ActivityClass cls = classifier.classify_kernel(name);
      activities.push_back({time, cls, names.intern(name), kNoName, 0});
      kernel_correlation.push_back(correlation);
      ++out.kernels;
      if (cls == ActivityClass::communication) ++out.comm_kernels;
    } else if (cat == "gpu_memcpy" || cat == "gpu_memset") {
      activities.push_back({time, ActivityClass::memory, names.intern(name), kNoName, 0});
      kernel_correlation.push_back(-1);
      ++out.memory_ops;
    } else if (cat == "cpu_op" && name.starts_with("ProfilerStep#")) {
      // Older PyTorch releases recorded the step as an operator rather than an annotation.
      int64_t step = 0;
      if (match_step_name(name, options.step_prefixes, unnumbered_steps, step)) steps.push_back({step, time});
    } else if (cat == "user_annotation") {
      int64_t step = 0;
      if (match_step_name(name, options.step_prefixes, unnumbered_steps, step)) {
        ++unnumbered_steps;
        steps.push_back({step, time});
      } else {
        annotations.push_back({thread_key(e), time, names.intern(name)});
      }
    } else if ((cat == "cuda_runtime" || cat == "cuda_driver") && correlation >= 0) {
      launch_of[correlation] = {thread_key(e), time.begin};
    }
  }

  // The application's range for each communication kernel: the innermost annotation open on the
  // launching thread when the kernel was launched.
  for (size_t i = 0; i < activities.size(); ++i) {
    if (activities[i].cls != ActivityClass::communication) continue;
    auto launch = launch_of.find(kernel_correlation[i]);
    if (launch == launch_of.end()) continue;
    const auto [thread, when] = launch->second;
    int64_t best_length = std::numeric_limits<int64_t>::max();
    for (const Annotation& a : annotations) {
      if (a.pid_tid_key == thread && a.time.begin <= when && when < a.time.end && a.time.length() < best_length) {
        best_length = a.time.length();
        activities[i].range = a.name;
      }
    }
  }

  std::sort(steps.begin(), steps.end(),
            [](const StepWindow& a, const StepWindow& b) { return a.time.begin < b.time.begin; });
  // A release that records the step both ways would otherwise count it twice.
  steps.erase(std::unique(steps.begin(), steps.end(),
                          [](const StepWindow& a, const StepWindow& b) {
                            return a.step == b.step && a.time == b.time;
                          }),
              steps.end());
  for (const StepWindow& w : steps) {
    StepInput input;
    input.window = w;
    input.activities = activities;
    input.names = &names;
    input.top_n = options.top_n;
    input.rank = out.rank;
    out.steps.push_back(compute_step(input));
  }
  return true;
}

bool analyze_kineto_file(const std::string& path, const KernelClassifier& classifier,
                         const KinetoOptions& options, KinetoAnalysis& out, std::string& error) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    error = fmt::format("cannot open trace '{}'", path);
    return false;
  }
  std::stringstream buffer;
  buffer << in.rdbuf();
  if (!analyze_kineto_text(buffer.str(), classifier, options, out, error)) {
    error = fmt::format("{}: {}", path, error);
    return false;
  }
  return true;
}

}  // namespace fp8wire::prof
