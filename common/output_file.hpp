// Every file fp8wire writes (logs, profiler reports and traces, fp8wire-bench results and profiles,
// the trainer's checkpoints and metrics) is opened here, so that:
//  - a symbolic link at the path is refused with an error naming it, never written through: on a
//    shared machine another user can plant one in a common folder (/tmp, a shared scratch) pointing
//    at a file of yours, which a tool that follows it would overwrite (O_NOFOLLOW, checked again by
//    the kernel at open, so there is no window between the check and the open);
//  - a whole file is written beside its target and renamed over it only once every byte is flushed
//    and closed with every error checked, so a reader sees the old file or the whole new one and a
//    failure is never reported as success.
// The system's links to an open stream (/dev/stdout, /dev/stderr, /dev/fd/N, /proc/self/fd/N) are
// written through: they are no one's plant, and `--json /dev/stdout` is a common request. Only the last
// component of a path is checked; a folder given as a link is the user's own choice.
// Header-only (and C++17, for nvcc): the log sink and the trainer link no other fp8wire library.
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <string_view>

#include <fmt/format.h>

namespace fp8wire {

enum class OutputMode {
  truncate,  // a new file, or an existing one emptied
  append,    // a log: lines added at the end
};

inline bool is_stream_alias(std::string_view path) {
  auto starts = [&](std::string_view prefix) { return path.substr(0, prefix.size()) == prefix; };  // C++17: nvcc
  return path == "/dev/stdout" || path == "/dev/stderr" || starts("/dev/fd/") || starts("/proc/self/fd/");
}

namespace detail {
inline std::string output_error(const std::string& path, int err) {
  struct stat st {};
  if (err == ELOOP && ::lstat(path.c_str(), &st) == 0 && S_ISLNK(st.st_mode))
    return fmt::format("cannot write '{}': it is a symbolic link, which fp8wire does not write through (remove "
                       "it, or give the path of the file it points to)",
                       path);
  return fmt::format("cannot write '{}': {}", path, std::strerror(err));
}

inline bool is_link(const std::string& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0 && S_ISLNK(st.st_mode);
}

// Writes and closes `file`, returning errno of the first failure (0 on success). fclose is checked
// because buffered data (and a full disk) may surface only there.
inline int finish(FILE* file, int err) {
  if (std::fflush(file) != 0 && !err) err = errno ? errno : EIO;
  if (std::fclose(file) != 0 && !err) err = errno ? errno : EIO;
  return err;
}
}  // namespace detail

// A file descriptor open for writing (close-on-exec), or -1 with `error` = "cannot write '<path>':
// <reason>" (a link at the path among them).
inline int open_output(const std::string& path, OutputMode mode, std::string& error) {
  if (path.empty()) {
    error = "cannot write '': empty path";
    return -1;
  }
  int flags = O_WRONLY | O_CREAT | O_CLOEXEC | (mode == OutputMode::append ? O_APPEND : O_TRUNC);
  if (!is_stream_alias(path)) flags |= O_NOFOLLOW;
  const int fd = ::open(path.c_str(), flags, 0666);
  if (fd < 0) error = detail::output_error(path, errno);
  return fd;
}

// The same as a stdio stream.
inline FILE* fopen_output(const std::string& path, OutputMode mode, std::string& error) {
  const int fd = open_output(path, mode, error);
  if (fd < 0) return nullptr;
  FILE* f = ::fdopen(fd, mode == OutputMode::append ? "a" : "w");
  if (!f) {
    error = detail::output_error(path, errno);
    ::close(fd);
  }
  return f;
}

// Writes a whole file through `write` (which returns false or leaves the stream in error on failure)
// into a new file beside `path`, then renames it over `path`. Devices, pipes and stream aliases are
// written directly: they cannot be renamed over. False with `error` = "cannot write '<path>': <reason>".
inline bool write_file_atomically(const std::string& path, const std::function<bool(FILE*)>& write,
                                  std::string& error) {
  if (path.empty()) {
    error = "cannot write '': empty path";
    return false;
  }
  auto fail = [&](int err) {
    error = detail::output_error(path, err);
    return false;
  };
  if (!is_stream_alias(path) && detail::is_link(path)) return fail(ELOOP);
  struct stat st {};
  if (is_stream_alias(path) || (::stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode))) {
    if (S_ISDIR(st.st_mode)) return fail(EISDIR);
    FILE* f = fopen_output(path, OutputMode::truncate, error);
    if (!f) return false;
    errno = 0;
    const bool wrote = write(f) && !std::ferror(f);
    const int err = detail::finish(f, wrote ? 0 : errno ? errno : EIO);
    return err ? fail(err) : true;
  }
  // Created exclusively and without following a link: a name planted beside the target is skipped.
  std::string tmp;
  int fd = -1;
  for (int attempt = 0; fd < 0 && attempt < 100; ++attempt) {
    tmp = fmt::format("{}.tmp.{}.{}", path, ::getpid(), attempt);
    fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666);
    if (fd < 0 && errno != EEXIST) return fail(errno);
  }
  if (fd < 0) return fail(EEXIST);
  FILE* f = ::fdopen(fd, "w");
  if (!f) {
    const int err = errno;
    ::close(fd);
    ::unlink(tmp.c_str());
    return fail(err);
  }
  errno = 0;
  const bool wrote = write(f) && !std::ferror(f);
  if (const int err = detail::finish(f, wrote ? 0 : errno ? errno : EIO)) {
    ::unlink(tmp.c_str());
    return fail(err);
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    return fail(err);
  }
  return true;
}

inline bool write_file_atomically(const std::string& path, std::string_view text, std::string& error) {
  return write_file_atomically(
      path, [&](FILE* f) { return text.empty() || std::fwrite(text.data(), 1, text.size(), f) == text.size(); },
      error);
}

}  // namespace fp8wire
