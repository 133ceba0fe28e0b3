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

/* 1 when libfp8wire.so is loaded and able to carry eligible NCCL calls itself, 0 otherwise. Before
 * the job's first NCCL call: its configuration is valid and enables it, NCCL is in the process (or
 * nccl.library names a file) and the machine has a CUDA driver. After it: the real NCCL was found,
 * the scheduler started, and the driver sees at least one GPU. Never sets the library up, and before
 * set-up never initialises CUDA, so it is safe before the job has loaded NCCL or forked. Without the
 * library the symbol is absent: resolve it with dlsym. */
int fp8wire_active(void);

/* Path slots of the totals. Paths are numbered from 0; slots past the last path stay zero. */
#define FP8WIRE_MAX_PATHS 16

/* Name of path slot i ("passthrough", "two_shot", ...), or "" for an unused slot; NULL when i is
 * outside [0, FP8WIRE_MAX_PATHS). The names are stable; report totals by name, not by index. */
const char* fp8wire_path_name(int i);

/* 1 when path slot i is one fp8wire carries itself (FP8 on the wire), 0 for pass-through, fallback,
 * unused slots and i out of range. */
int fp8wire_path_is_fp8(int i);

/* Totals since start (or the last reset): calls, caller bytes and wire bytes by path slot. */
typedef struct fp8wire_totals {
  uint64_t calls[FP8WIRE_MAX_PATHS];
  uint64_t app_bytes[FP8WIRE_MAX_PATHS];
  uint64_t wire_bytes[FP8WIRE_MAX_PATHS];
  uint64_t dropped_records;
} fp8wire_totals;
void fp8wire_get_totals(fp8wire_totals* out);

/* Transport slots of the transport totals. Transports are numbered from 0; slots past the last stay zero. */
#define FP8WIRE_MAX_TRANSPORTS 8

/* Name of transport slot i: "nccl" (NCCL's own transports: every pass-through call and FP8 calls
 * whose bytes NCCL moved), "peer_memory" or "host_memory" (fp8wire's direct transports), "" for an
 * unused slot; NULL when i is outside [0, FP8WIRE_MAX_TRANSPORTS). Report by name, not by index. */
const char* fp8wire_transport_name(int i);

/* Totals since start (or the last reset) by the transport that carried each call's bytes: whether a
 * job's calls went over a direct transport shows here. */
typedef struct fp8wire_transport_totals {
  uint64_t calls[FP8WIRE_MAX_TRANSPORTS];
  uint64_t app_bytes[FP8WIRE_MAX_TRANSPORTS];
  uint64_t wire_bytes[FP8WIRE_MAX_TRANSPORTS];
} fp8wire_transport_totals;
void fp8wire_get_transport_totals(fp8wire_transport_totals* out);

/* Call-kind slots of the per-call-kind totals: the NCCL function the application called. */
#define FP8WIRE_MAX_CALL_KINDS 16

/* Name of call-kind slot i ("all_reduce", "reduce_scatter", "all_gather", "broadcast", "reduce",
 * "send", "recv", "all_to_all"), "" for an unused slot; NULL when i is outside
 * [0, FP8WIRE_MAX_CALL_KINDS). Report by name, not by index. */
const char* fp8wire_call_kind_name(int i);

/* Totals since start (or the last reset) by the NCCL function the application called: its calls by
 * path slot, its caller bytes, the bytes this rank sent on the wire, and the bytes NCCL's own
 * algorithm sends for the same calls (the baseline of wire_bytes). A send and a receive count at
 * their own end (a receive sends nothing). The layout is versioned by size: set `size` to
 * sizeof(fp8wire_kind_totals) before the call; the library fills what both layouts hold (fields are
 * only ever added at the end) and writes its own size back. */
typedef struct fp8wire_kind_totals {
  uint64_t size;
  uint64_t calls[FP8WIRE_MAX_CALL_KINDS][FP8WIRE_MAX_PATHS];
  uint64_t app_bytes[FP8WIRE_MAX_CALL_KINDS];
  uint64_t wire_bytes[FP8WIRE_MAX_CALL_KINDS];
  uint64_t plain_wire_bytes[FP8WIRE_MAX_CALL_KINDS];
} fp8wire_kind_totals;
void fp8wire_get_kind_totals(fp8wire_kind_totals* out);

