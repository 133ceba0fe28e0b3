#!/usr/bin/env python3
"""Where a training step's GPU time goes: sums the kernels of a Chrome trace written by LibTorch's
profiler (fp8wire-train's train.profile_from, or torch.profiler's export_chrome_trace) by family.

    scripts/kernel_breakdown.py out/train/torch_trace.json [--steps 2] [--top 25] [--json out.json]

Families are matched on the kernel name, first match wins (FAMILIES below). Times are the sum of
kernel durations per step (kernels of one stream never overlap; across streams they may, so the sum
can exceed the step's wall time when communication overlaps compute). Exit status 1 with one line
naming the problem for a file that is not such a trace.
"""
import argparse
import gzip
import json
import re
import sys
from collections import defaultdict

# (family, pattern on the kernel name), first match wins.
FAMILIES = [
    ("nccl", r"nccl"),
    ("trainer fused", r"fp8wire::trainer::fused"),  # the trainer's RMSNorm/adaRMS, RoPE, gated GELU
    ("fp8wire codec", r"fp8wire|quantize|dequantize"),
    ("attention", r"fmha|flash|attention|attn|sdpa|softmax"),
    ("matmul", r"gemm|sm90_xmma|sm80_xmma|cutlass|nvjet|wgmma|cublas|splitkreduce"),
    ("optimizer", r"adam|multi_tensor|foreach"),
    ("norm / reduction", r"norm|reduce_kernel|reduction|welford"),
    # Copies and dtype casts by their functor's name ("nocast" in a binary op's name is not a cast).
    ("copy / cast", r"direct_copy|copy_kernel|_copy|memcpy|memset|fillfunctor|index|cat_|gather|scatter"),
    ("elementwise", r"elementwise|vectorized|unrolled|pointwise|triton|functor"),
]


def family(name):
    low = name.lower()
    for fam, pattern in FAMILIES:
        if re.search(pattern, low):
            return fam
    return "other"


def load(path):
    opener = gzip.open if path.endswith(".gz") else open
    try:
        with opener(path, "rt") as f:
            doc = json.load(f)
    except (OSError, ValueError) as e:
        sys.exit(f"kernel_breakdown: {path}: cannot read a JSON trace ({e})")
    events = doc.get("traceEvents") if isinstance(doc, dict) else doc
    if not isinstance(events, list):
        sys.exit(f"kernel_breakdown: {path}: no traceEvents list (expected a Chrome trace)")
    return events


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trace")
    ap.add_argument("--steps", type=int, default=0, help="steps in the trace (0: counted from 'step' ranges)")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--json")
    a = ap.parse_args()
    events = load(a.trace)
    kernels = [e for e in events if isinstance(e, dict) and e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    if not kernels:
        sys.exit(f"kernel_breakdown: {a.trace}: no GPU kernels in the trace (was it recorded with CUDA activities?)")
    steps = a.steps or sum(1 for e in events if isinstance(e, dict) and e.get("ph") == "X" and e.get("name") == "step") or 1
    by_family = defaultdict(float)
    by_name = defaultdict(lambda: [0.0, 0])
    for k in kernels:
        dur = float(k.get("dur", 0)) / 1000.0  # us -> ms
        name = str(k.get("name", "?"))
        by_family[family(name) if k.get("cat") == "kernel" else "copy / cast"] += dur
        by_name[name][0] += dur
        by_name[name][1] += 1
    begin = min(float(k["ts"]) for k in kernels)
    end = max(float(k["ts"]) + float(k.get("dur", 0)) for k in kernels)
    total = sum(by_family.values())
    span = (end - begin) / 1000.0
    print(f"{a.trace}: {len(kernels)} GPU activities over {steps} step(s); per step: kernel time {total / steps:.1f} ms, "
          f"first to last kernel {span / steps:.1f} ms")
    print(f"{'family':<20} {'ms/step':>9} {'share':>7}")
    for fam, ms in sorted(by_family.items(), key=lambda x: -x[1]):
        print(f"{fam:<20} {ms / steps:>9.2f} {100 * ms / total:>6.1f}%")
    print(f"\ntop {a.top} kernels (ms/step, launches/step, family):")
    top = sorted(by_name.items(), key=lambda x: -x[1][0])[: a.top]
    for name, (ms, n) in top:
        short = name if len(name) <= 110 else name[:107] + "..."
        print(f"{ms / steps:>8.2f} {n / steps:>7.0f}  {family(name):<16} {short}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"steps": steps, "kernel_ms_per_step": total / steps, "span_ms_per_step": span / steps,
                       "families": {k: v / steps for k, v in by_family.items()},
                       "top": [{"name": n, "ms_per_step": ms / steps, "launches_per_step": c / steps} for n, (ms, c) in top]},
                      f, indent=1)


if __name__ == "__main__":
    main()
