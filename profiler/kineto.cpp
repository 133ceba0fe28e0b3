#include "profiler/kineto.hpp"

#include <algorithm>
#include <charconv>
#include <climits>
#include <cmath>
#include <functional>
#include <queue>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "profiler/trace_input.hpp"

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

// One JSON value of an event field as the parser delivered it: the scalar itself, or only the kind
// of a container (its contents are never needed, only named in an error).
struct Value {
  enum class Kind : uint8_t { absent, null, boolean, integer, floating, string, array, object };
  Kind kind = Kind::absent;
  bool boolean = false;
  bool is_unsigned = false;  // an integer above INT64_MAX (kept in `unsigned_value`)
  int64_t integer = 0;
  uint64_t unsigned_value = 0;
  double floating = 0;
  std::string text;

  bool present() const { return kind != Kind::absent; }
  bool is_string() const { return kind == Kind::string; }
  bool is_number() const { return kind == Kind::integer || kind == Kind::floating; }
  bool is_integer() const { return kind == Kind::integer && !is_unsigned; }
  double number() const {
    if (kind == Kind::floating) return floating;
    return is_unsigned ? static_cast<double>(unsigned_value) : static_cast<double>(integer);
  }
  // What an error message shows of it: 7, 1e+300, "abc", an array.
  std::string describe() const {
    switch (kind) {
      case Kind::absent: return "missing";
      case Kind::null: return "null";
      case Kind::boolean: return boolean ? "true" : "false";
      case Kind::integer: return is_unsigned ? std::to_string(unsigned_value) : std::to_string(integer);
      case Kind::floating: return fmt::format("{}", floating);
      case Kind::string: {
        const std::string shown = text.size() > 40 ? text.substr(0, 40) + "..." : text;
        return json(shown).dump(-1, ' ', false, json::error_handler_t::replace);
      }
      case Kind::array: return "an array";
      case Kind::object: return "an object";
    }
    return "?";
  }
};

enum class Field : uint8_t { other, ph, cat, name, ts, dur, pid, tid, args };

Field field_of(std::string_view key) {
  static constexpr std::pair<std::string_view, Field> kFields[] = {
      {"ph", Field::ph},   {"cat", Field::cat}, {"name", Field::name}, {"ts", Field::ts},
      {"dur", Field::dur}, {"pid", Field::pid}, {"tid", Field::tid},   {"args", Field::args}};
  for (const auto& [name, field] : kFields)
    if (key == name) return field;
  return Field::other;
}

// The fields of one trace event that the analysis reads.
struct RawEvent {
  Value ph, cat, name, ts, dur, pid, tid, args, correlation;
  Value* field(Field f) {
    switch (f) {
      case Field::ph: return &ph;
      case Field::cat: return &cat;
      case Field::name: return &name;
      case Field::ts: return &ts;
      case Field::dur: return &dur;
      case Field::pid: return &pid;
      case Field::tid: return &tid;
      case Field::args: return &args;
      case Field::other: return nullptr;
    }
    return nullptr;
  }
  void clear() {
    for (Value* v : {&ph, &cat, &name, &ts, &dur, &pid, &tid, &args, &correlation}) {
      v->kind = Value::Kind::absent;
      v->text.clear();
    }
  }
};

