#!/usr/bin/env python3
"""The GPU timeline of FP8 calls over a direct transport, every rank at once, from PyTorch profiler
(Kineto) traces with CUDA activity, one file per rank (scripts/gpu/direct_trace.sh writes them).

For each direction of the host link (D2H: device to pinned host memory, H2D: back) it prints how busy
the copies kept it over the profiled calls, and for how much of that time copies of two ranks ran at
once: near 0 means the ranks' copies were served one at a time. Then the idle gaps between one copy
of a direction and the next (any rank's): how many per call, how long (each is a hand-over: a flag
seen, a wait passed, a kernel done, before the next copy starts). Then every kernel and copy of every
rank in one window of about one call, in time order, with rank, stream and duration: by default the
period with the most operations (a profiler's own pause can leave a period nearly empty).

    scripts/direct_timeline.py [--calls N] [--window K] TRACE.rank0.json TRACE.rank1.json ...
"""
import argparse
import json
import re
import sys


def load(path):
    """(start_us, end_us, stream, kind, bytes) of every kernel and copy in a Kineto trace."""
    with open(path) as f:
        events = json.load(f)["traceEvents"]
    ops = []
    for e in events:
        if e.get("ph") != "X" or e.get("cat") not in ("kernel", "gpu_memcpy", "gpu_memset"):
            continue
        name = e["name"]
        if e["cat"] == "gpu_memcpy":
            kind = "D2H" if "DtoH" in name else "H2D" if "HtoD" in name else "D2D" if "DtoD" in name else "copy"
        elif e["cat"] == "gpu_memset":
            kind = "memset"
        else:
            # "void fp8wire::quant::detail::reduce_kernel<...>(fp8wire::quant::detail::ReduceParams)" -> reduce_kernel
            kind = re.split(r"[<(]", name.removeprefix("void "), maxsplit=1)[0].split("::")[-1][:24]
        args = e.get("args", {})
        ops.append((float(e["ts"]), float(e["ts"]) + float(e["dur"]), args.get("stream", -1), kind, args.get("bytes", 0)))
    ops.sort()
    return ops


def after_last_pause(ops, pause_us):
    """The ops after the last idle gap longer than `pause_us`: what ran before the profiled calls
    (a warm-up op the profiler caught) is left out."""
    keep, end = 0, None
    for i, (s, e, *_rest) in enumerate(ops):
        if end is not None and s - end > pause_us:
            keep = i
        end = e if end is None else max(end, e)
    return ops[keep:]


def union_us(intervals):
    total, end = 0.0, None
    for a, b in sorted(intervals):
        if end is None or a > end:
            total += b - a
            end = b
        elif b > end:
            total += b - end
            end = b
    return total


def median(values):
    v = sorted(values)
    return (v[(len(v) - 1) // 2] + v[len(v) // 2]) / 2


def idle_gaps(copies):
    """The idle gaps of one direction, in time order, from its copies (start, end, rank): each gap's
    length and whether the copy after it is of the same rank as the copy before it."""
    gaps, end, last_rank = [], None, None
    for a, b, rank in sorted(copies):
        if end is not None and a > end:
            gaps.append((a - end, rank == last_rank))
        if end is None or b >= end:
            end, last_rank = b, rank
    return gaps


def print_idle(ranks, span, calls):
    """The idle gaps between one copy of a direction and the next: how many per call, their median, and
    their time per call, gaps of a call period or more left out (a profiler's pause, the end of a
    call that waits for the host). Split by whether the next copy is the same rank's (on one lane,
    a kernel between two copies holds the second back) or another rank's (a hand-over between ranks)."""
    period = span / max(calls, 1)
    for direction in ("D2H", "H2D"):
        copies = [(s, e, rank) for rank, r in enumerate(ranks) for s, e, _, k, _ in r if k == direction]
        short = [(g, same) for g, same in idle_gaps(copies) if g < period]
        if not short:
            continue
        line = (f"{direction} idle between copies: {len(short) / max(calls, 1):.1f} gaps per call, median "
                f"{median([g for g, _ in short]):.1f} us, {sum(g for g, _ in short) / max(calls, 1):.0f} us per call")
        for label, want in (("after the same rank's copy", True), ("after another rank's", False)):
            part = [g for g, same in short if same == want]
            if part:
                line += f"; {label}: {len(part)}, median {median(part):.1f} us"
        print(line)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("traces", nargs="+", help="one Kineto trace per rank, in rank order")
    ap.add_argument("--calls", type=int, default=10, help="FP8 calls the traces hold (default 10)")
    ap.add_argument("--window", type=int, default=-1, help="which call period to list (default: the middle one)")
    ap.add_argument("--pause-us", type=float, default=50000,
                    help="an idle gap this long ends what came before the profiled calls (default 50 ms)")
    a = ap.parse_args()
    ranks = [after_last_pause(load(p), a.pause_us) for p in a.traces]
    if not all(ranks):
        sys.exit("direct_timeline: a trace holds no kernels or copies (was CUDA activity profiled?)")
    t0 = min(r[0][0] for r in ranks)
    t1 = max(op[1] for r in ranks for op in r)
    period = (t1 - t0) / max(a.calls, 1)
    print(f"{len(ranks)} ranks, {a.calls} calls in {t1 - t0:.0f} us: {period:.0f} us per call")
    for direction in ("D2H", "H2D"):
        per_rank = [[(s, e) for s, e, _, k, _ in r if k == direction] for r in ranks]
        everyone = [iv for r in per_rank for iv in r]
        if not everyone:
            continue
        busy = union_us(everyone)
        summed = sum(e - s for s, e in everyone)
        moved = sum(b for r in ranks for _, _, _, k, b in r if k == direction)
        print(f"{direction}: busy {100 * busy / (t1 - t0):.1f} % of the span, {moved / busy / 1e3:.1f} GB/s while busy; "
              f"two or more ranks' copies at once {100 * (summed - busy) / busy:.1f} % of the busy time")
    print_idle(ranks, t1 - t0, a.calls)
    def ops_in(k):
        return sum(1 for r in ranks for op in r if t0 + k * period <= op[0] < t0 + (k + 1) * period)
    # The busiest period, the middle one among equals.
    window = a.window if a.window >= 0 else max(range(a.calls), key=lambda k: (ops_in(k), -abs(k - a.calls // 2)))
    lo, hi = t0 + window * period, t0 + (window + 1) * period
    print(f"\ncall period {window} ({lo - t0:.0f}..{hi - t0:.0f} us), every rank, in time order:")
    print(f"{'start_us':>9} {'end_us':>9} {'dur_us':>7} rank stream {'what':<24} {'MB':>6}")
    rows = [(s, e, rank, stream, kind, b) for rank, r in enumerate(ranks) for s, e, stream, kind, b in r if lo <= s < hi]
    for s, e, rank, stream, kind, b in sorted(rows):
        print(f"{s - t0:9.1f} {e - t0:9.1f} {e - s:7.1f} {rank:>4} {stream:>6} {kind:<24} {b / 1e6:6.2f}")


if __name__ == "__main__":
    main()
