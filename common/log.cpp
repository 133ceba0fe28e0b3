#include "common/log.hpp"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <mutex>

namespace fp8wire {
namespace detail {
std::atomic<int> g_log_level{static_cast<int>(LogLevel::warn)};
}

namespace {
std::atomic<int> g_rank{-1};
std::mutex g_sink_mutex;
FILE* g_sink = nullptr;  // nullptr: stderr
std::string g_sink_pattern;

std::string expand_path(const std::string& pattern, int rank) {
  std::string out;
  for (size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] == '%' && i + 1 < pattern.size() && pattern[i + 1] == 'r') {
      out += std::to_string(rank);
      ++i;
    } else if (pattern[i] == '%' && i + 1 < pattern.size() && pattern[i + 1] == 'p') {
      out += std::to_string(getpid());
      ++i;
    } else {
      out += pattern[i];
    }
  }
  return out;
}

// Called with g_sink_mutex held.
void reopen_sink_locked() {
  if (g_sink) {
    fclose(g_sink);
    g_sink = nullptr;
  }
  if (g_sink_pattern.empty()) return;
  // A per-rank file waits for the rank (set when the first communicator is created); until then
  // lines go to stderr rather than into rank 0's file.
  if (g_sink_pattern.find("%r") != std::string::npos && g_rank.load() < 0) return;
  const std::string path = expand_path(g_sink_pattern, g_rank.load());
  g_sink = fopen(path.c_str(), "a");
  if (!g_sink)
    fprintf(stderr, "fp8wire ERROR cannot open log.file '%s': %s; logging to stderr\n", path.c_str(),
            strerror(errno));
}
}  // namespace

void log_set_level(LogLevel level) {
  detail::g_log_level.store(static_cast<int>(level), std::memory_order_relaxed);
}
LogLevel log_level() { return static_cast<LogLevel>(detail::g_log_level.load(std::memory_order_relaxed)); }

void log_set_rank(int rank) {
  const int old = g_rank.exchange(rank);
  if (old != rank) {
    std::lock_guard lock(g_sink_mutex);
    if (g_sink_pattern.find("%r") != std::string::npos) reopen_sink_locked();
  }
}

void log_set_file(const std::string& path) {
  std::lock_guard lock(g_sink_mutex);
  g_sink_pattern = path;
  reopen_sink_locked();
}

const char* log_level_name(LogLevel level) {
  switch (level) {
    case LogLevel::off: return "OFF";
    case LogLevel::error: return "ERROR";
    case LogLevel::warn: return "WARN";
    case LogLevel::info: return "INFO";
    case LogLevel::debug: return "DEBUG";
    case LogLevel::trace: return "TRACE";
  }
  return "?";
}

void log_write(LogLevel level, const char* file, int line, std::string_view message) {
  const int rank = g_rank.load(std::memory_order_relaxed);
  const char* base = strrchr(file, '/');
  base = base ? base + 1 : file;
  std::string who = rank >= 0 ? fmt::format("rank {}", rank) : fmt::format("pid {}", getpid());
  std::string text = fmt::format("fp8wire[{}] {} {}:{} {}\n", who, log_level_name(level), base, line, message);
  std::lock_guard lock(g_sink_mutex);
  FILE* out = g_sink ? g_sink : stderr;
  fwrite(text.data(), 1, text.size(), out);
  fflush(out);
}

}  // namespace fp8wire
