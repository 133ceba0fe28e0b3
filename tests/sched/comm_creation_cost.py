#!/usr/bin/env python3
"""What a communicator's creation costs with libfp8wire.so (its agreement runs there) against plain
NCCL: N ranks on GPU 0 (emulated hosts) each create K process groups and time, per group, its NCCL
communicator's creation (torch creates it at the group's first collective, a 4-byte all-reduce here)
until that collective has finished, and the device memory the K communicators hold per rank (the
GPU's free memory before and after, every rank's groups created alike, divided by the ranks). One
launch per library given (and one without), one table.

  python3 tests/sched/comm_creation_cost.py --nproc 2 --groups 12 --lib build/shim/libfp8wire.so [--lib old.so]
"""
import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "pylib"))
import emulated_launch  # noqa: E402


def worker(result_dir, groups):
    import torch
    import torch.distributed as dist

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", rank=rank, world_size=world, device_id=torch.device("cuda", 0))
    x = torch.ones(1, device="cuda")
    dist.all_reduce(x)  # the default group: created and warm
    torch.cuda.synchronize()
    dist.barrier()
    free_before = torch.cuda.mem_get_info()[0]
    times = []
    kept = []  # every group stays alive to the end: its communicator's memory is what is measured
    for _ in range(groups):
        dist.barrier()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        g = dist.new_group(list(range(world)))
        dist.all_reduce(x, group=g)
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
        kept.append(g)
    dist.barrier()
    torch.cuda.synchronize()
    held_mib = (free_before - torch.cuda.mem_get_info()[0]) / world / 2**20
    dist.barrier()
    emulated_launch.write_result(result_dir, rank, {"ms": times, "held_mib": held_mib})
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--worker")
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--groups", type=int, default=12)
    p.add_argument("--lib", action="append", default=[], help="libfp8wire.so to preload (repeatable)")
    args = p.parse_args()
    if args.worker:
        return worker(args.worker, args.groups)
    ok_gpu, why = emulated_launch.gpu_available()
    if not ok_gpu:
        print(f"SKIPPED: {why}")
        return 77
    rows = []
    for lib in [None] + args.lib:
        env = {"LD_PRELOAD": os.path.abspath(lib)} if lib else {}
        ok, results = emulated_launch.launch(__file__, args.nproc, env, ["--groups", str(args.groups)], timeout_s=240)
        if not ok:
            print(f"FAIL: launch with {lib or 'no library'}")
            return 1
        all_ms = [t for r in results for t in r["ms"]]
        held = max(r["held_mib"] for r in results)  # every rank reads the same GPU: the last reading
        rows.append((lib or "plain NCCL", statistics.median(all_ms), min(all_ms), max(all_ms), held))
    base, base_held = rows[0][1], rows[0][4]
    print(f"communicator creation + first 4-byte all-reduce, {args.nproc} ranks, {args.groups} groups per rank")
    for name, med, lo, hi, held in rows:
        print(f"RESULT {name:<50} median {med:8.2f} ms (min {lo:.2f}, max {hi:.2f})  +{med - base:.2f} ms over plain; "
              f"{args.groups} groups hold {held:.0f} MiB of device memory per rank (+{held - base_held:.0f} MiB over plain)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