// Microseconds to integer nanoseconds, for a value already checked to be within
// kMaxTraceMicroseconds. Kineto writes epoch microseconds with three decimals (1.7e15 us): a double
// holds those only to 0.25 us, and multiplying by 1000 rounds again, so a decimal token is converted
// from its text, exactly; exponent forms fall back to the double.
int64_t to_ns(const Value& v) {
  if (v.kind == Value::Kind::integer) return v.integer * 1000;
  const std::string& t = v.text;
  size_t i = 0;
  const bool negative = i < t.size() && t[i] == '-';
  if (negative) ++i;
  int64_t whole = 0;
  size_t digits = 0;
  for (; i < t.size() && t[i] >= '0' && t[i] <= '9' && digits < 17; ++i, ++digits) whole = whole * 10 + (t[i] - '0');
  int64_t frac = 0;
  int frac_digits = 0;
  bool round_up = false, exact = digits > 0 && digits < 17;
  if (exact && i < t.size() && t[i] == '.') {
    for (++i; i < t.size() && t[i] >= '0' && t[i] <= '9'; ++i) {
      if (frac_digits < 3) {
        frac = frac * 10 + (t[i] - '0');
        ++frac_digits;
      } else if (frac_digits == 3) {
        round_up = t[i] >= '5';  // half away from zero, as llround
        ++frac_digits;
      }
    }
  }
  if (!exact || i != t.size()) return static_cast<int64_t>(std::llround(v.floating * 1000.0));
  for (; frac_digits < 3; ++frac_digits) frac *= 10;
  const int64_t ns = whole * 1000 + frac + (round_up ? 1 : 0);
  return negative ? -ns : ns;
}

int64_t id_of(const Value& v) {
  if (v.is_integer()) return v.integer;
  if (v.kind == Value::Kind::integer) return static_cast<int64_t>(v.unsigned_value);
  if (v.is_string()) return static_cast<int64_t>(std::hash<std::string>{}(v.text));
  return 0;
}

struct Annotation {
  int64_t thread;
  Interval time;
  uint32_t name;
  uint32_t order;  // position in the trace: among equally long ranges the first one wins
};

struct Launch {
  int64_t correlation;
  int64_t thread;
  int64_t time;
};

struct CommQuery {
  int64_t thread;
  int64_t time;
  size_t activity;
};

// Everything the analysis keeps from the events, and the analysis itself once they are all in.
class Accumulator {
 public:
  Accumulator(const KernelClassifier& classifier, const KinetoOptions& options, KinetoAnalysis& out)
      : classifier_(classifier), options_(options), out_(out) {}

  bool add(const RawEvent& e, size_t index, std::string& error);
  void finish();

 private:
  ActivityClass classify(uint32_t name_id);

  const KernelClassifier& classifier_;
  const KinetoOptions& options_;
  KinetoAnalysis& out_;
  NameTable names_;
  std::vector<int8_t> class_of_name_;  // by name id; -1 not classified yet
  std::vector<Activity> activities_;
  std::vector<std::pair<size_t, int64_t>> comm_correlation_;  // (activity, correlation id)
  std::vector<StepWindow> steps_;
  std::vector<Annotation> annotations_;
  std::vector<Launch> launches_;
  int64_t unnumbered_steps_ = 0;
};

ActivityClass Accumulator::classify(uint32_t id) {
  if (id >= class_of_name_.size()) class_of_name_.resize(id + 1, -1);
  if (class_of_name_[id] < 0)
    class_of_name_[id] = static_cast<int8_t>(classifier_.classify_kernel(names_.name(id)));
  return static_cast<ActivityClass>(class_of_name_[id]);
}

