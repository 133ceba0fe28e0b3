"""A test program's verdict: SKIPPED or FAIL before it runs where this machine cannot run it, else one
PASS or FAIL line per check; the exit status last (ctest's: 0 pass, 1 fail, 77 skipped)."""
import os

import emulated_launch


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


def report(prefix, checks):
    """Prints "PASS|FAIL <prefix>: <name> <detail>" for each (name, ok, detail) of `checks`; returns
    the program's exit status: 0 when every check passed, else 1."""
    failed = 0
    for name, ok, detail in checks:
        print(f"{'PASS' if ok else 'FAIL'} {prefix}: {name} {detail}", flush=True)
        failed += not ok
    return 1 if failed else 0
