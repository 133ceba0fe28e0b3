#!/usr/bin/env python3
"""Runs a GPU check script, or exits 77 (ctest: skipped) when this machine has no usable GPU.
    gpu_check.py SCRIPT [ARGS...]"""
import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "pylib"))
import emulated_launch  # noqa: E402

if len(sys.argv) < 2:
    sys.exit("usage: gpu_check.py SCRIPT [ARGS...]")
have_gpu, why = emulated_launch.gpu_available()
if not have_gpu:
    print(f"SKIPPED {os.path.basename(sys.argv[1])}: {why}")
    sys.exit(77)
sys.exit(subprocess.call([sys.executable, *sys.argv[1:]]))
