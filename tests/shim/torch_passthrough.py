#!/usr/bin/env python3
"""GPU tier of the shim: a real PyTorch job must give bitwise the same results with libfp8wire.so
preloaded as without it, when nothing is eligible for FP8.

Two ranks on one GPU (tests/pylib/emulated_launch.py: each its own NCCL_HOSTID, so NCCL treats them as
two hosts over sockets; side by side under a private MPS daemon where one can be started) run
all_reduce (sum, avg, max; bf16 and fp32), all_gather, reduce_scatter, broadcast, a collective on a
new_group, and barrier, on seeded random tensors of several sizes. Three runs:
  baseline   no LD_PRELOAD
  disabled   LD_PRELOAD=libfp8wire.so FP8WIRE_ENABLE=0
  enabled    LD_PRELOAD=libfp8wire.so FP8WIRE_ENABLE=1, every threshold 1TiB (all passes through)
Results of the preloaded runs are compared bitwise with the baseline. The shim's own log line
("resolved real NCCL ...") proves it was loaded and found NCCL; fp8wire_get_totals() shows it saw
the calls. Prints PASS/FAIL lines and a summary table at the end; details go under --out.

    python3 tests/shim/torch_passthrough.py --shim build/shim/libfp8wire.so --out /tmp/shim_gpu
"""
import argparse
import ctypes
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "pylib"))
import emulated_launch  # noqa: E402

WORLD = 2
SIZES = [1000, 4099, 1 << 20, 3 << 20]  # elements: small, odd, and a few MiB
HUGE = "1TiB"


def worker(out_dir: str) -> None:
    import torch
    import torch.distributed as dist

    rank = int(os.environ["RANK"])
    torch.cuda.set_device(0)
    dev = torch.device("cuda:0")
    dist.init_process_group("nccl", rank=rank, world_size=WORLD, device_id=dev)
    results = {}
    gen = torch.Generator(device="cpu")

    def randn(n, dtype, salt):
        gen.manual_seed(1000 * rank + salt)
        return torch.randn(n, generator=gen, dtype=torch.float32).to(dtype).to(dev)

    salt = 0
    for n in SIZES:
        for dtype in (torch.bfloat16, torch.float32):
            dname = str(dtype).split(".")[-1]
            for op_name, op in (("sum", dist.ReduceOp.SUM), ("avg", dist.ReduceOp.AVG), ("max", dist.ReduceOp.MAX)):
                salt += 1
                x = randn(n, dtype, salt)
                dist.all_reduce(x, op=op)
                results[f"all_reduce/{op_name}/{dname}/{n}"] = x.cpu()
            salt += 1
            x = randn(n, dtype, salt)
            gathered = torch.empty(n * WORLD, dtype=dtype, device=dev)
            dist.all_gather_into_tensor(gathered, x)
            results[f"all_gather/{dname}/{n}"] = gathered.cpu()
            salt += 1
            x = randn(n * WORLD, dtype, salt)
            shard = torch.empty(n, dtype=dtype, device=dev)
            dist.reduce_scatter_tensor(shard, x)
            results[f"reduce_scatter/{dname}/{n}"] = shard.cpu()
            salt += 1
            x = randn(n, dtype, salt)
            dist.broadcast(x, src=1)
            results[f"broadcast/{dname}/{n}"] = x.cpu()
    # A second communicator (ncclCommSplit under device_id-bound groups), then a collective on it.
    group = dist.new_group(ranks=list(range(WORLD)))
    x = randn(1 << 20, torch.bfloat16, 999)
    dist.all_reduce(x, group=group)
    results["new_group/all_reduce/bfloat16"] = x.cpu()
    dist.barrier()
    torch.cuda.synchronize()

    totals = None
    try:  # present only when libfp8wire.so is preloaded
        lib = ctypes.CDLL(None)
        class Totals(ctypes.Structure):  # shim/fp8wire.h: FP8WIRE_MAX_PATHS slots per figure
            _fields_ = [("calls", ctypes.c_uint64 * 16), ("app_bytes", ctypes.c_uint64 * 16),
                        ("wire_bytes", ctypes.c_uint64 * 16), ("dropped", ctypes.c_uint64)]
        t = Totals()
        lib.fp8wire_get_totals(ctypes.byref(t))
        totals = {"calls": list(t.calls), "wire_bytes": list(t.wire_bytes), "version": lib.fp8wire_version()}
    except (AttributeError, OSError):
        pass
    torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
    emulated_launch.write_result(out_dir, rank, {"totals": totals, "keys": len(results)})
    dist.destroy_process_group()


