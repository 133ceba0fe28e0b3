"""Common parts of the integration tests: each trains a small model of its own for 100+ steps on
emulated ranks (several processes on GPU 0, each its own NCCL_HOSTID, so NCCL joins them over
sockets), once with plain NCCL and once with libfp8wire.so preloaded, both at the same time on the
one GPU, with the same seed and data, and judges the pair (parity.py).

Parent side: run_pair() starts both runs, prints PASS/FAIL lines, a `RESULT {json}` line and writes
OUT/<name>.result.json (scripts/gpu/integration.sh builds its table from those). Exit status: 0 pass,
1 fail, 77 skipped (no GPU, a missing package), as ctest expects.
Worker side: init() and finish().

--cpu runs the same workers on the CPU with the gloo backend (no library, no NCCL): a check of the
tests' own Python logic on a machine without a GPU."""
import argparse
import faulthandler
import hashlib
import json
import os
import resource
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(REPO, "tests", "pylib"))
import emulated_launch  # noqa: E402
import parity  # noqa: E402
import verdict  # noqa: E402

# Thresholds low enough that the small models' gradient collectives go FP8 (their layers are
# 64 KiB .. 1 MiB), high enough that scalars (loss, norms) stay exact.
FP8_THRESHOLD = "32KiB"


def fp8_environment(shim):
    env = {"LD_PRELOAD": os.path.abspath(shim), "FP8WIRE_LOG_LEVEL": "info"}
    for collective in ("ALL_REDUCE", "REDUCE_SCATTER"):
        for fabric in ("NET", "PCIE", "NVLINK"):
            env[f"FP8WIRE_THRESHOLDS_{collective}_{fabric}"] = FP8_THRESHOLD
    return env


def default_shim():
    return os.environ.get("FP8WIRE_SHIM_LIB") or os.path.join(REPO, "build", "shim", "libfp8wire.so")


def parser(description, steps=120):
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--steps", type=int, default=steps)
    ap.add_argument("--shim", default=default_shim())
    ap.add_argument("--out", default=os.environ.get("OUT") or os.path.join(REPO, "out", "integration"))
    ap.add_argument("--timeout", type=float, default=200.0, help="seconds each run (all its ranks) may take")
    ap.add_argument("--cpu", action="store_true", help="check the test's logic on the CPU (gloo, no library)")
    return ap


def skip(name, why):
    print(f"SKIPPED {name}: {why}", flush=True)
    return 77


def preflight(name, args, needs=()):
    """None when the test can run, else its exit status (77: skipped, 1: failed)."""
    for module in ("torch", *needs):
        import importlib.util

        if importlib.util.find_spec(module) is None:
            return skip(name, f"Python package '{module}' is not installed (scripts/gpu/integration.sh "
                               "installs the carried wheels from .whl/)")
    if args.cpu:
        return None
    return verdict.preflight(name, args.shim)


def report(name, checks, summary, out):
    for label, ok, detail in checks:
        print(f"{'PASS' if ok else 'FAIL'} {name}: {label}" + (f" ({detail})" if detail else ""), flush=True)
    print("RESULT " + json.dumps(summary), flush=True)
    if out:
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, f"{name}.result.json"), "w") as f:
            json.dump(summary, f)
    return 0 if summary.get("ok") else 1


def start_pair(name, script, args, nproc, worker_args=(), common_env=None, fp8_env=None):
    """Starts the plain and the fp8wire run at once; returns (plain, fp8) Launch objects."""
    common = dict(common_env or {})
    wargs = ["--steps", str(args.steps), *worker_args] + (["--cpu"] if args.cpu else [])
    extra = dict(common)
    if not args.cpu:
        extra.update(fp8_environment(args.shim))
    extra.update(fp8_env or {})
    log_dir = os.path.join(args.out, name)
    plain = emulated_launch.Launch(script, nproc, common, wargs, args.timeout, log_dir, f"{name}_plain")
    fp8 = emulated_launch.Launch(script, nproc, extra, wargs, args.timeout, log_dir, f"{name}_fp8wire")
    return plain, fp8


def run_pair(name, script, args, nproc, worker_args=(), common_env=None, fp8_env=None,
             fp8_expectation="required"):
    t = time.time()
    plain, fp8 = start_pair(name, script, args, nproc, worker_args, common_env, fp8_env)
    ok_plain, res_plain = plain.wait()
    ok_fp8, res_fp8 = fp8.wait()
    print(f"INFO {name}: plain {plain.elapsed_s:.0f} s (rc {plain.returncodes}), fp8wire {fp8.elapsed_s:.0f} s "
          f"(rc {fp8.returncodes}), logs in {os.path.join(args.out, name)}", flush=True)
    checks, summary = parity.evaluate(name, res_plain, res_fp8, nproc,
                                      "none" if args.cpu else fp8_expectation)
    checks.insert(0, ("plain run completed", ok_plain, "" if ok_plain else f"rc {plain.returncodes}"))
    checks.insert(1, ("fp8wire run completed", ok_fp8, "" if ok_fp8 else f"rc {fp8.returncodes}"))
    summary["ok"] = all(ok for _, ok, _ in checks)
    summary["seconds"] = round(time.time() - t, 1)
    if args.cpu:
        summary["stack"] += " (cpu check)"
    return report(name, checks, summary, args.out)


# --- worker side ----------------------------------------------------------------------------------

class Ctx:
    def __init__(self, rank, world, device, backend, cpu):
        self.rank, self.world, self.device, self.backend, self.cpu = rank, world, device, backend, cpu


def init(args, timeout_s=None, init_process_group=True):
    """Rank set-up: GPU 0 (or the CPU with --cpu), no core files, Python stacks dumped if the rank
    outlives its run's time limit, the default process group."""
    import datetime

    import torch
    import torch.distributed as dist

    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    faulthandler.dump_traceback_later(max(5.0, args.timeout - 10), exit=False)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if args.cpu:
        device, backend = torch.device("cpu"), "gloo"
        torch.set_num_threads(1)
    else:
        torch.cuda.set_device(0)
        device, backend = torch.device("cuda:0"), "nccl"
    if init_process_group:
        kwargs = {"device_id": device} if backend == "nccl" else {}
        if timeout_s:
            kwargs["timeout"] = datetime.timedelta(seconds=timeout_s)
        dist.init_process_group(backend, **kwargs)
    return Ctx(rank, world, device, backend, args.cpu)


def digest(tensors):
    """sha256 over the bytes of full parameter tensors (moved to the CPU)."""
    import torch

    h = hashlib.sha256()
    for t in tensors:
        t = t.detach()
        if t.dtype == torch.bfloat16:
            t = t.view(torch.int16)
        h.update(t.cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def finish(ctx, args, losses, eval_loss, param_sha256, extra=None, destroy=True):
    import torch.distributed as dist

    result = {"rank": ctx.rank, "losses": [float(x) for x in losses], "eval_loss": float(eval_loss),
              "param_sha256": param_sha256, "totals": emulated_launch.fp8wire_totals()}
    result.update(extra or {})
    emulated_launch.write_result(args.worker, ctx.rank, result)
    if destroy and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
    faulthandler.cancel_dump_traceback_later()