bool Accumulator::add(const RawEvent& e, size_t index, std::string& error) {
  auto where = [&] {
    std::string label = fmt::format("event {}", index);
    if (e.cat.is_string() || e.name.is_string()) {
      label += " (";
      if (e.cat.is_string()) label += "cat " + e.cat.describe();
      if (e.cat.is_string() && e.name.is_string()) label += ", ";
      if (e.name.is_string()) label += "name " + e.name.describe();
      label += ")";
    }
    return label;
  };
  auto fail = [&](const std::string& what) {
    error = fmt::format("{}: {}", where(), what);
    return false;
  };
  // Types first, on every event: these fields have one type in every Chrome/Kineto trace, so any
  // other is a damaged or foreign file and the figures would be wrong if we guessed.
  for (const auto& [value, key] : {std::pair{&e.ph, "ph"}, std::pair{&e.cat, "cat"}, std::pair{&e.name, "name"}})
    if (value->present() && !value->is_string())
      return fail(fmt::format("\"{}\" is {}, expected a string", key, value->describe()));
  if (e.args.present() && e.args.kind != Value::Kind::object)
    return fail(fmt::format("\"args\" is {}, expected an object", e.args.describe()));
  if (e.correlation.present() && e.correlation.kind != Value::Kind::integer)
    return fail(fmt::format("\"args.correlation\" is {}, expected an integer", e.correlation.describe()));
  for (const auto& [value, key] : {std::pair{&e.pid, "pid"}, std::pair{&e.tid, "tid"}})
    if (value->present() && value->kind != Value::Kind::integer && !value->is_string())
      return fail(fmt::format("\"{}\" is {}, expected an integer or a string", key, value->describe()));

  if (!e.ph.is_string() || e.ph.text != "X") return true;
  const std::string& cat = e.cat.text;
  const bool kernel = cat == "kernel";
  const bool memory = cat == "gpu_memcpy" || cat == "gpu_memset";
  const bool annotation = cat == "user_annotation";
  const bool step_op = cat == "cpu_op" && e.name.text.starts_with("ProfilerStep#");
  const int64_t correlation = e.correlation.is_integer() ? e.correlation.integer : -1;
  const bool launch = (cat == "cuda_runtime" || cat == "cuda_driver") && correlation >= 0;
  if (!kernel && !memory && !annotation && !step_op && !launch) return true;  // not read

  if (!e.ts.is_number() || !e.dur.is_number()) {
    // Launch records without times only lose their attribution; the others are the figures.
    if (launch || step_op) return true;
    return fail(fmt::format("\"ts\" and \"dur\" must be numbers (microseconds), got ts {} and dur {}",
                            e.ts.describe(), e.dur.describe()));
  }
  const double ts = e.ts.number(), dur = e.dur.number();
  if (!(std::fabs(ts) <= kMaxTraceMicroseconds))
    return fail(fmt::format("\"ts\" is {}, expected microseconds within +-{:g}", ts, kMaxTraceMicroseconds));
  if (dur < 0) return fail(fmt::format("\"dur\" is {}, expected a duration of 0 or more microseconds", dur));
  if (!(dur <= kMaxTraceMicroseconds))
    return fail(fmt::format("\"dur\" is {}, expected at most {:g} microseconds", dur, kMaxTraceMicroseconds));
  const int64_t begin = to_ns(e.ts);
  const Interval time{begin, begin + to_ns(e.dur)};
  const std::string& name = e.name.text;
  // Unsigned: pids and tids given as strings hash to any 64-bit value (wrapping is the intent).
  const int64_t thread =
      static_cast<int64_t>(static_cast<uint64_t>(id_of(e.pid)) * 1000003u + static_cast<uint64_t>(id_of(e.tid)));

  if (kernel) {
    const uint32_t id = names_.intern(name);
    const ActivityClass cls = classify(id);
    if (cls == ActivityClass::communication) {
      ++out_.comm_kernels;
      if (correlation >= 0) comm_correlation_.emplace_back(activities_.size(), correlation);
    }
    activities_.push_back({time, cls, id, kNoName, 0});
    ++out_.kernels;
  } else if (memory) {
    activities_.push_back({time, ActivityClass::memory, names_.intern(name), kNoName, 0});
    ++out_.memory_ops;
  } else if (step_op) {
    // Older PyTorch releases recorded the step as an operator rather than an annotation.
    int64_t step = 0;
    if (match_step_name(name, options_.step_prefixes, unnumbered_steps_, step)) steps_.push_back({step, time});
  } else if (annotation) {
    int64_t step = 0;
    if (match_step_name(name, options_.step_prefixes, unnumbered_steps_, step)) {
      ++unnumbered_steps_;
      steps_.push_back({step, time});
    } else {
      annotations_.push_back({thread, time, names_.intern(name), static_cast<uint32_t>(annotations_.size())});
    }
  } else {
    launches_.push_back({correlation, thread, time.begin});
  }
  return true;
}

