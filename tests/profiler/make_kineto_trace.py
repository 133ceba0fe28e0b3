#!/usr/bin/env python3
"""Writes a synthetic PyTorch profiler (Kineto) trace of a data-parallel training job, for sizing and
timing `fp8wire-prof analyze` on traces far larger than a test can keep in the repository.

    make_kineto_trace.py OUT.json[.gz] [--steps 1000] [--comm-per-step 100] [--ranges-per-step 100]
                         [--target-mib 1024] [--seed 0]

Per step (ProfilerStep#N, 0.4 ms per range): --ranges-per-step user_annotation ranges ("bucket_<k>"), the
first --comm-per-step of them each launching one NCCL all-reduce kernel half hidden behind a gemm;
compute kernels each with their cuda_runtime launch and cpu_op, with the args Kineto records (grid,
block, occupancy, input dims), added until the file reaches about --target-mib. Events are written
in Kineto's order (CPU events, then GPU ones per step), streamed, so any size fits in memory.
The expected figures are printed at the end: every step has the same exposed communication,
comm_per_step x 100 us, which `analyze` must report.
"""
import argparse
import gzip
import sys


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out")
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--comm-per-step", type=int, default=100)
    p.add_argument("--ranges-per-step", type=int, default=100)
    p.add_argument("--target-mib", type=float, default=1024)
    args = p.parse_args()
    for name in ("steps", "comm_per_step", "ranges_per_step"):
        if getattr(args, name) < 1:
            sys.exit(f"make_kineto_trace: --{name.replace('_', '-')} must be at least 1")
    if args.comm_per_step > args.ranges_per_step:
        sys.exit("make_kineto_trace: --comm-per-step must not exceed --ranges-per-step (each launches inside a range)")

    # 400 us per range: its all-reduce (200 us) and gemm (200 us, 100 us before it) never meet the
    # next range's kernels, so the expected figures are exact.
    slot_us = 400
    step_us = (args.ranges_per_step + 1) * slot_us
    # Text per event group as written below (measured): a compute unit (cpu_op + launch + kernel)
    # ~1020 bytes, a range ~185, a communication launch + kernel + gemm ~860; the compute per step
    # fills the rest of the target.
    unit_bytes, fixed_per_step = 1020, 185 * args.ranges_per_step + 860 * args.comm_per_step
    per_step = args.target_mib * (1 << 20) / args.steps
    compute_per_step = max(1, int((per_step - fixed_per_step) / unit_bytes))

    opener = gzip.open if args.out.endswith(".gz") else open
    kw = {"compresslevel": 1} if args.out.endswith(".gz") else {}
    corr = 1
    written = 0
    base_ts = 1_700_000_000_000_000  # epoch microseconds, as Kineto writes them
    with opener(args.out, "wt", **kw) as f:
        def out(text):
            nonlocal written
            f.write(text)
            written += len(text)

        out('{"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "NVIDIA H200", "totalGlobalMem": '
            '150754820096}], "distributedInfo": {"backend": "nccl", "rank": 0, "world_size": 2}, '
            '"traceEvents": [\n')
        first = True

        def event(text):
            nonlocal first
            out(("" if first else ",\n") + text)
            first = False

        for s in range(args.steps):
            t0 = base_ts + s * step_us
            event(f'{{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#{s}", "pid": 1234, "tid": 1234, '
                  f'"ts": {t0}, "dur": {step_us - 50}, "args": {{"External id": {corr}, "Record function id": 0, '
                  f'"Ev Idx": 0}}}}')
            gpu = []
            for k in range(args.ranges_per_step):
                r0 = t0 + 20 + k * slot_us
                event(f'{{"ph": "X", "cat": "user_annotation", "name": "bucket_{k}", "pid": 1234, "tid": 1234, '
                      f'"ts": {r0}, "dur": {slot_us - 10}, "args": {{"External id": {corr}, '
                      f'"Record function id": 0, "Ev Idx": {k}}}}}')
                if k < args.comm_per_step:
                    event(f'{{"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernelExC", "pid": 1234, '
                          f'"tid": 1234, "ts": {r0 + 2}, "dur": 4, "args": {{"External id": {corr}, '
                          f'"cbid": 430, "correlation": {corr}}}}}')
                    # 200 us all-reduce, the first 100 us under the gemm launched just before it.
                    gpu.append(f'{{"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllReduce_Sum_bf16_RING_LL", '
                               f'"pid": 0, "tid": 20, "ts": {r0 + 5}, "dur": 200, "args": {{"External id": {corr}, '
                               f'"queued": 0, "device": 0, "context": 1, "stream": 20, "correlation": {corr}, '
                               f'"registers per thread": 96, "shared memory": 0, "blocks per SM": 0.125, '
                               f'"warps per SM": 2.5, "grid": [16, 1, 1], "block": [640, 1, 1], '
                               f'"est. achieved occupancy %": 4}}}}')
                    gpu.append(f'{{"ph": "X", "cat": "kernel", "name": "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n", '
                               f'"pid": 0, "tid": 7, "ts": {r0 - 95}, "dur": 200, "args": {{"External id": {corr}, '
                               f'"device": 0, "stream": 7, "correlation": {corr + 10**9}, "grid": [132, 1, 1], '
                               f'"block": [384, 1, 1], "est. achieved occupancy %": 19}}}}')
                    corr += 1
            for c in range(compute_per_step):
                # Short elementwise kernels inside the first slot's gemm: they add text, not time.
                k0 = t0 + 30 + (c % 50)
                event(f'{{"ph": "X", "cat": "cpu_op", "name": "aten::mul", "pid": 1234, "tid": 1234, "ts": {k0}, '
                      f'"dur": 3, "args": {{"External id": {corr}, "Record function id": 0, "Ev Idx": {c}, '
                      f'"Input Dims": [[4096, 2048], [4096, 2048]], "Input type": ["c10::BFloat16", '
                      f'"c10::BFloat16"], "Input Strides": [[2048, 1], [2048, 1]], "Concrete Inputs": ["", ""]}}}}')
                event(f'{{"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1234, "tid": 1234, '
                      f'"ts": {k0 + 1}, "dur": 2, "args": {{"External id": {corr}, "cbid": 211, '
                      f'"correlation": {corr}}}}}')
                gpu.append(f'{{"ph": "X", "cat": "kernel", "name": "void at::native::elementwise_kernel<128, 4>'
                           f'(int, at::native::BinaryFunctor<c10::BFloat16>)", "pid": 0, "tid": 7, "ts": {k0 + 4}, '
                           f'"dur": 1, "args": {{"External id": {corr}, "queued": 0, "device": 0, "context": 1, '
                           f'"stream": 7, "correlation": {corr}, "registers per thread": 24, "shared memory": 0, '
                           f'"blocks per SM": 992.2, "warps per SM": 3968.9, "grid": [131072, 1, 1], '
                           f'"block": [128, 1, 1], "est. achieved occupancy %": 100}}}}')
                corr += 1
            for g in gpu:
                event(g)
        out('\n], "traceName": "synthetic"}\n')
    print(f"make_kineto_trace: {args.out}: {written / (1 << 20):.0f} MiB of JSON text, {args.steps} steps, "
          f"{args.steps * args.comm_per_step} NCCL kernels, {args.steps * args.ranges_per_step} ranges, "
          f"{args.steps * (compute_per_step + args.comm_per_step)} compute kernels; expected exposed communication "
          f"{args.comm_per_step * 0.1:.3f} ms per step")


if __name__ == "__main__":
    main()
