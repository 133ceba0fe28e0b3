#!/usr/bin/env python3
"""Plots fp8wire-bench sweep JSONs: time vs size (log-log) for plain NCCL and each fp8wire path,
with the interquartile range as error bars and the measured crossover marked; below it the speedup
over plain NCCL. One column per (collective, dtype); several JSONs (e.g. --fabric both) are drawn
with one line style per fabric.

    python3 scripts/plot_sweep.py fp8wire-sweep.json [more.json ...] -o sweep.png
"""
import argparse
import json
import sys

STYLES = {"passthrough": ("black", "o"), "two_shot": ("tab:blue", "s"), "one_shot": ("tab:green", "^"),
          "ring": ("tab:red", "v")}
FABRIC_LINES = ["-", "--", ":", "-."]


def human(n):
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            v = n / (1 << shift)
            return f"{v:.0f} {unit}" if v == int(v) else f"{v:.1f} {unit}"
    return f"{n} B"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("sweeps", nargs="+", help="sweep JSON files written by fp8wire-bench sweep")
    ap.add_argument("-o", "--output", default="fp8wire-sweep.png", help="PNG to write")
    args = ap.parse_args()

    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        sys.exit("plot_sweep.py: matplotlib is not installed (pip install matplotlib)")

    runs = []
    for path in args.sweeps:
        try:
            with open(path) as f:
                runs.append(json.load(f))
        except (OSError, json.JSONDecodeError) as e:
            sys.exit(f"plot_sweep.py: cannot read sweep JSON '{path}': {e}")

    panels = []
    for run in runs:
        for p in run["points"]:
            key = (p["collective"], p["dtype"])
            if key not in panels:
                panels.append(key)
    if not panels:
        sys.exit("plot_sweep.py: no points in the given JSONs")

    fig, axes = plt.subplots(2, len(panels), figsize=(6.5 * len(panels), 8), squeeze=False,
                             gridspec_kw={"height_ratios": [3, 1.3]}, sharex="col")
    for col, (coll, dtype) in enumerate(panels):
        ax, sx = axes[0][col], axes[1][col]
        for fi, run in enumerate(runs):
            m = run["machine"]
            label_fabric = f"{m['fabric']}{' (emulated)' if m.get('emulated') else ''}"
            ls = FABRIC_LINES[fi % len(FABRIC_LINES)]
            # One curve per path and gather transport (a "both" sweep has two per FP8 path); the
            # send/recv curve is dotted. Old JSONs have no transport field: all-gather.
            curves = [(path, t) for path in STYLES for t in ("", "allgather", "sendrecv", "mixed")]
            for path, transport in curves:
                color, marker = STYLES[path]
                pts = sorted((p for p in run["points"] if p["collective"] == coll and p["dtype"] == dtype
                              and p["path"] == path and p.get("gather_transport", "") == transport
                              and p.get("supported", True) and p["time_us"]["n"] > 0),
                             key=lambda p: p["bytes"])
                if not pts:
                    continue
                suffix = {"sendrecv": "/sr", "mixed": "/mix"}.get(transport, "")
                curve_ls = ":" if transport == "sendrecv" else ls
                x = [p["bytes"] for p in pts]
                med = [p["time_us"]["median"] for p in pts]
                lo = [p["time_us"]["median"] - p["time_us"]["p25"] for p in pts]
                hi = [p["time_us"]["p75"] - p["time_us"]["median"] for p in pts]
                name = "NCCL" if path == "passthrough" else f"fp8wire {path}{suffix}"
                ax.errorbar(x, med, yerr=[lo, hi], color=color, marker=marker, ls=curve_ls, ms=4, capsize=2,
                            label=f"{name} [{label_fabric}]")
                if path != "passthrough":
                    sx.plot(x, [p["speedup"] for p in pts], color=color, marker=marker, ls=curve_ls, ms=4)
            for x in run.get("crossovers", []):
                if x["collective"] == coll and x["dtype"] == dtype and x["candidate"] == "best" and x["found"]:
                    for a in (ax, sx):
                        a.axvline(x["bytes"], color="tab:purple", ls=ls, lw=1)
                    ax.annotate(f"crossover {human(x['bytes'])}\n{x['speedup']:.2f}x [{m['fabric']}]",
                                (x["bytes"], ax.get_ylim()[1] if ax.has_data() else 1), xytext=(4, -28 - 24 * fi),
                                textcoords="offset points", color="tab:purple", fontsize=8)
        n = runs[0]["machine"]["nranks"]
        ax.set_title(f"{coll} {dtype}, {n} ranks")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_ylabel("time per op (us, median; bars: p25-p75)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
        sx.axhline(1.0, color="gray", lw=1)
        sx.set_xscale("log", base=2)
        sx.set_ylabel("speedup vs NCCL")
        sx.set_xlabel("size (bytes, full buffer as nccl-tests counts it)")
        sx.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(args.output, dpi=120)
    print(f"plot_sweep.py: wrote {args.output}")


if __name__ == "__main__":
    main()
