#!/usr/bin/env python3
"""The host-link table of scripts/gpu/linklimit.sh, from the sweeps it wrote.

  linklimit_table.py OUT [--baseline LABEL]

OUT holds one folder per round (r1, r2, ...), each with a folder per sweep, <variant>_n<ranks>, holding
fp8wire-bench's sweep.json. Per ranks x collective x size x variant x round: ms of plain NCCL and of
each FP8 path (median of the slowest rank; the direct ones where the sweep has them), the host-link
limit, % of it reached by the faster direct path, the faster FP8 path's speedup over plain NCCL of the
same sweep, and "vs default": the baseline's time in the same round over this variant's (above 1: the
variant is faster). The baseline is the variant labelled `default`, or LABEL. Sweep-to-sweep spread of identical work is about +-10-14 % on the emulated testbed, so with
several rounds (the variants run in the same order in each) the last table pairs each variant with the
default of its own round and says whether every round moved the same way: a ratio a single pair shows
is no finding."""
import json
import math
import pathlib
import sys


def size_label(b):
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if b >= 1 << shift and b % (1 << shift) == 0:
            return f"{b >> shift}{unit}"
    return str(b)


def sweeps(out):
    """(round, variant, ranks, sweep.json path) for every sweep under OUT, rounds in order."""
    found = []
    for f in pathlib.Path(out).glob("r*/*_n*/sweep.json"):
        rnd = f.parent.parent.name[1:]
        variant, n = f.parent.name.rsplit("_n", 1)
        if rnd.isdigit() and n.isdigit():
            found.append((int(rnd), variant, int(n), f))
    return sorted(found, key=lambda s: (s[0], s[2], s[1]))


def rows_of(out):
    """One row per (round, ranks, collective, size, variant): the sweep's points by path."""
    rows = []
    for rnd, variant, n, f in sweeps(out):
        j = json.loads(f.read_text())
        pinned = j.get("pinned_copy", {})
        by = {}
        for p in j.get("points", []):
            if not p.get("supported", True) or p["time_us"]["median"] <= 0:
                continue
            name = "nccl" if p["path"] == "passthrough" else p["path"] + ("/direct" if p.get("transport") else "")
            by.setdefault((p["collective"], p["bytes"]), {})[name] = p
        for (coll, size), paths in by.items():
            # The direct paths where the sweep has them, else NCCL's FP8 paths.
            fp8 = [p for k, p in paths.items() if k.endswith("/direct")] or [p for k, p in paths.items() if k != "nccl"]
            best = min(fp8, key=lambda p: p["time_us"]["median"]) if fp8 else None
            rows.append({"round": rnd, "ranks": n, "collective": coll, "size": size, "variant": variant,
                         "paths": paths, "best": best, "pinned": pinned})
    order = {BASELINE: 0}
    rows.sort(key=lambda r: (r["ranks"], r["collective"], r["size"], order.get(r["variant"], 1), r["variant"],
                             r["round"]))
    return rows


def best_ms(row):
    return row["best"]["time_us"]["median"] / 1e3 if row["best"] else None


def vs_default(rows):
    """{(round, ranks, collective, size, variant): the same round's default time / this one's}."""
    base = {(r["round"], r["ranks"], r["collective"], r["size"]): best_ms(r) for r in rows if r["variant"] == BASELINE}
    ratios = {}
    for r in rows:
        b = base.get((r["round"], r["ranks"], r["collective"], r["size"]))
        t = best_ms(r)
        if r["variant"] != BASELINE and b and t:
            ratios[(r["round"], r["ranks"], r["collective"], r["size"], r["variant"])] = b / t
    return ratios


def paired(rows):
    """Per (ranks, collective, size, variant) other than the default: its rounds' ratios to their own
    default, their geometric mean, and whether every round moved the same way (+, - or mixed)."""
    groups = {}
    for (rnd, n, coll, size, variant), ratio in sorted(vs_default(rows).items()):
        groups.setdefault((n, coll, size, variant), []).append(ratio)
    out = []
    for key, ratios in groups.items():
        gmean = math.exp(sum(math.log(x) for x in ratios) / len(ratios))
        way = "+" if all(x > 1 for x in ratios) else "-" if all(x < 1 for x in ratios) else "mixed"
        out.append((key, ratios, gmean, way))
    return out


