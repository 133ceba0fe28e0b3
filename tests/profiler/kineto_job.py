#!/usr/bin/env python3
"""A small 2-rank PyTorch job profiled with torch.profiler, for `fp8wire-prof analyze` on a real
Kineto trace. Each rank writes TRACE_DIR/trace.rank<R>.json. Steps alternate between gradients
all-reduced per layer while the "backward" still runs (a side stream) and one merged all-reduce
after it, so the trace holds both hidden and exposed communication.

    python3 tests/pylib/emulated_launch.py --nproc 2 -- python3 tests/profiler/kineto_job.py TRACE_DIR

The launcher gives each rank its own emulated host on GPU 0 (NCCL_HOSTID) and, where it can, a
private MPS daemon; under torchrun on one GPU set NCCL_HOSTID per rank yourself.
"""
import os
import sys

import torch
import torch.distributed as dist

rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
out_dir = sys.argv[1]
os.makedirs(out_dir, exist_ok=True)
torch.cuda.set_device(0)
dist.init_process_group("nccl", device_id=torch.device("cuda:0"))

layers, width = 6, 2048
weights = [torch.randn(width, width, device="cuda") for _ in range(layers)]
grads = [torch.zeros(width * width, device="cuda") for _ in range(layers)]
x = torch.randn(4096, width, device="cuda")
side = torch.cuda.Stream()


def step(merged: bool):
    h = x
    handles = []
    for i in reversed(range(layers)):  # "backward": the last layer's gradient is ready first
        h = torch.relu(h @ weights[i])
        grads[i].copy_(h[:width].reshape(-1))  # a gradient-sized result of this layer
        if not merged:
            ready = torch.cuda.Event()
            ready.record()
            with torch.cuda.stream(side):
                side.wait_event(ready)
                with torch.profiler.record_function(f"grad_bucket_{i}"):
                    handles.append(dist.all_reduce(grads[i], async_op=True))
    if merged:
        flat = torch.cat(grads)
        with torch.profiler.record_function("merged_allreduce"):
            dist.all_reduce(flat)
    for handle in handles:
        handle.wait()
    torch.cuda.synchronize()


for _ in range(2):
    step(False)
    step(True)
activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
trace_path = os.path.join(out_dir, f"trace.rank{rank}.json")
with torch.profiler.profile(activities=activities, schedule=torch.profiler.schedule(wait=1, warmup=1, active=4),
                            on_trace_ready=lambda p: p.export_chrome_trace(trace_path)) as prof:
    for s in range(6):
        step(merged=(s % 2 == 1))
        prof.step()
dist.barrier()
dist.destroy_process_group()
print(f"rank {rank}: trace written", flush=True)
