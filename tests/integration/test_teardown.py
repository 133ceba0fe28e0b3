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

A run that stalls explains itself: each rank that has not finished after TEARDOWN_STALL_S seconds
(30 by default, before PyTorch's 60 s watchdog ends it) prints a "STALL" block, again every 10 s: the
step it is in, fp8wire's state of every communicator (fp8wire_debug_state: its lanes busy or idle,
the direct windows' flags not at rest and each peer's state, its last call) and every thread's
Python stack; a failed run's log tails show them.

--repeat N runs the row "direct host memory: rank 1 ends first by destroy", a hang of which was seen
once, and its neighbours N times each instead of the table, and counts the failures per row.

    test_teardown.py [--out DIR] [--repeat N]"""
import faulthandler
import os
import statistics
import sys
import threading
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


# The row a hang was seen in once, and its neighbours in the table (--repeat).
REPEAT_ROWS = [("fp8wire direct host memory", "destroy"), ("fp8wire over NCCL", "exit"),
               ("fp8wire direct host memory", "exit"), ("fp8wire direct peer memory", "destroy")]


def fp8wire_state():
    """Every communicator libfp8wire.so holds in this process (shim/fp8wire.h, fp8wire_debug_state)."""
    import ctypes

    try:
        state = ctypes.CDLL(None).fp8wire_debug_state
    except AttributeError:
        return "(libfp8wire.so is not loaded)"
    state.restype = ctypes.c_size_t
    state.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
    buf = ctypes.create_string_buffer(1 << 16)
    state(buf, len(buf))
    return buf.value.decode(errors="replace").strip() or "(no communicator)"


class StallWatch:
    """Prints this rank's state when it has not finished after TEARDOWN_STALL_S seconds, and every 10 s
    after: the step it is in, fp8wire's communicators and every thread's Python stack. A thread of its
    own, so that it speaks while the main thread is stuck in CUDA or NCCL."""

    def __init__(self, rank):
        self.rank, self.step, self.started = rank, "start", time.time()
        self.done = threading.Event()
        threading.Thread(target=self._watch, daemon=True).start()

    def _watch(self):
        wait_s = float(os.environ.get("TEARDOWN_STALL_S", "30"))
        while not self.done.wait(wait_s):
            print(f"STALL rank {self.rank}: in step '{self.step}' after {time.time() - self.started:.0f} s\n"
                  f"STALL rank {self.rank} fp8wire: {fp8wire_state()}", flush=True)
            faulthandler.dump_traceback(file=sys.stdout, all_threads=True)
            sys.stdout.flush()
            wait_s = 10.0


def worker(args):
    import torch
    import torch.distributed as dist

    import emulated_launch

    watch = StallWatch(int(os.environ["RANK"]))
    watch.step = "init_process_group"
    ctx = harness.init(args, timeout_s=60)
    first, how = int(os.environ["TEARDOWN_FIRST"]), os.environ["TEARDOWN_HOW"]  # the rank that ends first
    x = torch.randn(32 << 20, generator=torch.Generator().manual_seed(ctx.rank)).to(ctx.device, torch.bfloat16)
    for i in range(CALLS):
        watch.step = f"all-reduce {i + 1} of {CALLS}"
        dist.all_reduce(x)
        x.div_(ctx.world)
    watch.step = "synchronize after the all-reduces"
    torch.cuda.synchronize()
    result = {"rank": ctx.rank, "totals": emulated_launch.fp8wire_totals()}
    emulated_launch.write_result(args.worker, ctx.rank, result)
    if ctx.rank == first:
        if how == "destroy":
            watch.step = "destroy_process_group (ending first)"
            dist.destroy_process_group()
        sys.stdout.flush()
        os._exit(0)  # "exit": the process ends with its process group alive
    watch.step = f"waiting {LATE_S:.0f} s after rank {first} ended"
    time.sleep(LATE_S)  # the peer is gone by now; PyTorch's watchdog polls the error meanwhile
    watch.step = "destroy_process_group (ending last)"
    dist.destroy_process_group()
    watch.done.set()
    print(f"rank {ctx.rank}: destroyed its process group {LATE_S:.0f} s after rank {first} ended", flush=True)


def run_row(args, stack, how, tag):
    """One run of one row: (ok, detail, FP8 calls, seconds, stalled)."""
    import emulated_launch

    fp8_env = STACKS[stack]
    env = {"TEARDOWN_FIRST": "1", "TEARDOWN_HOW": how}
    if fp8_env is not None:
        env.update(harness.fp8_environment(args.shim))
        env.update(fp8_env)
    launch = emulated_launch.Launch(os.path.abspath(__file__), 2, env, ("--timeout", str(args.timeout)),
                                    timeout_s=args.timeout, tag=tag)
    ok, results = launch.wait(print_tails=False)
    detail = f"exit codes {launch.returncodes}, {launch.elapsed_s:.0f} s"
    calls = 0
    if fp8_env is not None:
        calls = min(((r.get("totals") or {}).get("fp8_calls", 0) for r in results), default=0)
        detail += f", FP8 calls {calls}"
        ok &= calls >= CALLS
    logs = {path: launch.log_text(path) for path in launch.log_paths()}
    stalled = any("STALL rank" in text for text in logs.values())
    if not ok:
        for path, text in logs.items():
            at = text.find("STALL rank")  # the rank's own account of where it stood, then the end
            shown = text[at:at + 12000] + "\n...\n" + text[-3000:] if at >= 0 else text[-3000:]
            print(f"--- {path} ---\n{shown}", flush=True)
    return ok, detail, calls, launch.elapsed_s, stalled


def repeat_rows(args, name):
    """--repeat N: each of REPEAT_ROWS N times; a PASS/FAIL line per row with its failure count."""
    checks, counts = [], {}
    for stack, how in REPEAT_ROWS:
        label = f"{stack[len('fp8wire '):] if stack.startswith('fp8wire ') else stack}: rank 1 ends first by {how}"
        failed, stalls, times = [], 0, []
        for i in range(args.repeat):
            ok, detail, _, seconds, stalled = run_row(args, stack, how, f"teardown_repeat_{len(counts)}_{i}")
            times.append(seconds)
            stalls += stalled
            if not ok:
                failed.append(i + 1)
                print(f"INFO {name}: {label}, run {i + 1} of {args.repeat} failed ({detail})", flush=True)
        counts[label] = {"runs": args.repeat, "failed": len(failed), "stalled": stalls}
        detail = (f"{len(failed)} of {args.repeat} failed{' (runs ' + ', '.join(map(str, failed)) + ')' if failed else ''}, "
                  f"{stalls} stalled; {min(times):.0f}/{statistics.median(times):.0f}/{max(times):.0f} s min/median/max; "
                  f"testbed {os.environ.get('FP8WIRE_TESTBED_MODE', '?')}")
        checks.append((f"{label}, repeated", not failed, detail))
    summary = {"stack": f"{name}_repeat", "steps": CALLS, "pearson": None, "final_gap": None, "repeat": counts,
               "testbed": os.environ.get("FP8WIRE_TESTBED_MODE", ""), "ok": all(ok for _, ok, _ in checks)}
    return harness.report(f"{name}_repeat", checks, summary, args.out)


def main():
    ap = harness.parser(__doc__)
    ap.add_argument("--repeat", type=int, default=0, help="run the row a hang was seen in and its neighbours N times")
    args = ap.parse_args()
    if args.worker:
        worker(args)
        return 0
    name = "integration_teardown"
    stop = harness.preflight(name, args)
    if stop is not None:
        return stop
    if args.repeat > 0:
        return repeat_rows(args, name)

    checks = []
    fp8_calls = 0
    for stack in STACKS:
        for how in ("destroy", "exit"):
            ok, detail, calls, _, _ = run_row(args, stack, how, f"teardown_{len(checks)}")
            fp8_calls = max(fp8_calls, calls)
            checks.append((f"{stack}: rank 1 ends first by {how}", ok, detail))
    summary = {"stack": name, "steps": CALLS, "pearson": None, "final_gap": None, "fp8_calls": fp8_calls,
               "ok": all(ok for _, ok, _ in checks)}
    return harness.report(name, checks, summary, args.out)


if __name__ == "__main__":
    sys.exit(main())
