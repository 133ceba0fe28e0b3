#include "common/log.hpp"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <mutex>

#include "common/output_file.hpp"

namespace fp8wire {
namespace detail {
std::atomic<int> g_log_level{static_cast<int>(LogLevel::warn)};
}

namespace {
std::atomic<int> g_rank{-1};
std::mutex g_sink_mutex;
FILE* g_sink = nullptr;  // nullptr: stderr (or not opened yet)
std::string g_sink_pattern;
pid_t g_sink_pid = 0;    // the process that opened g_sink ("%p" files are per process)
bool g_sink_failed = false;  // this pattern could not be opened: stderr, said once

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

void close_sink_locked() {
  // A sink inherited through fork belongs to the parent's file: the child must not close its
  // stream's buffer into it twice, only stop using it.
  if (g_sink && g_sink_pid == getpid()) fclose(g_sink);
  g_sink = nullptr;
  g_sink_pid = 0;
}

// The sink for the next line, opened only now: the library loads into every process the environment
// reaches (shells, ls, launchers), and most of them never log, so opening at configuration would
// leave an empty file per process. Called with g_sink_mutex held.
FILE* sink_locked() {
  if (g_sink_pattern.empty() || g_sink_failed) return stderr;
  const bool per_process = g_sink_pattern.find("%p") != std::string::npos;
  if (g_sink && per_process && g_sink_pid != getpid()) close_sink_locked();  // a forked child: its own file
  if (g_sink) return g_sink;
  // A per-rank file waits for the rank (set when the first communicator is created); until then
  // lines go to stderr rather than into rank 0's file.
  if (g_sink_pattern.find("%r") != std::string::npos && g_rank.load() < 0) return stderr;
  const std::string path = expand_path(g_sink_pattern, g_rank.load());
  std::string error;
  g_sink = fopen_output(path, OutputMode::append, error);
  if (!g_sink) {
    g_sink_failed = true;
    fprintf(stderr, "fp8wire ERROR log.file: %s; logging to stderr\n", error.c_str());
    return stderr;
  }
  g_sink_pid = getpid();
  return g_sink;
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
    if (g_sink_pattern.find("%r") != std::string::npos) {
      close_sink_locked();  // the next line opens this rank's file
      g_sink_failed = false;
    }
  }
}

void log_set_file(const std::string& path) {
  std::lock_guard lock(g_sink_mutex);
  close_sink_locked();
  g_sink_pattern = path;
  g_sink_failed = false;
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
  FILE* out = sink_locked();
  fwrite(text.data(), 1, text.size(), out);
  fflush(out);
}

}  // namespace fp8wire
