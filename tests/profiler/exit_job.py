#!/usr/bin/env python3
"""A short one-GPU PyTorch job that ends the way jobs end when something goes wrong, for the
profiler's last flush (scripts/gpu/prof_exit.sh):

    exit_job.py MODE STEPS      MODE: exit | os_exit | sigterm | sigterm_handler

STEPS steps, each an NVTX range "step N" around a few matrix products, then: a normal exit;
os._exit(0) (no atexit handlers: multiprocessing workers, some launchers); SIGTERM to itself with
the default action (what torchrun sends the surviving ranks when one fails); or SIGTERM with a
Python handler that reports and exits 3 (the application's handler must still run). The whole job
takes well under the profiler's 2 s settle time, so without a final flush no step would be reported.
"""
import os
import signal
import sys
import time

import torch


def main():
    mode, steps = sys.argv[1], int(sys.argv[2])
    if mode == "sigterm_handler":
        def handler(signum, frame):
            print("exit_job: the application's SIGTERM handler ran", flush=True)
            sys.exit(3)
        signal.signal(signal.SIGTERM, handler)
    x = torch.randn(1024, 1024, device="cuda")
    for s in range(steps):
        torch.cuda.nvtx.range_push(f"step {s}")
        for _ in range(4):
            x = torch.tanh(x @ x)
        torch.cuda.synchronize()
        torch.cuda.nvtx.range_pop()
    print(f"exit_job: {steps} steps done, ending by {mode}", flush=True)
    if mode == "os_exit":
        os._exit(0)
    if mode.startswith("sigterm"):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(30)  # the signal ends the process before this does
    return 0


if __name__ == "__main__":
    sys.exit(main())
