#include "profiler/output_file.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include <fmt/format.h>

namespace fp8wire::prof {

namespace {
// Writes and closes `file`, returning errno of the first failure (0 on success). fclose is checked
// because buffered data (and a full disk) may surface only there.
int write_and_close(FILE* file, std::string_view text) {
  int err = 0;
  if (!text.empty() && std::fwrite(text.data(), 1, text.size(), file) != text.size()) err = errno ? errno : EIO;
  if (std::fflush(file) != 0 && !err) err = errno ? errno : EIO;
  if (std::fclose(file) != 0 && !err) err = errno ? errno : EIO;
  return err;
}
}  // namespace

bool write_file_atomically(const std::string& path, std::string_view text, std::string& error) {
  auto fail = [&](int err) {
    error = fmt::format("cannot write '{}': {}", path, std::strerror(err));
    return false;
  };
  if (path.empty()) {
    error = "cannot write '': empty path";
    return false;
  }
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode)) {
    if (S_ISDIR(st.st_mode)) return fail(EISDIR);
    errno = 0;
    FILE* f = std::fopen(path.c_str(), "w");
    if (!f) return fail(errno);
    const int err = write_and_close(f, text);
    return err ? fail(err) : true;
  }
  const std::string tmp = fmt::format("{}.tmp.{}", path, ::getpid());
  errno = 0;
  FILE* f = std::fopen(tmp.c_str(), "w");
  if (!f) return fail(errno ? errno : EIO);
  if (const int err = write_and_close(f, text)) {
    std::remove(tmp.c_str());
    return fail(err);
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    std::remove(tmp.c_str());
    return fail(err);
  }
  return true;
}

}  // namespace fp8wire::prof
