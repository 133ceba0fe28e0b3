// Logging shared by every part of fp8wire.
// The level is one relaxed atomic load, checked before any formatting, so a disabled level costs
// nothing on the call path. Lines are prefixed "fp8wire[rank R] LEVEL" and go to stderr
// or to the configured file. FP8WIRE_WARN_ONCE keeps repeated conditions (a fallback taken on every
// call) to one line per call site.
#pragma once

#include <atomic>
#include <string>
#include <string_view>

#include <fmt/format.h>

namespace fp8wire {

enum class LogLevel : int { off = 0, error = 1, warn = 2, info = 3, debug = 4, trace = 5 };

namespace detail {
extern std::atomic<int> g_log_level;
}

inline bool log_enabled(LogLevel level) {
  return static_cast<int>(level) <= detail::g_log_level.load(std::memory_order_relaxed);
}

void log_set_level(LogLevel level);
LogLevel log_level();
// Rank shown in every line; -1 (the default) shows the process id instead.
void log_set_rank(int rank);
// Empty path: stderr. The file is opened (appending) when the first line is written, so a process
// that never logs leaves no file. A path that cannot be opened logs an error to stderr and keeps
// stderr. "%r" in the path is replaced by the rank (one file per rank; lines before the rank is
// known go to stderr), "%p" by the process id (a forked child opens its own file).
void log_set_file(const std::string& path);
void log_write(LogLevel level, const char* file, int line, std::string_view message);

const char* log_level_name(LogLevel level);

}  // namespace fp8wire

#define FP8WIRE_LOG(level, ...)                                                          \
  do {                                                                                   \
    if (__builtin_expect(::fp8wire::log_enabled(level), 0))                              \
      ::fp8wire::log_write(level, __FILE__, __LINE__, ::fmt::format(__VA_ARGS__));      \
  } while (0)

#define FP8WIRE_ERROR(...) FP8WIRE_LOG(::fp8wire::LogLevel::error, __VA_ARGS__)
#define FP8WIRE_WARN(...) FP8WIRE_LOG(::fp8wire::LogLevel::warn, __VA_ARGS__)
#define FP8WIRE_INFO(...) FP8WIRE_LOG(::fp8wire::LogLevel::info, __VA_ARGS__)
#define FP8WIRE_DEBUG(...) FP8WIRE_LOG(::fp8wire::LogLevel::debug, __VA_ARGS__)
#define FP8WIRE_TRACE(...) FP8WIRE_LOG(::fp8wire::LogLevel::trace, __VA_ARGS__)

// Logs at most once per call site for the life of the process. Once it has logged, a call costs
// one relaxed load (the sites are fallbacks that can be taken on every call), not a write to a
// shared cache line.
#define FP8WIRE_WARN_ONCE(...)                                                           \
  do {                                                                                   \
    static std::atomic<bool> fp8wire_warned_once_{false};                                \
    if (!fp8wire_warned_once_.load(std::memory_order_relaxed) &&                         \
        !fp8wire_warned_once_.exchange(true, std::memory_order_relaxed))                 \
      FP8WIRE_WARN(__VA_ARGS__);                                                         \
  } while (0)
