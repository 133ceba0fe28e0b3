#include "profiler/trace_input.hpp"

#include <sys/stat.h>
#include <zlib.h>

#include <cerrno>
#include <cstring>

#include <fmt/format.h>

namespace fp8wire::prof {

namespace {
constexpr unsigned kBufferBytes = 1u << 20;  // one read per MiB: the parser pulls bytes one by one
}

TraceInput::~TraceInput() {
  if (file_) gzclose(static_cast<gzFile>(file_));
}

bool TraceInput::open(const std::string& path, std::string& error, JsonLimits limits) {
  scan_ = JsonScan(limits);
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    error = fmt::format("cannot open '{}': {}", path, std::strerror(errno));
    return false;
  }
  // gzopen would open a directory and then fail on the first read with a less helpful message.
  if (!S_ISREG(st.st_mode) && !S_ISFIFO(st.st_mode) && !S_ISCHR(st.st_mode)) {
    error = fmt::format("cannot open '{}': not a regular file", path);
    return false;
  }
  errno = 0;
  gzFile f = gzopen(path.c_str(), "rb");
  if (!f) {
    error = fmt::format("cannot open '{}': {}", path, errno ? std::strerror(errno) : "out of memory");
    return false;
  }
  gzbuffer(f, kBufferBytes);
  file_ = f;
  buffer_.resize(kBufferBytes);
  setg(buffer_.data(), buffer_.data(), buffer_.data());
  return true;
}

TraceInput::int_type TraceInput::underflow() {
  if (gptr() < egptr()) return traits_type::to_int_type(*gptr());
  if (!file_ || !read_error_.empty()) return traits_type::eof();
  auto* f = static_cast<gzFile>(file_);
  const int n = gzread(f, buffer_.data(), kBufferBytes);
  // gzdirect is known only after the first read: 0 means zlib found a gzip header.
  compressed_ = gzdirect(f) == 0;
  if (n < 0) {
    int code = 0;
    const char* message = gzerror(f, &code);
    read_error_ = code == Z_ERRNO ? std::string(std::strerror(errno))
                                  : fmt::format("corrupt gzip data ({})", message ? message : "unknown");
    return traits_type::eof();
  }
  if (n == 0) {
    // A truncated gzip member ends without an error from gzread on some zlib versions; gzerror
    // still says so.
    int code = 0;
    const char* message = gzerror(f, &code);
    if (code != Z_OK && code != Z_STREAM_END)
      read_error_ = fmt::format("corrupt gzip data ({})", message ? message : "unknown");
    return traits_type::eof();
  }
  if (!scan_.feed(std::string_view(buffer_.data(), static_cast<size_t>(n)))) {
    read_error_ = scan_.problem();
    return traits_type::eof();
  }
  setg(buffer_.data(), buffer_.data(), buffer_.data() + n);
  return traits_type::to_int_type(*gptr());
}

}  // namespace fp8wire::prof
