#!/usr/bin/env python3
"""One rank of scripts/gpu/direct_trace.sh: bf16 all-reduces and reduce-scatters as a PyTorch user
issues them (under LD_PRELOAD=libfp8wire.so, whatever transport the environment picks), 20 timed
back to back, then 10 more under torch.profiler with CUDA activity, whose trace it writes as
OUT/<op>_<MiB>MiB_w<world>_r<rank>.json. Prints the ms per call untraced and traced, and the
library's totals (how many calls went FP8, how many over a direct transport).

    emulated_launch.py --nproc N -- python3 scripts/gpu/direct_trace_job.py OUT 16,64 ar,rs
"""
import os
import sys

import torch
import torch.distributed as dist

rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
out, sizes, ops = sys.argv[1], [int(s) for s in sys.argv[2].split(",")], sys.argv[3].split(",")
os.makedirs(out, exist_ok=True)
torch.cuda.set_device(0)
dist.init_process_group("nccl", device_id=torch.device("cuda:0"))


def timed(call, n):
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(n):
        call()
    stop.record()
    torch.cuda.synchronize()
    return start.elapsed_time(stop) / n


results = {}
for op in ops:
    for mib in sizes:
        n = mib * 2**20 // 2
        x = torch.randn(n, device="cuda", dtype=torch.bfloat16) * 1e-3  # in place: sums stay small
        y = torch.empty(n // world, device="cuda", dtype=torch.bfloat16)
        call = (lambda: dist.all_reduce(x)) if op == "ar" else (lambda: dist.reduce_scatter_tensor(y, x))
        for _ in range(5):
            call()
        dist.barrier()
        torch.cuda.synchronize()
        plain = timed(call, 20)
        dist.barrier()
        torch.cuda.synchronize()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            traced = timed(call, 10)
        prof.export_chrome_trace(os.path.join(out, f"{op}_{mib}MiB_w{world}_r{rank}.json"))
        results[f"{op} {mib} MiB"] = (plain, traced)
        dist.barrier()

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
import fp8wire  # noqa: E402  (the source tree's package, as the tests use it)

totals = fp8wire.totals()
print(f"rank {rank}/{world}: " + ", ".join(f"{k} {v[0]:.3f} ms (traced {v[1]:.3f})" for k, v in results.items())
      + f"; fp8 calls {totals.fp8_calls}, direct {totals.direct_calls}", flush=True)
dist.destroy_process_group()
