#!/usr/bin/env python3
"""Ranks that finish at different times end a job cleanly, whatever carries the collectives.

Two ranks all-reduce a 64 MiB bf16 buffer five times; then rank 1 ends first (by
destroy_process_group(), or by leaving the process without it) while rank 0 goes on for 3 s (its
watchdog polling the communicator's error all the while) and then calls destroy_process_group(). Both
ways run under plain NCCL, fp8wire over NCCL's transports, and fp8wire's two direct transports (host
memory, peer memory). Each run must end with status 0 on every rank; the fp8wire runs must have made
FP8 calls. (Rank 0 ending first is left out: it hosts PyTorch's TCPStore, and plain NCCL jobs then
wait on the store, whatever carries the collectives.) Runs one after the other: each picks a free
port, and runs started together can pick the same one.

    test_teardown.py [--out DIR]"""
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

CALLS = 5
LATE_S = 3.0
STACKS = {
    "plain NCCL": None,
    "fp8wire over NCCL": {"FP8WIRE_DIRECT_TRANSPORT": "off"},
    "fp8wire direct host memory": {"FP8WIRE_DIRECT_TRANSPORT": "host_memory", "FP8WIRE_DIRECT_ASSUME_ONE_HOST": "1"},
    "fp8wire direct peer memory": {"FP8WIRE_DIRECT_TRANSPORT": "peer_memory", "FP8WIRE_DIRECT_ASSUME_ONE_HOST": "1"},
}


def worker(args):
    import torch
    import torch.distributed as dist

    import emulated_launch

    ctx = harness.init(args, timeout_s=60)
    first, how = int(os.environ["TEARDOWN_FIRST"]), os.environ["TEARDOWN_HOW"]  # the rank that ends first
    x = torch.randn(32 << 20, generator=torch.Generator().manual_seed(ctx.rank)).to(ctx.device, torch.bfloat16)
    for _ in range(CALLS):
        dist.all_reduce(x)
        x.div_(ctx.world)
    torch.cuda.synchronize()
    result = {"rank": ctx.rank, "totals": emulated_launch.fp8wire_totals()}
    emulated_launch.write_result(args.worker, ctx.rank, result)
    if ctx.rank == first:
        if how == "destroy":
            dist.destroy_process_group()
        sys.stdout.flush()
        os._exit(0)  # "exit": the process ends with its process group alive
    time.sleep(LATE_S)  # the peer is gone by now; PyTorch's watchdog polls the error meanwhile
    dist.destroy_process_group()
    print(f"rank {ctx.rank}: destroyed its process group {LATE_S:.0f} s after rank {first} ended", flush=True)


def main():
    ap = harness.parser(__doc__)
    args = ap.parse_args()
    if args.worker:
        worker(args)
        return 0
    name = "integration_teardown"
    stop = harness.preflight(name, args)
    if stop is not None:
        return stop
    import emulated_launch

    checks = []
    fp8_calls = 0
    for stack, fp8_env in STACKS.items():
        for how in ("destroy", "exit"):
            env = {"TEARDOWN_FIRST": "1", "TEARDOWN_HOW": how}
            if fp8_env is not None:
                env.update(harness.fp8_environment(args.shim))
                env.update(fp8_env)
            launch = emulated_launch.Launch(os.path.abspath(__file__), 2, env, ("--timeout", str(args.timeout)),
                                            timeout_s=args.timeout, tag=f"teardown_{len(checks)}")
            ok, results = launch.wait(print_tails=False)
            detail = f"exit codes {launch.returncodes}, {launch.elapsed_s:.0f} s"
            if fp8_env is not None:
                calls = min(((r.get("totals") or {}).get("fp8_calls", 0) for r in results), default=0)
                fp8_calls = max(fp8_calls, calls)
                detail += f", FP8 calls {calls}"
                ok &= calls >= CALLS
            if not ok:
                for path in launch.log_paths():
                    print(f"--- {path} (tail) ---\n{launch.log_text(path)[-2000:]}", flush=True)
            checks.append((f"{stack}: rank 1 ends first by {how}", ok, detail))
    summary = {"stack": name, "steps": CALLS, "pearson": None, "final_gap": None, "fp8_calls": fp8_calls,
               "ok": all(ok for _, ok, _ in checks)}
    return harness.report(name, checks, summary, args.out)


if __name__ == "__main__":
    sys.exit(main())
