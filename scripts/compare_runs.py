#!/usr/bin/env python3
"""Side-by-side comparison of two profiled trainer runs (scripts/main-job.sh): plain NCCL vs
fp8wire. Reads each run folder written by `fp8wire-prof --out DIR` (DIR/report.json, merged over
ranks) and the trainer's log (DIR/train/train_log.jsonl), drops the first --skip steps (start-up,
allocator warm-up), and prints medians per step: step time, exposed communication, communication
union, compute, overlap, bytes asked for and bytes on the wire; then the trainer's own step time and
the loss parity of the two runs (scripts/loss_parity.py). Plain python3.

Bytes come from libfp8wire.so's call records, so a baseline run without it has none. Its wire bytes
are then what NCCL's own algorithms send for the fp8wire run's calls (report.json's
plain_wire_bytes: 2(N-1)/N of the buffer per rank for an all-reduce, N-1 chunks for a
reduce-scatter or all-gather), marked as computed: wire bytes against wire bytes, so the ratio
holds at any rank count, where the bytes asked for equal NCCL's wire bytes only at 2 ranks.

    scripts/compare_runs.py out/main-job/baseline out/main-job/fp8wire [--skip 5]
Exit status: 0, or 1 when the loss parity fails its bounds, 2 on unusable input.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys


def load_report(folder):
    path = os.path.join(folder, "report.json")
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        raise SystemExit(f"compare_runs: cannot read {path}: {e}")


def load_train_log(folder):
    path = os.path.join(folder, "train", "train_log.jsonl")
    rows = []
    try:
        with open(path) as f:
            rows = [json.loads(line) for line in f if line.strip()]
    except (OSError, ValueError) as e:
        raise SystemExit(f"compare_runs: cannot read {path}: {e}")
    return path, rows


def median_of(steps, key, stat="max"):
    values = []
    for s in steps:
        v = s.get(key)
        if isinstance(v, dict):
            v = v.get(stat)
        if v is not None:
            values.append(float(v))
    return statistics.median(values) if values else float("nan")


def bytes_mib(steps, key):
    """Median MiB per step, or NaN when the run has no byte counts (no shim: nothing to count)."""
    value = median_of(steps, key)
    return value / 2**20 if value > 0 else float("nan")


def nccl_wire_mib(baseline_steps, candidate_steps):
    """The NCCL column's wire MiB per step and whether it is computed: the baseline's own records when
    it ran under libfp8wire.so, else the fp8wire run's plain_wire_bytes, what NCCL's algorithms send
    for the same calls (NaN from a report that predates the field)."""
    measured = bytes_mib(baseline_steps, "wire_bytes")
    if measured == measured:
        return measured, False
    return bytes_mib(candidate_steps, "plain_wire_bytes"), True


def cell(fmt, value):
    return "-" if value != value else fmt.format(value)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("baseline")
    ap.add_argument("candidate")
    ap.add_argument("--skip", type=int, default=5, help="first steps left out (default 5)")
    ap.add_argument("--min-pearson", type=float, default=0.98)
    ap.add_argument("--max-rel-err", type=float, default=0.02)
    args = ap.parse_args()

    runs = []
    for folder in (args.baseline, args.candidate):
        report = load_report(folder)
        steps = [s for s in report.get("steps", []) if s.get("step", 0) >= args.skip]
        log_path, log = load_train_log(folder)
        log = [r for r in log if r.get("step", 0) >= args.skip]
        if not steps or not log:
            raise SystemExit(f"compare_runs: {folder}: no steps after skipping {args.skip} "
                             f"(report {len(report.get('steps', []))}, log {len(log)})")
        runs.append((folder, report, steps, log_path, log))

    base, cand = runs[0], runs[1]

    def per_run(fn):
        return fn(base[2], base[4]), fn(cand[2], cand[4])

    nccl_wire, computed = nccl_wire_mib(base[2], cand[2])
    computed = computed and nccl_wire == nccl_wire  # marked only where a figure stands
    wire_row = "MiB on the wire / step (all ranks)"
    rows = [
        ("profiled step ms (max over ranks)", per_run(lambda st, lg: median_of(st, "step_ms")), "{:.1f}"),
        ("exposed comm ms / step", per_run(lambda st, lg: median_of(st, "exposed_comm_ms")), "{:.1f}"),
        ("comm ms / step (union)", per_run(lambda st, lg: median_of(st, "comm_ms")), "{:.1f}"),
        ("compute ms / step (union)", per_run(lambda st, lg: median_of(st, "compute_ms")), "{:.1f}"),
        ("overlap % (mean over ranks)", per_run(lambda st, lg: median_of(st, "overlap_pct", "mean")), "{:.1f}"),
        # report.json: per step, bytes summed over ranks, from libfp8wire.so's call records (so 0
        # in a run without the shim: shown as '-', except the wire bytes NCCL's algorithms send).
        ("MiB asked for / step (all ranks)", per_run(lambda st, lg: bytes_mib(st, "app_bytes")), "{:.1f}"),
        (wire_row, (nccl_wire, bytes_mib(cand[2], "wire_bytes")), "{:.1f}"),
        ("trainer step ms (rank 0)", per_run(lambda st, lg: statistics.median(r["step_ms"] for r in lg)), "{:.1f}"),
        ("samples/s (all ranks)", per_run(lambda st, lg: statistics.median(r["samples_per_s"] for r in lg)), "{:.2f}"),
    ]
    name_w = max(len(r[0]) for r in rows)
    print(f"steps compared: from step {args.skip}; medians over steps")
    print(f"{'':{name_w}}  {'NCCL (bf16)':>12}  {'fp8wire':>12}  {'ratio':>7}")
    for label, (a, b), fmt in rows:
        ratio = f"{b / a:.3f}" if a and a == a and b == b else "-"
        mark = "*" if computed and label == wire_row else ""
        print(f"{label:{name_w}}  {cell(fmt, a) + mark:>12}  {cell(fmt, b):>12}  {ratio:>7}")
    if computed:
        print("* computed, not measured: what NCCL's own algorithms send for the fp8wire run's calls (its\n"
              "  report's plain_wire_bytes); the baseline ran without libfp8wire.so, so it has no call records")

    here = os.path.dirname(os.path.abspath(__file__))
    print("\nloss parity (same seed and data):")
    rc = subprocess.call([sys.executable, os.path.join(here, "loss_parity.py"), runs[0][3], runs[1][3],
                          "--min-pearson", str(args.min_pearson), "--max-rel-err", str(args.max_rel_err)])
    return 1 if rc else 0


if __name__ == "__main__":
    sys.exit(main())