def launch(name: str, env_extra: dict, out_root: str, timeout: float) -> dict:
    """One run of WORLD ranks, without the caller's FP8WIRE_* and LD_PRELOAD (only env_extra's)."""
    out_dir = os.path.join(out_root, name)
    run = emulated_launch.Launch(__file__, WORLD, env_extra, timeout_s=timeout, log_dir=out_dir, tag=name,
                                 drop_env_prefixes=("FP8WIRE_", "LD_PRELOAD"), result_dir=out_dir)
    run.wait(print_tails=False)
    codes = ["timeout" if rc is None or (run.timed_out and rc < 0) else rc for rc in run.returncodes]
    logs = [run.log_text(path) for path in run.log_paths()]
    meta = []
    for r in range(WORLD):
        path = os.path.join(out_dir, f"rank{r}.json")
        meta.append(json.load(open(path)) if os.path.exists(path) else None)
    return {"name": name, "dir": out_dir, "codes": codes, "logs": logs, "meta": meta, "seconds": run.elapsed_s,
            "testbed": run.testbed}


def compare(run: dict, base: dict) -> tuple:
    import torch
    mismatches, total = [], 0
    for r in range(WORLD):
        a = torch.load(os.path.join(base["dir"], f"rank{r}.pt"))
        b = torch.load(os.path.join(run["dir"], f"rank{r}.pt"))
        if a.keys() != b.keys():
            mismatches.append(f"rank{r}: different result sets")
            continue
        for k in a:
            total += 1
            x, y = a[k], b[k]
            same = x.dtype == y.dtype and x.shape == y.shape and torch.equal(
                x.view(torch.int16 if x.element_size() == 2 else torch.int32),
                y.view(torch.int16 if y.element_size() == 2 else torch.int32))
            if not same:
                mismatches.append(f"rank{r}:{k}")
    return total, mismatches


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shim", default="build/shim/libfp8wire.so")
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp") + "/shim_torch")
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds per run (both ranks)")
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)  # a rank: its result directory
    args = ap.parse_args()
    if args.worker is not None:
        worker(args.worker)
        return 0

    shim = os.path.abspath(args.shim)
    os.makedirs(args.out, exist_ok=True)
    thresholds = {f"FP8WIRE_THRESHOLDS_{c}_{f}": HUGE for c in ("ALL_REDUCE", "REDUCE_SCATTER", "ALL_GATHER")
                  for f in ("NVLINK", "PCIE", "NET")}
    configs = [
        ("baseline", {}),
        ("disabled", {"LD_PRELOAD": shim, "FP8WIRE_ENABLE": "0", "FP8WIRE_LOG_LEVEL": "info"}),
        ("enabled", {"LD_PRELOAD": shim, "FP8WIRE_ENABLE": "1", "FP8WIRE_LOG_LEVEL": "info", **thresholds}),
    ]
    if not os.path.exists(shim):
        print(f"FAIL shim not found: {shim}")
        return 1
    runs = {}
    checks = []  # (name, ok, detail)
    for name, env in configs:
        run = launch(name, env, args.out, args.timeout)
        runs[name] = run
        ok = all(c == 0 for c in run["codes"])
        checks.append((f"{name}: both ranks finished", ok, f"exit codes {run['codes']}, {run['seconds']:.1f} s"))
        if not ok:
            for r, text in enumerate(run["logs"]):
                print(f"--- {name} rank{r} log (tail) ---\n" + "\n".join(text.splitlines()[-25:]))
    for name in ("disabled", "enabled"):
        run = runs[name]
        resolved = [line for text in run["logs"] for line in text.splitlines() if "resolved real NCCL" in line]
        checks.append((f"{name}: shim loaded and resolved NCCL", len(resolved) == WORLD,
                       resolved[0].strip() if resolved else "no 'resolved real NCCL' line in the rank logs"))
        errors = [line for text in run["logs"] for line in text.splitlines() if "fp8wire" in line and " ERROR " in line]
        checks.append((f"{name}: no fp8wire errors", not errors, errors[0].strip() if errors else "none"))
        if all(c == 0 for c in run["codes"]) and all(c == 0 for c in runs["baseline"]["codes"]):
            total, bad = compare(run, runs["baseline"])
            checks.append((f"{name}: bitwise equal to baseline", not bad and total > 0,
                           f"{total - len(bad)}/{total} tensors equal" + (f"; first: {bad[:3]}" if bad else "")))
        meta = run["meta"][0] or {}
        totals = meta.get("totals")
        checks.append((f"{name}: fp8wire C API reachable", totals is not None, json.dumps(totals)))
    enabled_totals = (runs["enabled"]["meta"][0] or {}).get("totals") or {}
    if enabled_totals:
        fp8_calls = sum(enabled_totals["calls"][1:4])
        checks.append(("enabled: nothing went FP8 (thresholds 1TiB)", fp8_calls == 0,
                       f"calls by path {enabled_totals['calls']}"))

    with open(os.path.join(args.out, "summary.json"), "w") as f:
        json.dump([{"check": n, "ok": ok, "detail": d} for n, ok, d in checks], f, indent=1)
    print(f"\n==== shim GPU tier: torch pass-through (2 ranks, 1 GPU, {runs['baseline']['testbed']}) ====")
    for n, ok, d in checks:
        print(f"{'PASS' if ok else 'FAIL'}  {n:<48} {d}")
    failed = sum(not ok for _, ok, _ in checks)
    print(f"{len(checks) - failed}/{len(checks)} checks passed; logs under {args.out}")
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
