// Bounds on every JSON and TOML text fp8wire reads (profiler reports, Kineto traces, safetensors
// headers, fp8wire-bench results, configuration files), checked before the text reaches a parser.
// nlohmann-json's dump, copy and comparison and toml++'s table destructor recurse once per nesting
// level: a value nested a million deep (2 MB of '[') overflows the stack in any of them, and a file
// or token of gigabytes is read whole into memory. So nesting depth, file size and the length of one
// string or number are limited here, once, with errors that name what was wrong and the limit.
// Header-only: the trainer, which links no fp8wire library, reads safetensors headers with it.
#pragma once

#include <sys/stat.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <string>
#include <string_view>

#include <fmt/format.h>

namespace fp8wire {

// Nesting levels (arrays and objects in JSON; tables, arrays and dotted-key segments in TOML). No
// file fp8wire writes or reads goes past 6; 256 keeps every recursive walk far from the stack's end,
// sanitizer builds included.
inline constexpr size_t kMaxInputDepth = 256;

// "1048576 bytes (1 MiB)": limits are stated in both units.
inline std::string bytes_and_mib(uint64_t bytes) {
  if (bytes >= (1ull << 30) && bytes % (1ull << 30) == 0) return fmt::format("{} bytes ({} GiB)", bytes, bytes >> 30);
  if (bytes >= (1ull << 20) && bytes % (1ull << 20) == 0) return fmt::format("{} bytes ({} MiB)", bytes, bytes >> 20);
  return fmt::format("{} bytes", bytes);
}

struct JsonLimits {
  size_t max_depth = kMaxInputDepth;
  uint64_t max_bytes = 0;         // the whole text; 0: unbounded (a stream read as it comes)
  uint64_t max_token_bytes = 0;   // one string, number or literal; 0: unbounded
};

// A scan of JSON text, fed in pieces (a stream) or whole, that follows strings and escapes and counts
// bracket depth and token length; it does not validate otherwise (the parser does that). Linear,
// allocation-free, a few instructions per byte.
class JsonScan {
 public:
  explicit JsonScan(JsonLimits limits = {}) : limits_(limits) {}

  // False once a limit is passed; problem() then says which, where, and the limit.
  bool feed(std::string_view bytes) {
    if (!what_.empty()) return false;
    for (const char c : bytes) {
      ++offset_;
      if (limits_.max_bytes && offset_ > limits_.max_bytes)
        return fail(fmt::format("the JSON text is longer than its limit of {}", bytes_and_mib(limits_.max_bytes)));
      if (c == '\n') {
        ++line_;
        line_start_ = offset_;
      }
      if (in_string_) {
        if (escape_) escape_ = false;
        else if (c == '\\') escape_ = true;
        else if (c == '"') in_string_ = false;
        if (in_string_ && !token_byte()) return false;
        continue;
      }
      switch (c) {
        case '"':
          in_string_ = true;
          token_ = 0;
          break;
        case '[':
        case '{':
          token_ = 0;
          if (++depth_ > limits_.max_depth)
            return fail(fmt::format("JSON nested deeper than its limit of {} levels", limits_.max_depth));
          break;
        case ']':
        case '}':
          token_ = 0;
          if (depth_ > 0) --depth_;  // an unbalanced bracket is the parser's error to report
          break;
        case ',':
        case ':':
        case ' ':
        case '\t':
        case '\r':
        case '\n': token_ = 0; break;
        default:
          if (!token_byte()) return false;  // a number or literal
      }
    }
    return true;
  }

  // "line L, column C: <what>", or "" while within the limits.
  std::string problem() const {
    return what_.empty() ? std::string() : fmt::format("line {}, column {}: {}", problem_line_, problem_column_, what_);
  }
  // The same in parts, for a caller that names the place itself (one line of a JSON-lines file).
  const std::string& what() const { return what_; }
  uint64_t column() const { return problem_column_; }

 private:
  bool token_byte() {
    if (limits_.max_token_bytes && ++token_ > limits_.max_token_bytes)
      return fail(fmt::format("a JSON string or number longer than its limit of {}",
                              bytes_and_mib(limits_.max_token_bytes)));
    return true;
  }
  bool fail(std::string what) {
    what_ = std::move(what);
    problem_line_ = line_;
    problem_column_ = offset_ - line_start_;
    return false;
  }

  JsonLimits limits_;
  uint64_t offset_ = 0, line_ = 1, line_start_ = 0, token_ = 0;
  size_t depth_ = 0;
  bool in_string_ = false, escape_ = false;
  std::string what_;
  uint64_t problem_line_ = 0, problem_column_ = 0;
};

// "" when `text` is within `limits`, else where and which limit it passed.
inline std::string json_check_text(std::string_view text, JsonLimits limits = {}) {
  JsonScan scan(limits);
  scan.feed(text);
  return scan.problem();
}

// Reads the whole of `path` into `text` when it holds at most `max_bytes`; otherwise (or when it
// cannot be read) false with `error` naming the file, its size and the limit for `what` ("a TOML
// configuration file"). The size is checked before anything is read.
inline bool read_file_bounded(const std::string& path, uint64_t max_bytes, std::string_view what, std::string& text,
                              std::string& error) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    error = fmt::format("{}: cannot read: {}", path, std::strerror(errno));
    return false;
  }
  if (S_ISDIR(st.st_mode)) {
    error = fmt::format("{}: is a directory, expected {}", path, what);
    return false;
  }
  if (S_ISREG(st.st_mode) && static_cast<uint64_t>(st.st_size) > max_bytes) {
    error = fmt::format("{}: {} bytes, more than the limit of {} for {}", path, static_cast<uint64_t>(st.st_size),
                        bytes_and_mib(max_bytes), what);
    return false;
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    error = fmt::format("{}: cannot read: {}", path, std::strerror(errno));
    return false;
  }
  // A pipe or device has no size to check beforehand: read at most one byte past the limit.
  text.clear();
  if (S_ISREG(st.st_mode)) text.reserve(static_cast<size_t>(st.st_size));
  char buffer[1 << 16];
  while (in.read(buffer, sizeof buffer) || in.gcount() > 0) {
    text.append(buffer, static_cast<size_t>(in.gcount()));
    if (text.size() > max_bytes) {
      error = fmt::format("{}: more than the limit of {} for {}", path, bytes_and_mib(max_bytes), what);
      return false;
    }
  }
  if (in.bad()) {
    error = fmt::format("{}: read error: {}", path, std::strerror(errno));
    return false;
  }
  return true;
}

}  // namespace fp8wire