void Accumulator::finish() {
  // The application's range for each communication kernel: the innermost annotation open on the
  // launching thread when the kernel was launched (innermost = shortest; among equals the first in
  // the trace). One sweep per thread over annotations and launches sorted by time, with the open
  // annotations in a heap ordered by length: O((A + K) log A) instead of A x K.
  std::stable_sort(launches_.begin(), launches_.end(),
                   [](const Launch& a, const Launch& b) { return a.correlation < b.correlation; });
  std::vector<CommQuery> queries;
  queries.reserve(comm_correlation_.size());
  for (const auto& [activity, correlation] : comm_correlation_) {
    // The last launch record with this id, as a later record overwrote an earlier one before.
    auto it = std::upper_bound(launches_.begin(), launches_.end(), correlation,
                               [](int64_t c, const Launch& l) { return c < l.correlation; });
    if (it == launches_.begin() || std::prev(it)->correlation != correlation) continue;
    --it;
    queries.push_back({it->thread, it->time, activity});
  }
  std::vector<Launch>().swap(launches_);
  std::sort(queries.begin(), queries.end(), [](const CommQuery& a, const CommQuery& b) {
    return a.thread != b.thread ? a.thread < b.thread : a.time < b.time;
  });
  std::sort(annotations_.begin(), annotations_.end(), [](const Annotation& a, const Annotation& b) {
    return a.thread != b.thread ? a.thread < b.thread : a.time.begin < b.time.begin;
  });
  auto longer = [](const Annotation* a, const Annotation* b) {  // heap top = shortest, then earliest
    return a->time.length() != b->time.length() ? a->time.length() > b->time.length() : a->order > b->order;
  };
  size_t next = 0;
  std::priority_queue<const Annotation*, std::vector<const Annotation*>, decltype(longer)> open(longer);
  int64_t current_thread = 0;
  bool any_thread = false;
  for (const CommQuery& q : queries) {
    if (!any_thread || q.thread != current_thread) {
      open = decltype(open)(longer);
      while (next < annotations_.size() && annotations_[next].thread < q.thread) ++next;
      current_thread = q.thread;
      any_thread = true;
    }
    while (next < annotations_.size() && annotations_[next].thread == q.thread &&
           annotations_[next].time.begin <= q.time)
      open.push(&annotations_[next++]);
    // Ranges that closed before this launch never reopen for a later one of the same thread.
    while (!open.empty() && open.top()->time.end <= q.time) open.pop();
    if (!open.empty()) activities_[q.activity].range = open.top()->name;
  }

  std::sort(steps_.begin(), steps_.end(),
            [](const StepWindow& a, const StepWindow& b) { return a.time.begin < b.time.begin; });
  // A release that records the step both ways would otherwise count it twice.
  steps_.erase(std::unique(steps_.begin(), steps_.end(),
                           [](const StepWindow& a, const StepWindow& b) {
                             return a.step == b.step && a.time == b.time;
                           }),
               steps_.end());
  out_.steps = compute_steps(steps_, activities_, {}, &names_, options_.top_n, out_.rank);
}

// Frames of the parse: where in the document the next value lands.
enum class Frame : uint8_t { root_object, events, event, args, dist_info, skip };
enum class Key : uint8_t { none, trace_events, distributed_info, correlation, rank };

struct FrameState {
  Frame kind;
  Field field = Field::other;  // in an event: the key whose value comes next
  Key key = Key::none;         // elsewhere
};

// SAX handler (nlohmann::json::sax_parse): events are checked and folded into the Accumulator one at
// a time; nothing of the document is kept.
class Reader {
 public:
  using number_integer_t = json::number_integer_t;
  using number_unsigned_t = json::number_unsigned_t;
  using number_float_t = json::number_float_t;
  using string_t = json::string_t;
  using binary_t = json::binary_t;

  Reader(Accumulator& acc, KinetoAnalysis& out, std::string& error) : acc_(acc), out_(out), error_(error) {}

