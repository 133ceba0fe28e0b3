#!/usr/bin/env python3
"""Compares the exposure profiler's per-step reports with synthetic_overlap's designed figures, and
prints the validation table, the overhead figure and the coalescing lesson. Exit status 1 on FAIL.

  check_profiler.py --on DIR [DIR...] --off DIR [DIR...]
Each --on DIR holds the profiler's rank*.jsonl and synthetic_overlap's designed.rank*.jsonl from a
profiled run; each --off DIR holds designed.rank*.jsonl from the same program without the profiler.
"""
import argparse
import glob
import json
import os
import statistics
import sys

TOL_REL, TOL_ABS_MS = 0.05, 0.1   # within 5 % or 0.1 ms, whichever is larger
OVERHEAD_LIMIT_PCT = 2.0


def read_jsonl(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def load_designed(d):
    out = {}
    for path in glob.glob(os.path.join(d, "designed.rank*.jsonl")):
        rank = int(path.rsplit("rank", 1)[1].split(".")[0])
        for r in read_jsonl(path):
            out[(rank, r["step"])] = r
    return out


def load_reports(d):
    out = {}
    for path in glob.glob(os.path.join(d, "*.jsonl")):
        if os.path.basename(path).startswith("designed"):
            continue
        for r in read_jsonl(path):
            if r.get("type") == "step":
                out[(r["rank"], r["step"])] = r
    return out


def load_summaries(d):
    """The 'summary' line each rank writes at exit (counters of dropped and late records)."""
    out = []
    for path in sorted(glob.glob(os.path.join(d, "rank*.jsonl"))):
        out += [r for r in read_jsonl(path) if r.get("type") == "summary"]
    return out


def tol(designed):
    return max(TOL_REL * abs(designed), TOL_ABS_MS)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--on", nargs="+", required=True)
    ap.add_argument("--off", nargs="+", default=[])
    ap.add_argument("--validate-only", action="store_true",
                    help="only the designed-vs-reported table (no overhead, lesson or trace checks)")
    ap.add_argument("--expect-shim", action="store_true",
                    help="the run had libfp8wire.so: collectives must carry sequence numbers, bytes and paths")
    ap.add_argument("--title", default="profiler validation summary")
    args = ap.parse_args()
    failures = []
    summary = []

    # ---- validation: reported vs designed, per step and rank -------------------------------------
    rows = {}  # scenario -> list of (designed, reported, error, ok)
    partition_bad = 0
    missing = 0
    for d in args.on:
        designed, reports = load_designed(d), load_reports(d)
        if not designed:
            failures.append(f"no designed.rank*.jsonl in {d}")
        for key, des in sorted(designed.items()):
            rep = reports.get(key)
            if rep is None:
                missing += 1
                continue
            parts = rep["compute_ms"] + rep["exposed_comm_ms"] + rep["exposed_memcpy_ms"] + rep["idle_ms"]
            if abs(parts - rep["step_ms"]) > 1e-6 * max(1.0, rep["step_ms"]):
                partition_bad += 1
            if des["scenario"] == "launches":
                continue  # no communication; only the overhead figure uses it
            err = rep["exposed_comm_ms"] - des["designed_exposed_ms"]
            ok = abs(err) <= tol(des["designed_exposed_ms"])
            rows.setdefault(des["scenario"], []).append((des["designed_exposed_ms"], rep["exposed_comm_ms"], err, ok,
                                                         des["designed_comm_ms"], rep["comm_ms"],
                                                         des["designed_compute_ms"], rep["compute_ms"]))
    print("\nvalidation: exposed communication, designed (CUDA events) vs reported (profiler), per step and rank")
    print(f"{'scenario':10} {'n':>3} {'designed':>9} {'reported':>9} {'max|err|':>9} {'comm d/r':>15} {'compute d/r':>15}  result")
    for scenario, rs in rows.items():
        n_ok = sum(r[3] for r in rs)
        worst = max(rs, key=lambda r: abs(r[2]))
        line = (f"{scenario:10} {len(rs):3d} {statistics.mean(r[0] for r in rs):9.3f} {statistics.mean(r[1] for r in rs):9.3f} "
                f"{abs(worst[2]):9.3f} {statistics.mean(r[4] for r in rs):7.2f}/{statistics.mean(r[5] for r in rs):7.2f} "
                f"{statistics.mean(r[6] for r in rs):7.2f}/{statistics.mean(r[7] for r in rs):7.2f}  "
                f"{'PASS' if n_ok == len(rs) else 'FAIL'} ({n_ok}/{len(rs)} within max(5%, 0.1 ms))")
        print(line)
        summary.append(f"{'PASS' if n_ok == len(rs) else 'FAIL'}: exposed ms, {scenario}: designed "
                       f"{statistics.mean(r[0] for r in rs):.3f}, reported {statistics.mean(r[1] for r in rs):.3f}, "
                       f"max error {abs(worst[2]):.3f} ms")
        if n_ok != len(rs):
            failures.append(f"{scenario}: {len(rs) - n_ok} step(s) outside tolerance")
    if missing:
        failures.append(f"{missing} designed step(s) have no profiler report")
    summary.append(f"{'FAIL' if missing else 'PASS'}: every designed step reported ({missing} missing)")
    summary.append(f"{'FAIL' if partition_bad else 'PASS'}: compute + exposed comm + exposed memcpy + idle = step "
                   f"({partition_bad} bad)")
    if partition_bad:
        failures.append("partition does not add up")

    # Every GPU record must reach its step: none dropped by CUPTI (no free buffer), none arriving
    # after its step was reported.
    sums = [x for d in args.on for x in load_summaries(d)]
    late = sum(x.get("counters", {}).get("late_activities", 0) for x in sums)
    dropped = sum(x.get("dropped_cupti_records", 0) + x.get("counters", {}).get("dropped_activities", 0) for x in sums)
    joined = sum(x.get("counters", {}).get("joined_activities", 0) for x in sums)
    ok = bool(sums) and late == 0 and dropped == 0
    what = (f"record delivery: {len(sums)} rank summaries, {late} late, {dropped} dropped records "
            f"({joined} kernels joined to their launch's NVTX range / shim call)")
    summary.append(f"{'PASS' if ok else 'FAIL'}: {what}")
    if not ok:
        failures.append(what)

    if args.expect_shim:
        steps = [r for d in args.on for r in load_reports(d).values()]
        tops = [c for r in steps for c in r["top"]]
        with_seq = sum(1 for c in tops if c.get("seq", 0) > 0 and c.get("path") and c.get("app_bytes", 0) > 0)
        with_bytes = sum(1 for r in steps if r.get("app_bytes", 0) > 0)
        paths = sorted({c.get("path") for c in tops if c.get("path")})
        ok = bool(tops) and with_seq == len(tops) and with_bytes > 0
        what = (f"shim attribution: {with_seq}/{len(tops)} listed collectives carry seq/bytes/path (paths {paths}), "
                f"{with_bytes}/{len(steps)} steps with app bytes")
        summary.append(f"{'PASS' if ok else 'FAIL'}: {what}")
        if not ok:
            failures.append(what)
    # ---- the wait for peers: the delayed scenario's designed wait against the profiler's split ------
    # Per rank that waited: median exposed wait in "delayed" steps minus that in "serial" steps (the
    # same call without the delay), against the designed delay; within 10 % or 0.3 ms.
    waits = {}
    for d in args.on:
        designed, reports = load_designed(d), load_reports(d)
        for key, des in designed.items():
            rep = reports.get(key)
            if rep is None or des["scenario"] not in ("delayed", "serial"):
                continue
            waits.setdefault(key[0], {}).setdefault(des["scenario"], []).append(
                (des.get("designed_delay_ms", 0.0), rep.get("exposed_wait_ms", 0.0), rep["exposed_comm_ms"]))
    waiting = {r: w for r, w in waits.items() if "delayed" in w and "serial" in w and w["delayed"][0][0] > 0}
    if any("delayed" in w for w in waits.values()):
        print("\nwait for peers: designed delay vs the profiler's exposed wait (delayed minus serial, medians)")
        print(f"{'rank':>4} {'delay':>7} {'wait serial':>11} {'wait delayed':>12} {'difference':>10}  result")
        for rank, w in sorted(waiting.items()):
            delay = w["delayed"][0][0]
            ws = statistics.median(x[1] for x in w["serial"])
            wd = statistics.median(x[1] for x in w["delayed"])
            ok = abs((wd - ws) - delay) <= max(0.10 * delay, 0.3)
            print(f"{rank:4d} {delay:7.2f} {ws:11.3f} {wd:12.3f} {wd - ws:10.3f}  {'PASS' if ok else 'FAIL'}")
            summary.append(f"{'PASS' if ok else 'FAIL'}: wait for peers, rank {rank}: designed {delay:.2f} ms, "
                           f"reported {wd - ws:.3f} ms more than without the delay (within max(10%, 0.3 ms))")
            if not ok:
                failures.append(f"rank {rank}: exposed wait {wd - ws:.3f} ms for a designed delay of {delay:.2f} ms")
        if not waiting:
            failures.append("delayed steps but no waiting rank with serial steps to compare")
    if args.validate_only:
        print(f"\n==== {args.title} ====")
        for line in summary:
            print(line)
        print("RESULT:", "FAIL" if failures else "PASS", "; ".join(failures))
        return 1 if failures else 0

    # ---- overhead: host step time with the profiler on vs off -------------------------------------
    def step_times(dirs):
        by = {}
        for d in dirs:
            for des in load_designed(d).values():
                by.setdefault(des["scenario"], []).append(des["host_step_ms"])
        return by
    on, off = step_times(args.on), step_times(args.off)
    print("\noverhead: median host step time, profiler on vs off (same program, both ranks)")
    print(f"{'scenario':10} {'off ms':>9} {'on ms':>9} {'overhead':>9}")
    total_on = total_off = 0.0
    for scenario in off:
        if scenario not in on:
            continue
        m_off, m_on = statistics.median(off[scenario]), statistics.median(on[scenario])
        total_on += m_on
        total_off += m_off
        print(f"{scenario:10} {m_off:9.3f} {m_on:9.3f} {100 * (m_on - m_off) / m_off:8.2f}%")
    overhead = 100 * (total_on - total_off) / total_off if total_off else float("nan")
    ok = overhead <= OVERHEAD_LIMIT_PCT
    print(f"{'all':10} {total_off:9.3f} {total_on:9.3f} {overhead:8.2f}%  {'PASS' if ok else 'FAIL'} (limit {OVERHEAD_LIMIT_PCT}%)")
    summary.append(f"{'PASS' if ok else 'FAIL'}: overhead {overhead:.2f}% (sum of per-scenario median step times, "
                   f"limit {OVERHEAD_LIMIT_PCT}%)")
    if not ok:
        failures.append(f"overhead {overhead:.2f}% > {OVERHEAD_LIMIT_PCT}%")

    # ---- the lesson: per-layer all-reduces hidden in "backward" vs one merged after it ------------
    reports = {}
    designed = {}
    for d in args.on:
        reports.update(load_reports(d))
        designed.update(load_designed(d))
    lesson = {}
    for key, des in designed.items():
        if des["scenario"] in ("bucketed", "merged") and key in reports:
            lesson.setdefault(des["scenario"], []).append(reports[key])
    if "bucketed" in lesson and "merged" in lesson:
        print("\nlesson: same bytes, all-reduce per layer during backward vs merged after it")
        print(f"{'variant':10} {'step ms':>9} {'exposed':>9} {'comm':>9} {'overlap%':>9} {'collectives':>11}")
        means = {}
        for variant in ("bucketed", "merged"):
            rs = lesson[variant]
            means[variant] = (statistics.mean(r["step_ms"] for r in rs), statistics.mean(r["exposed_comm_ms"] for r in rs))
            print(f"{variant:10} {means[variant][0]:9.3f} {means[variant][1]:9.3f} "
                  f"{statistics.mean(r['comm_ms'] for r in rs):9.3f} {statistics.mean(r['overlap_pct'] for r in rs):9.1f} "
                  f"{statistics.mean(r['calls'] for r in rs):11.1f}")
        for variant in ("bucketed", "merged"):
            r = sorted(lesson[variant], key=lambda r: (r["rank"], r["step"]))[len(lesson[variant]) // 2]
            print(f"  per-collective, {variant} (rank {r['rank']} step {r['step']}), most exposed first:")
            for c in r["top"][:5]:
                print(f"    #{c['ordinal']:<3} {c['range'] or '-':18} {c['name']:10} dur {c['duration_ms']:8.3f} ms  "
                      f"exposed {c['exposed_ms']:8.3f} ms")
        bytes_of = {v: sorted({designed[(r["rank"], r["step"])].get("allreduce_bytes", 0) for r in lesson[v]})
                    for v in ("bucketed", "merged")}
        print(f"  all-reduced bytes per step: bucketed {bytes_of['bucketed']}, merged {bytes_of['merged']}")
        slower = means["merged"][0] > means["bucketed"][0]
        more_exposed = means["merged"][1] > means["bucketed"][1]
        top_merged = [r["top"][0] for r in lesson["merged"] if r["top"]]
        on_path = bool(top_merged) and all(c["range"] == "merged_allreduce" and c["exposed_ms"] >= 0.9 * c["duration_ms"]
                                           for c in top_merged)
        for ok, what in ((more_exposed, f"merged exposes more ({means['merged'][1]:.2f} vs {means['bucketed'][1]:.2f} ms)"),
                         (slower, f"merged step is slower ({means['merged'][0]:.2f} vs {means['bucketed'][0]:.2f} ms)"),
                         (on_path, "the per-collective table names merged_allreduce as the exposed call (>= 90% of it exposed)")):
            summary.append(f"{'PASS' if ok else 'FAIL'}: lesson: {what}")
            if not ok:
                failures.append(f"lesson: {what}")
    else:
        failures.append("lesson scenarios missing")
        summary.append("FAIL: lesson scenarios (bucketed, merged) missing")

    # ---- the per-rank Chrome/Perfetto traces load and show exposed communication ------------------
    for d in args.on[:1]:
        traces = sorted(glob.glob(os.path.join(d, "*.trace.json")))
        try:
            counts = []
            for path in traces:
                with open(path) as f:
                    events = json.load(f)
                counts.append(sum(1 for e in events if e.get("tid") == 3 and e.get("ph") == "X"))
            ok = len(traces) >= 2 and all(c > 0 for c in counts)
            what = f"{len(traces)} trace file(s) parse, exposed-communication events per rank {counts}"
        except (OSError, ValueError) as e:
            ok, what = False, f"trace files do not parse: {e}"
        summary.append(f"{'PASS' if ok else 'FAIL'}: {what}")
        if not ok:
            failures.append(what)

    print(f"\n==== {args.title} ====")
    for line in summary:
        print(line)
    print("RESULT:", "FAIL" if failures else "PASS", "; ".join(failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
