// libFuzzer target: the Kineto trace reader (profiler/kineto.cpp) on arbitrary text, from a string
// and, for one input in 16 (by its size: opening a stream costs 2 MiB of buffers, a hundred times
// the parse of a small input), as a file (the stream and its input limits, trace_input.cpp). Must
// never crash, hang or trip a sanitizer (signed overflow included); every problem must come back as
// an error. Oracles: both ways give the same outcome (the file's error is the text's after its
// path); on success every step's partition adds up to the step and overlap is a percentage.
#include <sys/mman.h>
#include <unistd.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "profiler/kineto.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  fp8wire::prof::KinetoAnalysis a;
  std::string error;
  static const fp8wire::prof::KernelClassifier classifier("allreduce");
  const bool ok = fp8wire::prof::analyze_kineto_text(text, classifier, fp8wire::prof::KinetoOptions{}, a, error);
  // A gzip header makes the file a compressed stream, which the text reader does not decompress.
  const bool gzip = size >= 2 && data[0] == 0x1f && data[1] == 0x8b;
  if (size % 16 == 0 && !gzip) {
    static const int fd = ::memfd_create("fuzz_kineto.json", 0);
    static const std::string path = "/proc/self/fd/" + std::to_string(fd);
    if (fd < 0 || ::ftruncate(fd, 0) != 0 || ::pwrite(fd, data, size, 0) != static_cast<ssize_t>(size)) std::abort();
    fp8wire::prof::KinetoAnalysis from_file;
    std::string file_error;
    const bool file_ok =
        fp8wire::prof::analyze_kineto_file(path, classifier, fp8wire::prof::KinetoOptions{}, from_file, file_error);
    if (file_ok != ok || (!ok && file_error != path + ": " + error)) std::abort();
  }
  if (!ok) {
    if (error.empty()) std::abort();  // a refusal must say why
    return 0;
  }
  for (const auto& s : a.steps) {
    const double parts = s.compute_ms + s.exposed_comm_ms + s.exposed_memcpy_ms + s.idle_ms;
    if (std::fabs(parts - s.step_ms) > 1e-6 * std::max(1.0, s.step_ms)) std::abort();
    if (!(s.overlap_pct >= 0 && s.overlap_pct <= 100.0 + 1e-9)) std::abort();
    if (s.idle_ms < -1e-9 || s.exposed_comm_ms < -1e-9) std::abort();
  }
  return 0;
}