  bool null() { return scalar([](Value& v) { v.kind = Value::Kind::null; }); }
  bool boolean(bool b) {
    return scalar([b](Value& v) {
      v.kind = Value::Kind::boolean;
      v.boolean = b;
    });
  }
  bool number_integer(number_integer_t n) {
    return scalar([n](Value& v) {
      v.kind = Value::Kind::integer;
      v.is_unsigned = false;
      v.integer = n;
    });
  }
  bool number_unsigned(number_unsigned_t n) {
    return scalar([n](Value& v) {
      v.kind = Value::Kind::integer;
      v.is_unsigned = n > static_cast<uint64_t>(INT64_MAX);
      v.integer = static_cast<int64_t>(std::min<uint64_t>(n, INT64_MAX));
      v.unsigned_value = n;
    });
  }
  bool number_float(number_float_t d, const string_t& token) {
    return scalar([d, &token](Value& v) {
      v.kind = Value::Kind::floating;
      v.floating = d;
      v.text = token;  // the exact decimal, for to_ns
    });
  }
  bool string(string_t& s) {
    return scalar([&s](Value& v) {
      v.kind = Value::Kind::string;
      v.text = std::move(s);
    });
  }
  bool binary(binary_t&) { return scalar([](Value& v) { v.kind = Value::Kind::null; }); }

  bool key(string_t& k) {
    FrameState& f = stack_.back();
    switch (f.kind) {
      case Frame::event: f.field = field_of(k); break;
      case Frame::args: f.key = k == "correlation" ? Key::correlation : Key::none; break;
      case Frame::dist_info: f.key = k == "rank" ? Key::rank : Key::none; break;
      case Frame::root_object:
        f.key = k == "traceEvents" ? Key::trace_events : k == "distributedInfo" ? Key::distributed_info : Key::none;
        break;
      default: break;
    }
    return true;
  }

  bool start_object(std::size_t) { return container(Value::Kind::object); }
  bool start_array(std::size_t) { return container(Value::Kind::array); }
  bool end_object() { return end(); }
  bool end_array() { return end(); }

  bool parse_error(std::size_t position, const std::string&, const nlohmann::detail::exception& e) {
    // nlohmann's message carries its own "[json.exception.parse_error.101] parse error at line..."
    // prefix; keep the part after "parse error".
    std::string what = e.what();
    if (const size_t p = what.find("] "); p != std::string::npos) what = what.substr(p + 2);
    error_ = fmt::format("not valid JSON (byte {}): {}", position, what);
    return false;
  }

  // After a successful parse: the document's shape and the distributedInfo rank.
  bool finish() {
    if (!saw_events_) {
      error_ = "expected a JSON array of events or an object with a \"traceEvents\" array";
      return false;
    }
    if (rank_.present()) {
      if (!rank_.is_integer() || rank_.integer < 0 || rank_.integer > INT_MAX) {
        error_ = fmt::format("\"distributedInfo.rank\" is {}, expected a non-negative integer", rank_.describe());
        return false;
      }
      out_.rank = static_cast<int>(rank_.integer);
    }
    acc_.finish();
    for (StepReport& s : out_.steps) s.rank = out_.rank;
    return true;
  }

 private:
  template <class Set>
  bool scalar(Set&& set) {
    if (stack_.empty()) return shape_error();
    FrameState& f = stack_.back();
    switch (f.kind) {
      case Frame::events:
        ++out_.events;
        error_ = fmt::format("event {}: expected an object, got {}", out_.events, describe(set));
        return false;
      case Frame::event:
        if (Value* v = raw_.field(f.field)) set(*v);
        return true;
      case Frame::args:
        if (f.key == Key::correlation) set(raw_.correlation);
        return true;
      case Frame::dist_info:
        if (f.key == Key::rank) set(rank_);
        return true;
      case Frame::root_object:
        if (f.key == Key::trace_events || f.key == Key::distributed_info) {
          error_ = fmt::format("\"{}\" is {}, expected {}",
                               f.key == Key::trace_events ? "traceEvents" : "distributedInfo", describe(set),
                               f.key == Key::trace_events ? "an array" : "an object");
          return false;
        }
        return true;
      case Frame::skip: return true;
    }
    return true;
  }

