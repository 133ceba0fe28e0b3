#!/usr/bin/env python3
"""A job that times out must end with PyTorch's error under fp8wire, not hang.

Two ranks all-reduce a 2 MiB bf16 buffer (FP8 under the library) a few times; then rank 1 stops
taking part (it sleeps) while rank 0 issues the next all-reduce. PyTorch's watchdog sees the
collective pass its timeout (init_process_group(timeout=10 s)), aborts the communicator
(ncclCommAbort, through the library when it is loaded) and, with TORCH_NCCL_ASYNC_ERROR_HANDLING=1,
takes the process down with its error. Checked for the plain run and the fp8wire run alike: rank 0
ends by itself well before the run's time limit, with a non-zero status and PyTorch's timeout error in
its log (or raised to Python); in the fp8wire run FP8 calls were made before the stall.

    test_abort.py [--out DIR]"""
import os
import re
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

NCCL_TIMEOUT_S = 10
WARM_STEPS = 5
# PyTorch's words for a collective that ran past its timeout (watchdog log, DistBackendError).
TIMEOUT_ERROR = re.compile(r"Watchdog caught collective operation timeout|ran for \d+ milliseconds before timing out|"
                           r"timed out|DistBackendError", re.IGNORECASE)


def worker(args):
    import torch
    import torch.distributed as dist

    import emulated_launch

    ctx = harness.init(args, timeout_s=NCCL_TIMEOUT_S)
    x = torch.randn(1 << 20, generator=torch.Generator().manual_seed(ctx.rank)).to(ctx.device, torch.bfloat16)
    for _ in range(WARM_STEPS):
        dist.all_reduce(x)
        x.div_(ctx.world)
    if not ctx.cpu:
        torch.cuda.synchronize()
    state = {"rank": ctx.rank, "phase": "stalling", "totals": emulated_launch.fp8wire_totals()}
    emulated_launch.write_result(args.worker, ctx.rank, state)
    if ctx.rank != 0:
        time.sleep(3600)  # stops taking part; the parent ends this rank once rank 0 has ended
    t0 = time.time()
    try:
        for _ in range(1000):
            dist.all_reduce(x)
            if not ctx.cpu:
                torch.cuda.synchronize()
    except Exception as e:  # noqa: BLE001 -- the error is the expected outcome
        state.update(phase="error", error=f"{type(e).__name__}: {str(e)[:400]}", seconds=time.time() - t0)
        emulated_launch.write_result(args.worker, ctx.rank, state)
        print(f"rank 0 raised {type(e).__name__} after {time.time() - t0:.1f} s: {e}", flush=True)
        sys.stdout.flush()
        os._exit(3)
    state.update(phase="no error")
    emulated_launch.write_result(args.worker, ctx.rank, state)
    os._exit(0)


def judge(label, launch, results):
    rank0 = next((r for r in results if r.get("rank") == 0), {})
    log = launch.log_text(launch.log_paths()[0])
    rc = launch.returncodes[0]
    said = rank0.get("error") or (TIMEOUT_ERROR.search(log).group(0) if TIMEOUT_ERROR.search(log) else "")
    checks = [
        (f"{label}: rank 0 ended by itself ({launch.elapsed_s:.0f} s, limit {launch.timeout_s:.0f} s)",
         not launch.timed_out, "" if not launch.timed_out else "killed at the limit: the job hung"),
        (f"{label}: rank 0 ended with PyTorch's timeout error", rc != 0 and bool(said),
         f"status {rc}; {said[:160]}" if said else f"status {rc}, no timeout error in its log"),
    ]
    return checks, rank0


def main():
    ap = harness.parser(__doc__)
    args = ap.parse_args()
    if args.worker:
        worker(args)
        return 0
    name = "abort_on_timeout"
    stop = harness.preflight(name, args)
    if stop is not None:
        return stop
    # No flight-recorder dumps: they only lengthen the teardown.
    env = {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "1", "TORCH_NCCL_DUMP_ON_TIMEOUT": "0"}
    args.timeout = min(args.timeout, 120.0)
    plain, fp8 = harness.start_pair(name, os.path.abspath(__file__), args, 2, [], env)
    _, res_plain = plain.wait(stop_others_after_rank0=True, print_tails=False)
    _, res_fp8 = fp8.wait(stop_others_after_rank0=True, print_tails=False)
    checks, _ = judge("plain", plain, res_plain)
    more, rank0 = judge("fp8wire", fp8, res_fp8)
    checks += more
    calls = (rank0.get("totals") or {}).get("fp8_calls", 0)
    if not args.cpu:
        checks.append(("fp8wire: FP8 calls were made before the stall", calls > 0, str(calls)))
    summary = {"stack": name + (" (cpu check)" if args.cpu else ""), "steps": WARM_STEPS, "pearson": None,
               "final_gap": None, "fp8_calls": calls, "ok": all(ok for _, ok, _ in checks)}
    if not summary["ok"]:
        for launch in (plain, fp8):
            for path in launch.log_paths():
                print(f"--- {path} (tail) ---\n{launch.log_text(path)[-2000:]}", flush=True)
    return harness.report(name, checks, summary, args.out)


if __name__ == "__main__":
    sys.exit(main())
