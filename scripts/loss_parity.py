#!/usr/bin/env python3
"""Loss parity of two fp8wire-train runs (same seed and data; e.g. without and with
LD_PRELOAD=libfp8wire.so). Reads the JSON-lines logs, pairs losses by step, and reports the Pearson
correlation of the two curves and the mean relative error |b - a| / |a|. Exits 1 when the
correlation is below --min-pearson or the error above --max-rel-err, 2 on unusable input.
Plain python3, no numpy.

    scripts/loss_parity.py out/bf16/train_log.jsonl out/fp8/train_log.jsonl --min-pearson 0.98 --max-rel-err 0.02
"""
import argparse
import json
import math
import sys


def read_log(path, fields):
    """An fp8wire-train JSON-lines log as {step: (the record's `fields`, as floats)}; ValueError names the
    first line that is not such a record."""
    names = ["'step'"] + [f"'{k}'" for k in fields]
    rows = {}
    with open(path) as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
                rows[int(record["step"])] = tuple(float(record[k]) for k in fields)
            except (ValueError, KeyError, TypeError) as e:
                raise ValueError(f"{path}:{number}: expected a JSON object with {', '.join(names[:-1])} and "
                                 f"{names[-1]} ({e})")
    return rows


def read_losses(path):
    return {step: values[0] for step, values in read_log(path, ("loss",)).items()}


def pearson(a, b):
    n = len(a)
    ma, mb = sum(a) / n, sum(b) / n
    cov = sum((x - ma) * (y - mb) for x, y in zip(a, b))
    va = sum((x - ma) ** 2 for x in a)
    vb = sum((y - mb) ** 2 for y in b)
    if va == 0 or vb == 0:
        # Two flat curves correlate perfectly only if they are the same curve.
        return 1.0 if a == b else 0.0
    return cov / math.sqrt(va * vb)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("baseline", help="JSONL log of the reference run")
    p.add_argument("candidate", help="JSONL log of the run to compare")
    p.add_argument("--min-pearson", type=float, default=0.95, help="lowest acceptable correlation (default 0.95)")
    p.add_argument("--max-rel-err", type=float, default=0.05, help="highest acceptable mean relative error (default 0.05)")
    p.add_argument("--skip", type=int, default=0, help="ignore steps below this one")
    args = p.parse_args()

    try:
        a, b = read_losses(args.baseline), read_losses(args.candidate)
    except (OSError, ValueError) as e:
        print(f"loss_parity: {e}", file=sys.stderr)
        return 2
    steps = sorted(s for s in a.keys() & b.keys() if s >= args.skip)
    if len(steps) < 2:
        print(f"loss_parity: only {len(steps)} common step(s) between {args.baseline} ({len(a)} steps) and "
              f"{args.candidate} ({len(b)} steps); need at least 2", file=sys.stderr)
        return 2
    la, lb = [a[s] for s in steps], [b[s] for s in steps]
    if not all(map(math.isfinite, la + lb)):
        print("loss_parity: FAIL non-finite loss in a log")
        return 1
    r = pearson(la, lb)
    rel = sum(abs(y - x) / max(abs(x), 1e-12) for x, y in zip(la, lb)) / len(steps)
    worst = max(steps, key=lambda s: abs(b[s] - a[s]) / max(abs(a[s]), 1e-12))
    ok = r >= args.min_pearson and rel <= args.max_rel_err
    print(f"steps {len(steps)} | baseline {la[0]:.4f} -> {la[-1]:.4f} | candidate {lb[0]:.4f} -> {lb[-1]:.4f} | "
          f"worst step {worst}: {a[worst]:.4f} vs {b[worst]:.4f}")
    print(f"{'PASS' if ok else 'FAIL'} pearson {r:.5f} (min {args.min_pearson}) "
          f"mean rel err {rel:.3e} (max {args.max_rel_err})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