  template <class Set>
  static std::string describe(Set&& set) {
    Value v;
    set(v);
    return v.describe();
  }

  bool container(Value::Kind kind) {
    const auto mark = [kind](Value& v) { v.kind = kind; };
    if (stack_.empty()) {
      if (kind == Value::Kind::array) {
        saw_events_ = true;
        stack_.push_back({Frame::events});
      } else {
        stack_.push_back({Frame::root_object});
      }
      return true;
    }
    FrameState& f = stack_.back();
    Frame next = Frame::skip;
    switch (f.kind) {
      case Frame::events:
        ++out_.events;
        if (kind != Value::Kind::object) {
          error_ = fmt::format("event {}: expected an object, got an array", out_.events);
          return false;
        }
        raw_.clear();
        next = Frame::event;
        break;
      case Frame::event:
        if (Value* v = raw_.field(f.field)) mark(*v);
        if (f.field == Field::args && kind == Value::Kind::object) next = Frame::args;
        break;
      case Frame::args:
        if (f.key == Key::correlation) mark(raw_.correlation);
        break;
      case Frame::dist_info:
        if (f.key == Key::rank) mark(rank_);
        break;
      case Frame::root_object:
        if (f.key == Key::trace_events) {
          if (kind != Value::Kind::array) {
            error_ = "\"traceEvents\" is an object, expected an array";
            return false;
          }
          saw_events_ = true;
          next = Frame::events;
        } else if (f.key == Key::distributed_info) {
          if (kind != Value::Kind::object) {
            error_ = "\"distributedInfo\" is an array, expected an object";
            return false;
          }
          next = Frame::dist_info;
        }
        break;
      case Frame::skip: break;
    }
    stack_.push_back({next});
    return true;
  }

  bool end() {
    const Frame done = stack_.back().kind;
    stack_.pop_back();
    if (done == Frame::event) return acc_.add(raw_, out_.events, error_);
    return true;
  }

  bool shape_error() {
    error_ = "expected a JSON array of events or an object with a \"traceEvents\" array";
    return false;
  }

  Accumulator& acc_;
  KinetoAnalysis& out_;
  std::string& error_;
  std::vector<FrameState> stack_;
  RawEvent raw_;
  Value rank_;
  bool saw_events_ = false;
};

template <class Input>
bool analyze(Input&& input, const KernelClassifier& classifier, const KinetoOptions& options, KinetoAnalysis& out,
             std::string& error) {
  out = KinetoAnalysis{};
  Accumulator acc(classifier, options, out);
  Reader reader(acc, out, error);
  error.clear();
  if (!json::sax_parse(std::forward<Input>(input), &reader)) {
    if (error.empty()) error = "not valid JSON";
    return false;
  }
  return reader.finish();
}

}  // namespace

bool analyze_kineto_text(const std::string& json_text, const KernelClassifier& classifier,
                         const KinetoOptions& options, KinetoAnalysis& out, std::string& error) {
  out = KinetoAnalysis{};
  error = json_check_text(json_text, kTraceLimits);
  if (!error.empty()) return false;
  return analyze(json_text, classifier, options, out, error);
}

bool analyze_kineto_file(const std::string& path, const KernelClassifier& classifier,
                         const KinetoOptions& options, KinetoAnalysis& out, std::string& error) {
  TraceInput input;
  if (!input.open(path, error, kTraceLimits)) return false;
  std::istream stream(&input);
  const bool ok = analyze(stream, classifier, options, out, error);
  // A damaged gzip stream ends the text early; say that rather than the parse error it causes.
  if (!input.read_error().empty()) {
    error = fmt::format("{}: {}", path, input.read_error());
    return false;
  }
  if (!ok) error = fmt::format("{}: {}", path, error);
  return ok;
}

}  // namespace fp8wire::prof
