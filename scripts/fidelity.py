#!/usr/bin/env python3
"""Training fidelity of FP8-wire runs against a plain-NCCL run of the same seed and data: for each
candidate fp8wire-train JSON-lines log, the Pearson correlation of the loss curves, their mean
relative error |b - a| / |a|, the final-window gap, and the same correlation for the gradient-norm
curves. Prints a Markdown table; with --plot, draws loss and gradient norm side by side (matplotlib,
optional). Exits 1 when a candidate misses --min-pearson or --max-rel-err, 2 on unusable input.

    scripts/fidelity.py out/plain/train_log.jsonl fp8wire=out/fp8/train_log.jsonl ef=out/ef/train_log.jsonl \\
        --min-pearson 0.9995 --max-rel-err 0.005 --plot docs/fidelity.png
"""
import argparse
import sys

from loss_parity import pearson, read_log  # the same log reader and correlation as the two-run check


def compare(base, cand, window):
    steps = sorted(base.keys() & cand.keys())
    if len(steps) < 2:
        raise ValueError(f"only {len(steps)} common step(s); need at least 2")
    la, lb = [base[s][0] for s in steps], [cand[s][0] for s in steps]
    ga, gb = [base[s][1] for s in steps], [cand[s][1] for s in steps]
    rel = sum(abs(y - x) / max(abs(x), 1e-12) for x, y in zip(la, lb)) / len(steps)
    k = min(window, len(steps))
    end_a, end_b = sum(la[-k:]) / k, sum(lb[-k:]) / k
    return {
        "steps": len(steps),
        "loss_pearson": pearson(la, lb),
        "loss_rel_err": rel,
        "end_gap": (end_b - end_a) / max(abs(end_a), 1e-12),
        "grad_pearson": pearson(ga, gb),
        "grad_rel_err": sum(abs(y - x) / max(abs(x), 1e-12) for x, y in zip(ga, gb)) / len(steps),
    }


def plot(path, base_label, base, cands, smooth):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("fidelity: matplotlib is not installed; no plot", file=sys.stderr)
        return

    def smoothed(v):
        if smooth <= 1:
            return v
        return [sum(v[max(0, i - smooth + 1):i + 1]) / len(v[max(0, i - smooth + 1):i + 1]) for i in range(len(v))]

    fig, (ax_l, ax_g) = plt.subplots(1, 2, figsize=(13, 4.5))
    for label, rows in [(base_label, base)] + cands:
        steps = sorted(rows)
        ax_l.plot(steps, smoothed([rows[s][0] for s in steps]), label=label, linewidth=1)
        ax_g.plot(steps, smoothed([rows[s][1] for s in steps]), label=label, linewidth=1)
    ax_l.set_title(f"loss (moving average of {smooth})" if smooth > 1 else "loss")
    ax_g.set_title(f"gradient norm (moving average of {smooth})" if smooth > 1 else "gradient norm")
    for ax in (ax_l, ax_g):
        ax.set_xlabel("step")
        ax.set_yscale("log")
        ax.legend()
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"fidelity: plot {path}")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("baseline", help="JSONL log of the plain-NCCL run")
    p.add_argument("candidates", nargs="+", help="LABEL=path of each run to compare")
    p.add_argument("--min-pearson", type=float, default=0.9995)
    p.add_argument("--max-rel-err", type=float, default=0.005)
    p.add_argument("--window", type=int, default=100, help="final steps averaged for the end gap (default 100)")
    p.add_argument("--plot", help="PNG to draw")
    p.add_argument("--baseline-label", default="plain NCCL", help="legend name of the baseline (default 'plain NCCL')")
    p.add_argument("--smooth", type=int, default=10, help="moving average of the plot (default 10)")
    args = p.parse_args()
    try:
        base = read_log(args.baseline, ("loss", "grad_norm"))
        cands = []
        for c in args.candidates:
            label, sep, path = c.partition("=")
            if not sep or not label or not path:
                raise ValueError(f"candidate '{c}': expected LABEL=path")
            cands.append((label, read_log(path, ("loss", "grad_norm"))))
        results = [(label, compare(base, rows, args.window)) for label, rows in cands]
    except (OSError, ValueError) as e:
        print(f"fidelity: {e}", file=sys.stderr)
        return 2
    print("| run | steps | loss Pearson | loss mean rel err | end gap (last %d) | grad-norm Pearson | grad-norm mean rel err | result |"
          % args.window)
    print("|---|---|---|---|---|---|---|---|")
    failed = 0
    for label, r in results:
        ok = r["loss_pearson"] >= args.min_pearson and r["loss_rel_err"] <= args.max_rel_err
        failed += not ok
        print(f"| {label} | {r['steps']} | {r['loss_pearson']:.5f} | {100 * r['loss_rel_err']:.3f} % | "
              f"{100 * r['end_gap']:+.3f} % | {r['grad_pearson']:.5f} | {100 * r['grad_rel_err']:.3f} % | "
              f"{'PASS' if ok else 'FAIL'} |")
    print(f"(thresholds: loss Pearson >= {args.min_pearson}, mean relative error <= {100 * args.max_rel_err:.2f} %)")
    if args.plot:
        plot(args.plot, args.baseline_label, base, cands, args.smooth)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
