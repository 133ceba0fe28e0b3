#!/usr/bin/env python3
"""The verdict of scripts/gpu/prof_direct.sh, from the run folders it leaves under OUT: direct, free
(train.allreduce=skip) and, when present, nccl. Each holds fp8wire-prof's per-rank files and the
trainer's train/train_log.jsonl; OUT/<run>.log is the run's output. Prints one row per run (medians
per step after the first --skip steps; the profiler's figures of rank 0) and three checks:
  - exposed communication: the profiler's, within 10 % of trainer step(direct) - step(free), an
    estimate from the trainer's own timer that never reads the profiler's records;
  - idle: the direct run's at most the free run's plus 10 % of its step;
  - the direct transport carried the calls (its log says so) and call-begin marks came.
Exit status 0 when all hold, 1 otherwise. Plain python3.

    scripts/gpu/prof_direct_check.py OUT [--skip 5] [--mode "MPS (private daemon)"]
"""
import argparse
import json
import os
import re
import statistics
import sys


def lines(path):
    try:
        with open(path) as f:
            return [json.loads(l) for l in f if l.strip()]
    except (OSError, ValueError):
        return []


def med(values):
    return statistics.median(values) if values else float("nan")


def f(v):
    return "-" if v != v else f"{v:.1f}"


def load(out, skip):
    rows = {}
    for label in ("nccl", "direct", "free"):
        d = os.path.join(out, label)
        if not os.path.isdir(d):
            continue
        train = lines(os.path.join(d, "train", "train_log.jsonl"))
        records = lines(os.path.join(d, "rank0.jsonl"))
        prof = [r for r in records if r.get("type") == "step"][skip:]
        summary = next((r for r in records if r.get("type") == "summary"), {})
        transports = sorted({c.get("transport") or "-" for r in prof for c in r.get("top", [])})
        log_path = os.path.join(out, label + ".log")
        log = open(log_path, errors="replace").read() if os.path.exists(log_path) else ""
        rows[label] = {
            "train_step": med([r["step_ms"] for r in train if r.get("step", 0) >= skip and "step_ms" in r]),
            "step": med([r["step_ms"] for r in prof]),
            "compute": med([r["compute_ms"] for r in prof]),
            "exposed": med([r["exposed_comm_ms"] for r in prof]),
            "wait": med([r.get("exposed_wait_ms", float("nan")) for r in prof]),
            "memcpy": med([r["exposed_memcpy_ms"] for r in prof]),
            "idle": med([r["idle_ms"] for r in prof]),
            "old_exposed": med([r.get("exposed_data_ms", float("nan")) for r in prof]),
            "old_idle": med([r["idle_ms"] + r.get("exposed_wait_ms", float("nan")) for r in prof]),
            "marks": summary.get("counters", {}).get("call_marks", 0),
            "transports": ",".join(t for t in transports if t != "-") or "-",
            "direct_in_log": bool(re.search(r"over (host_memory|peer_memory)", log)),
            "steps": len(prof),
        }
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--skip", type=int, default=5)
    ap.add_argument("--mode", default="")
    a = ap.parse_args()
    skip, mode = a.skip, a.mode
    rows = load(a.out, skip)
    print(f"\nprof_direct ({mode}); medians per step after the first {skip}, ms; profiler figures of rank 0")
    print(f"{'run':<7} {'steps':>5} {'trainer':>8} {'step':>8} {'compute':>8} {'exposed':>8} {'(wait)':>8} {'memcpy':>7} {'idle':>8} {'marks':>7}  transport")
    for label, r in rows.items():
        print(f"{label:<7} {r['steps']:>5} {f(r['train_step']):>8} {f(r['step']):>8} {f(r['compute']):>8} {f(r['exposed']):>8} "
              f"{f(r['wait']):>8} {f(r['memcpy']):>7} {f(r['idle']):>8} {r['marks']:>7}  {r['transports']}")
    if "direct" in rows:
        # What the rule before the peer waits counted (communication kernels only): the wait was idle.
        r = rows["direct"]
        print(f"{'(kernels only: the earlier rule)':<40} exposed {f(r['old_exposed'])}, idle {f(r['old_idle'])}")
    ok = True
    if "direct" in rows and "free" in rows:
        d, fr = rows["direct"], rows["free"]
        estimate = d["train_step"] - fr["train_step"]
        off = abs(d["exposed"] - estimate) / estimate if estimate > 0 else float("nan")
        good = off == off and off <= 0.10
        ok &= good
        print(f"exposed comm: profiler {f(d['exposed'])} ms vs trainer step(direct) - step(free) = "
              f"{f(d['train_step'])} - {f(fr['train_step'])} = {f(estimate)} ms: {f(100 * off)} % off (<= 10 %): "
              f"{'PASS' if good else 'FAIL'}")
        grown = d["idle"] - fr["idle"]
        good = grown == grown and grown <= 0.10 * d["step"]
        ok &= good
        print(f"idle: direct {f(d['idle'])} ms vs free {f(fr['idle'])} ms ({grown:+.1f}, allowed 10 % of the step, "
              f"{f(0.10 * d['step'])}): {'PASS' if good else 'FAIL'}")
        good = d["direct_in_log"] and d["marks"] > 0
        ok &= good
        print(f"direct transport carried the calls (log) and call-begin marks came ({d['marks']}): {'PASS' if good else 'FAIL'}")
    else:
        ok = False
        print("FAIL: the direct or the free run left no report")
    print("prof_direct:", "PASS" if ok else "FAIL")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