/* Telemetry (telemetry.sample_every): what the measured FP8 calls' quantizations did, by collective
 * slot and path slot, and what the guard (guard.enable) did. sq_error = sum (x - dequant(quant(x)))^2
 * and sq_input = sum x^2 over the finite blocks; the relative error is sqrt(sq_error / sq_input).
 * `input`: the quantization of the caller's data; `requant`: the requantization inside the two-shot
 * and ring all-reduce. A call's figures are counted once a later FP8 call on its communicator, this
 * query or the communicator's end finds it complete: a call still running is not in them yet. */
#define FP8WIRE_MAX_COLLECTIVES 8
typedef struct fp8wire_error_stats {
  double sq_error;
  double sq_input;
  uint64_t elements;
  uint64_t saturated;  /* |x / scale| beyond the format's range (0 with the current scale rules) */
  uint64_t flushed;    /* finite x != 0 that decodes to 0 */
  uint64_t nonfinite;  /* NaN or Inf inputs */
} fp8wire_error_stats;
typedef struct fp8wire_error_totals {
  uint64_t measured_calls[FP8WIRE_MAX_COLLECTIVES][FP8WIRE_MAX_PATHS];
  fp8wire_error_stats input[FP8WIRE_MAX_COLLECTIVES][FP8WIRE_MAX_PATHS];
  fp8wire_error_stats requant[FP8WIRE_MAX_COLLECTIVES][FP8WIRE_MAX_PATHS];
  uint64_t guard_trips[FP8WIRE_MAX_COLLECTIVES];       /* switches of a tensor to full precision */
  uint64_t guard_full_calls[FP8WIRE_MAX_COLLECTIVES];  /* calls the guard ran in full precision */
  uint64_t guard_resumed[FP8WIRE_MAX_COLLECTIVES];     /* returns to FP8 after guard.retry_after */
  /* The audit (audit.every): FP8 results against the same collective run in full precision through
   * the real NCCL; relative error sqrt(audit_sq_error / audit_sq_exact) over the finite elements. */
  uint64_t audited_calls[FP8WIRE_MAX_COLLECTIVES][FP8WIRE_MAX_PATHS];
  double audit_sq_error[FP8WIRE_MAX_COLLECTIVES][FP8WIRE_MAX_PATHS];
  double audit_sq_exact[FP8WIRE_MAX_COLLECTIVES][FP8WIRE_MAX_PATHS];
  uint64_t audit_nonfinite[FP8WIRE_MAX_COLLECTIVES][FP8WIRE_MAX_PATHS]; /* finite in only one of the two */
} fp8wire_error_totals;
void fp8wire_get_error_totals(fp8wire_error_totals* out);

/* Name of collective slot i ("all_reduce", "reduce_scatter", "all_gather", "all_to_all", "send_recv"), "" for an
 * unused slot, NULL when i is outside [0, FP8WIRE_MAX_COLLECTIVES). */
const char* fp8wire_collective_name(int i);

/* One measured call's figures by its sequence number (the `seq` of the profiler's per-collective
 * table): the relative quantization error of its inputs on this rank and of the requantization inside
 * it (0 where none). Returns 1 when the call was measured and its record is in (among the latest 1024
 * measured calls of the process), 0 otherwise; the outputs are then untouched. */
int fp8wire_call_error(uint64_t seq, double* input_rel_error, double* requant_rel_error);

/* Error feedback (error_feedback.enable): the identity of the tensor the next all-reduce issued on
 * this thread carries, e.g. a DDP bucket index (key != 0). The quantization residual of one call is
 * added to the next call with the same key, never to another tensor's; a call with no key gets no
 * feedback. Harmless when error feedback is off or the library is not loaded. */
void fp8wire_set_feedback_key(uint64_t key);

/* For a stalled job's diagnosis: every communicator fp8wire holds in this process, one line each (its
 * set-up, its error, its lanes busy or idle, the direct transport's flags that are not at rest and
 * each peer's state, its last call), written into buf (at most size bytes, always NUL-terminated when
 * size > 0). Returns the length of the whole text (more than size - 1: it was cut). Safe from any
 * thread, also while another thread is stuck in a CUDA or NCCL call; "" before any communicator. */
size_t fp8wire_debug_state(char* buf, size_t size);

#ifdef __cplusplus
}
#endif

#endif /* FP8WIRE_H */
