// Offline analysis of a PyTorch profiler (Kineto) trace: the same exposure figures per ProfilerStep
// as the live profiler, from the trace alone. Events used ("ph":"X", ts/dur in microseconds):
//   cat "kernel"                         -> kernels, classified by KernelClassifier
//   cat "gpu_memcpy" / "gpu_memset"      -> memory activity
//   cat "user_annotation", name matching a step prefix ("ProfilerStep#N") -> step windows
//   other "user_annotation"              -> the application's ranges, for per-collective attribution
//   cat "cuda_runtime" / "cuda_driver"   -> launch time and thread of each kernel (args.correlation)
//
// The trace is read as a stream (a SAX parser; gzip or plain, trace_input.hpp), so memory grows with
// the events kept (kernels, ranges, launches: tens of bytes each), not with the text; every later
// stage is O(n log n) in those events. A field of the wrong JSON type, a time that does not fit the
// nanosecond timeline, or a negative duration is an error naming the event, never a crash; so is a
// trace past kTraceLimits (nesting, one string's length, the whole text), found before it is parsed.
#pragma once

#include <string>
#include <vector>

#include "common/input_limits.hpp"

#include "profiler/classify.hpp"
#include "profiler/exposure.hpp"

namespace fp8wire::prof {

struct KinetoOptions {
  std::vector<std::string> step_prefixes = {"ProfilerStep#", "step"};
  size_t top_n = 10;
};

struct KinetoAnalysis {
  int rank = 0;                      // distributedInfo.rank when the trace has it
  std::vector<StepReport> steps;     // by step window start
  size_t events = 0;                 // elements of traceEvents
  size_t kernels = 0;
  size_t comm_kernels = 0;
  size_t memory_ops = 0;
};

// Limits on a trace's text: common/input_limits.hpp's nesting depth; one string (a kernel's or a
// range's name) of at most 64 MiB; at most 64 GiB of JSON, decompressed (a gzip of a few MiB can
// expand to terabytes).
inline constexpr JsonLimits kTraceLimits{kMaxInputDepth, 64ull << 30, 64ull << 20};

// Largest |ts| and dur accepted, in microseconds: ts and ts + dur must fit int64 nanoseconds with
// room to spare (4e15 us is 126 years after the epoch; Kineto's ts are epoch microseconds).
inline constexpr double kMaxTraceMicroseconds = 4e15;

// On failure returns false and says why in `error` (with the offending event and field where there
// is one).
bool analyze_kineto_text(const std::string& json_text, const KernelClassifier& classifier,
                         const KinetoOptions& options, KinetoAnalysis& out, std::string& error);
// The file may be gzip-compressed (any name). Errors start with the path.
bool analyze_kineto_file(const std::string& path, const KernelClassifier& classifier,
                         const KinetoOptions& options, KinetoAnalysis& out, std::string& error);

// "ProfilerStep#12" with prefix "ProfilerStep#" -> 12; "step" -> `fallback`. Returns false when the
// name does not start with any prefix.
bool match_step_name(std::string_view name, const std::vector<std::string>& prefixes, int64_t fallback,
                     int64_t& step);

}  // namespace fp8wire::prof