def render(rows):
    ratios = vs_default(rows)
    lines = ["# link limit table (ms = median of the slowest rank; link% = limit / time of the faster direct path;"
             f" x nccl = plain NCCL's time / the faster FP8 path's; vs {BASELINE} = the same round's {BASELINE} time /"
             " this one's)",
             f"# {'ranks':>5} {'collective':<15} {'size':>7} {'variant':<28} {'round':>5} {'nccl':>9} {'two_shot':>9} "
             f"{'one_shot':>9} {'limit':>9} {'link%':>6} {'x nccl':>7} {'vs ' + BASELINE:>10}  pinned D2H/H2D GB/s (both at once)"]

    def ms(p):
        return f"{p['time_us']['median'] / 1e3:9.3f}" if p else f"{'-':>9}"

    def path(d, name):
        return d.get(name + "/direct") or d.get(name)
    for r in rows:
        best, pc, d = r["best"], r["pinned"], r["paths"]
        limit = best["link_limit_us"] / 1e3 if best and best.get("link_limit_us") else 0
        pct = f"{best['link_limit_pct']:5.1f}%" if best and best.get("link_limit_pct") else f"{'-':>6}"
        ratio = ratios.get((r["round"], r["ranks"], r["collective"], r["size"], r["variant"]))
        vs = f"{ratio:9.2f}x" if ratio else f"{'':>10}"
        plain = d.get("nccl")
        speedup = (f"{plain['time_us']['median'] / best['time_us']['median']:6.2f}x" if plain and best
                   else f"{'-':>7}")
        lines.append(f"  {r['ranks']:>5} {r['collective']:<15} {size_label(r['size']):>7} {r['variant']:<28} "
                     f"{r['round']:>5} {ms(plain)} {ms(path(d, 'two_shot'))} {ms(path(d, 'one_shot'))} "
                     f"{limit:9.3f} {pct} {speedup} {vs}  {pc.get('d2h_gbps', 0):.1f}/{pc.get('h2d_gbps', 0):.1f} "
                     f"({pc.get('duplex_d2h_gbps', 0):.1f}/{pc.get('duplex_h2d_gbps', 0):.1f})")
    rounds = {r["round"] for r in rows}
    summary = paired(rows)
    if len(rounds) > 1 and summary:
        lines.append(f"\n# paired over {len(rounds)} rounds: each round's ratio to its own {BASELINE} (above 1: the "
                     "variant is faster), their geometric mean, and + / - when every round moved the same way")
        for (n, coll, size, variant), each, gmean, way in summary:
            lines.append(f"  {n:>5} {coll:<15} {size_label(size):>7} {variant:<28} "
                         f"{' '.join(f'{x:.2f}' for x in each):<24} {gmean:6.2f}x {way}")
    return "\n".join(lines)


def bases(out):
    """The limit's basis per ranks and collective, from the first round's default sweeps."""
    found = {}
    for rnd, variant, n, f in sweeps(out):
        if variant != BASELINE or rnd != min(s[0] for s in sweeps(out)):
            continue
        for k, v in json.loads(f.read_text()).get("pinned_copy", {}).get("link_limit_basis", {}).items():
            found[f"{n} ranks, {k}"] = v
    return found


BASELINE = "default"


def main(argv):
    global BASELINE
    args = argv[1:]
    if len(args) == 3 and args[1] == "--baseline":
        BASELINE = args[2]
        args = args[:1]
    if len(args) != 1:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    out = args[0]
    if not sweeps(out):
        print(f"linklimit_table.py: no sweep.json under {out}/r<round>/<variant>_n<ranks>/", file=sys.stderr)
        return 1
    print()
    print(render(rows_of(out)))
    for k, v in bases(out).items():
        print(f"# limit basis, {k}: {v}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
