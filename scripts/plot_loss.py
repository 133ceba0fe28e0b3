#!/usr/bin/env python3
"""Plots the loss curves of one or more fp8wire-train JSON-lines logs into a PNG (matplotlib).

    scripts/plot_loss.py out/pi05/train_log.jsonl [more.jsonl ...] -o out/pi05/loss.png [--smooth 20]
"""
import argparse
import json
import os
import sys


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("logs", nargs="+", help="train_log.jsonl files")
    p.add_argument("-o", "--output", default="loss.png", help="PNG to write (default loss.png)")
    p.add_argument("--smooth", type=int, default=0, help="moving-average window in steps (0 = raw)")
    args = p.parse_args()
    try:
        import matplotlib
        matplotlib.use("Agg")  # no display on the training machines
        import matplotlib.pyplot as plt
    except ImportError:
        print("plot_loss: matplotlib is not installed; nothing plotted", file=sys.stderr)
        return 2

    fig, ax = plt.subplots(figsize=(8, 4.5))
    plotted = 0
    for path in args.logs:
        if not os.path.exists(path):
            print(f"plot_loss: {path} does not exist; skipped", file=sys.stderr)
            continue
        records = [json.loads(line) for line in open(path) if line.strip()]
        steps = [r["step"] for r in records]
        loss = [r["loss"] for r in records]
        if args.smooth > 1:
            w = args.smooth
            loss = [sum(loss[max(0, i - w + 1):i + 1]) / len(loss[max(0, i - w + 1):i + 1]) for i in range(len(loss))]
        label = os.path.basename(os.path.dirname(os.path.abspath(path))) or path
        ax.plot(steps, loss, label=label)
        plotted += 1
    if not plotted:
        print("plot_loss: no log to plot", file=sys.stderr)
        return 2
    ax.set_xlabel("step")
    ax.set_ylabel("flow-matching loss")
    ax.set_yscale("log")
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(args.output, dpi=120)
    print(f"plot_loss: wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
