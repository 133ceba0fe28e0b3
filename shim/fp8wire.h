/* Public C API of libfp8wire.so, besides the NCCL functions it interposes.
 * Resolve these with dlsym(RTLD_DEFAULT, "fp8wire_...") from a job that may or may not run under the
 * shim; all are safe to call at any time and never fail the job. */
#ifndef FP8WIRE_H
#define FP8WIRE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* 10000*major + 100*minor + patch */
int fp8wire_version(void);

/* Explicit step windows for the exposure profiler, for jobs that do not mark steps with NVTX ranges
 * ("step" / "ProfilerStep#N"). begin/end must pair; nested steps are not supported. */
void fp8wire_step_begin(int64_t step);
void fp8wire_step_end(int64_t step);

/* Writes the profiler's report now (it is also written at exit and every profiler.report_every steps). */
void fp8wire_profiler_flush(void);

/* Totals since start (or the last reset): calls, caller bytes and wire bytes by path
 * (0 passthrough, 1 two_shot, 2 one_shot, 3 ring, 4 fallback). */
typedef struct fp8wire_totals {
  uint64_t calls[5];
  uint64_t app_bytes[5];
  uint64_t wire_bytes[5];
  uint64_t dropped_records;
} fp8wire_totals;
void fp8wire_get_totals(fp8wire_totals* out);

/* Error feedback (error_feedback.enable): the identity of the tensor the next all-reduce issued on
 * this thread carries, e.g. a DDP bucket index (key != 0). The quantization residual of one call is
 * added to the next call with the same key, never to another tensor's; a call with no key gets no
 * feedback. Harmless when error feedback is off or the library is not loaded. */
void fp8wire_set_feedback_key(uint64_t key);

#ifdef __cplusplus
}
#endif

#endif /* FP8WIRE_H */
