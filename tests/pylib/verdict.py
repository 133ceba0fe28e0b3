"""A test program's verdict: SKIPPED or FAIL before it runs where this machine cannot run it, else one
PASS or FAIL line per check; the exit status last (ctest's: 0 pass, 1 fail, 77 skipped)."""
import json
import os
import subprocess
import sys

import emulated_launch

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def preflight(name, shim):
    """None when a GPU test under the shim can run here, else its exit status after saying why:
    77 (SKIPPED: no torch or no CUDA device) or 1 (FAIL: the shim `shim` is not built)."""
    have_gpu, why = emulated_launch.gpu_available()
    if not have_gpu:
        print(f"SKIPPED {name}: {why}", flush=True)
        return 77
    if not os.path.isfile(shim):
        print(f"FAIL {name}: {shim} not found (build it first: cmake --build build --target fp8wire)", flush=True)
        return 1
    return None


def start(parser, name, worker):
    """The opening of a test script that launches itself as its ranks: parses `parser`'s arguments
    (emulated_launch.script_parser and the script's own); in a rank (--worker) runs worker(args);
    in the launcher, the preflight of "<name> n=<nproc>". Returns (args, title, status): status is
    the program's exit status when it ends here (0 after the worker, 77 or 1 from the preflight),
    None when the launcher goes on."""
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return args, name, 0
    title = f"{name} n={args.nproc}"
    return args, title, preflight(title, args.shim)


def report(prefix, checks):
    """Prints "PASS|FAIL <prefix>: <name> <detail>" for each (name, ok, detail) of `checks`; returns
    the program's exit status: 0 when every check passed, else 1."""
    failed = 0
    for name, ok, detail in checks:
        print(f"{'PASS' if ok else 'FAIL'} {prefix}: {name} {detail}", flush=True)
        failed += not ok
    return 1 if failed else 0


def write_loss_log(path, losses):
    """A JSON-lines loss log (one {"step", "loss"} per step), as fp8wire-train writes and
    scripts/loss_parity.py reads."""
    with open(path, "w") as f:
        for step, value in enumerate(losses):
            f.write(json.dumps({"step": step, "loss": value}) + "\n")


def loss_parity(baseline, candidate):
    """(ok, its verdict on one line) of scripts/loss_parity.py on two loss logs, at the main job's
    thresholds (Pearson >= 0.99, mean relative error <= 0.02)."""
    run = subprocess.run([sys.executable, os.path.join(REPO, "scripts", "loss_parity.py"), baseline, candidate,
                          "--min-pearson", "0.99", "--max-rel-err", "0.02"], capture_output=True, text=True)
    return run.returncode == 0, " | ".join((run.stdout + run.stderr).strip().splitlines())


def eval_loss_check(name, plain, got, tolerance=0.02):
    """The check "final evaluation loss within `tolerance` of plain NCCL" of run `name`."""
    rel = abs(got - plain) / abs(plain)
    return (f"{name}: final evaluation loss within {tolerance:.0%} of plain NCCL", rel <= tolerance,
            f"plain {plain:.5g} {name} {got:.5g} rel {rel * 100:.2f}%")
