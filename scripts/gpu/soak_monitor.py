#!/usr/bin/env python3
"""Samples and judges the soak runs of scripts/gpu/soak.sh (plain python3, no numpy).

    soak_monitor.py watch --run NAME:PID:TRAIN_LOG [--run ...] --every 100 --out samples.jsonl
    soak_monitor.py report --samples samples.jsonl --run NAME:TRAIN_LOG:PROFILER_DIR|- [--run ...]
                           --steps 2000 --warmup 300 [--parity A B] [--markdown FILE]

watch: until every PID has exited, follows each run's train log (rank 0's JSON lines) and, each time
the completed steps pass a multiple of --every, records every rank's resident host memory
(/proc/<pid>/status VmRSS, and its anonymous, file and shared parts), threads and open file
descriptors, and GPU memory (nvidia-smi's per-process used memory; where the machine does not report
processes, the trainer's own allocator peak from the log; rank 0's allocator reserve from the log). Ranks are the
fp8wire-train processes under PID with no fp8wire-train child (the launcher forks them), known by
their argv[0]: the launcher starts each rank by exec'ing /proc/self/exe, which most kernels name
"exe" in /proc/<pid>/comm and some name after the program. --ranks N: the ranks each run must have; report fails a run whose samples
found fewer (a monitor that measured the launcher instead of the ranks says so).

report: per run, the steps reached, the median step time, and whether host and GPU memory stayed
flat after --warmup steps, judged on the samples taken while the run was still training (the one
taken as the last step completes sees the process's teardown: final checkpoint, reports, freed
communicators, and is left out). Per rank, the growth from the first sample at or after --warmup to
the last must stay within max(64 MiB, 2 %) for host memory and max(32 MiB, 1 %) for GPU memory, and
the least-squares slope over the later half of those samples within 8 MiB per 1,000 steps for
either (or, in a short run, that slope over the later half's steps within 4 MiB): a steady leak of
~10 KiB per step passes the first test over 2,000 steps but not the second, while allocator and
2 MiB-page noise (a few MiB once) stays inside it. Then every profiler counter of dropped or late
records (the summary lines of the per-rank reports) must be 0, and the two runs named by --parity
must have the same loss curve (scripts/loss_parity.py: Pearson >= 0.95, mean relative error <= 5 %,
and the mean of the last 100 losses within 3 %). Prints a table (and writes it as Markdown); exit 0
only if every check passed.
"""
import argparse
import collections
import json
import os
import statistics
import subprocess
import sys
import time

HOST_TOLERANCE = (64.0, 0.02)  # MiB, fraction
GPU_TOLERANCE = (32.0, 0.01)
LATE_SLOPE_LIMIT = 8.0  # MiB per 1,000 steps, over the later half of the samples after warm-up ...
LATE_RISE_FLOOR = 4.0   # ... unless that slope over the later half's steps comes to no more than this (MiB)
DROP_COUNTERS = ("dropped_activities", "dropped_calls", "late_activities")
SUMMARY_DROPS = ("dropped_nvtx_events", "dropped_call_events", "dropped_cupti_records", "dropped_trace_events",
                 "incomplete_cupti_records")


# ---- watch ----------------------------------------------------------------------------------------

def program_name(pid, comm):
    """The basename of argv[0] (what the process was started as), else the kernel's comm."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv0 = f.read().split(b"\0", 1)[0].decode(errors="replace")
    except OSError:
        argv0 = ""
    return os.path.basename(argv0) or comm


def children_of():
    """pid -> [child pids], and pid -> program name (program_name), from /proc."""
    kids, names = {}, {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        # "pid (comm) state ppid ...": comm may hold spaces and parentheses; it ends at the last ')'.
        name = stat[stat.index("(") + 1:stat.rindex(")")]
        ppid = int(stat[stat.rindex(")") + 2:].split()[1])
        pid = int(entry)
        names[pid] = program_name(pid, name)
        kids.setdefault(ppid, []).append(pid)
    return kids, names


def ranks_under(root):
    kids, names = children_of()
    found, stack = [], [root]
    while stack:
        pid = stack.pop()
        below = kids.get(pid, [])
        stack.extend(below)
        if names.get(pid, "").startswith("fp8wire-train") and not any(
                names.get(c, "").startswith("fp8wire-train") for c in below):
            found.append(pid)
    return sorted(found)


# From /proc/<pid>/status: the resident set and its parts (anonymous: heaps and private mappings;
# file: mapped files and device mappings; shmem: shared memory), and the thread count. With the open
# file descriptors they tell a growth's kind apart (a heap, pinned or shared buffers, threads, fds).
STATUS_FIELDS = {"VmRSS": "rss_mib", "RssAnon": "rss_anon_mib", "RssFile": "rss_file_mib",
                 "RssShmem": "rss_shmem_mib"}


def process_status(pid):
    """{rss_mib, rss_anon_mib, rss_file_mib, rss_shmem_mib, threads, fds}; a field is None if unreadable."""
    result = {key: None for key in STATUS_FIELDS.values()}
    result["threads"] = result["fds"] = None
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                name, _, value = line.partition(":")
                if name in STATUS_FIELDS:
                    result[STATUS_FIELDS[name]] = int(value.split()[0]) / 1024.0
                elif name == "Threads":
                    result["threads"] = int(value.split()[0])
    except (OSError, ValueError, IndexError):
        pass
    try:
        result["fds"] = len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        pass
    return result


def gpu_mib_by_pid():
    try:
        out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return {}
    result = {}
    for line in out.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 2 and parts[0].isdigit():
            try:
                result[int(parts[0])] = float(parts[1])
            except ValueError:
                pass
    return result


class LogFollower:
    """The last record of a growing JSON-lines file, read incrementally."""

    def __init__(self, path):
        self.path, self.offset, self.partial, self.last = path, 0, "", None

    def poll(self):
        try:
            with open(self.path) as f:
                f.seek(self.offset)
                text = f.read()
                self.offset = f.tell()
        except OSError:
            return self.last
        text = self.partial + text
        lines = text.split("\n")
        self.partial = lines.pop()
        for line in lines:
            try:
                self.last = json.loads(line)
            except ValueError:
                pass
        return self.last


def watch(args):
    runs = []
    for spec in args.run:
        name, pid, log = spec.split(":", 2)
        runs.append({"name": name, "pid": int(pid), "log": LogFollower(log), "next": args.every})
    start = time.time()
    with open(args.out, "a") as out:
        while any(os.path.exists(f"/proc/{r['pid']}") for r in runs):
            for r in runs:
                record = r["log"].poll()
                if not record:
                    continue
                done = int(record.get("step", -1)) + 1
                if done < r["next"]:
                    continue
                ranks = ranks_under(r["pid"])
                gpu = gpu_mib_by_pid()
                status = [process_status(p) for p in ranks]
                sample = {"run": r["name"], "step": done, "t": round(time.time() - start, 1), "ranks": ranks,
                          "expected_ranks": args.ranks, "gpu_mib": [gpu.get(p) for p in ranks],
                          "torch_peak_gib": record.get("peak_mem_gib"),
                          "torch_reserved_gib": record.get("reserved_mem_gib")}
                for key in list(STATUS_FIELDS.values()) + ["threads", "fds"]:
                    sample[key] = [st[key] for st in status]
                out.write(json.dumps(sample) + "\n")
                out.flush()
                while r["next"] <= done:
                    r["next"] += args.every
            time.sleep(args.poll)
    return 0


# ---- report ---------------------------------------------------------------------------------------

def read_jsonl(path):
    records = []
    try:
        with open(path) as f:
            for line in f:
                try:
                    records.append(json.loads(line))
                except ValueError:
                    pass
    except OSError:
        pass
    return records


def slope_per_1000(points):
    """Least-squares slope of (step, value) points, per 1000 steps."""
    if len(points) < 2:
        return 0.0
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    var = sum((x - mx) ** 2 for x in xs)
    return 0.0 if var == 0 else 1000.0 * sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / var


# One rank's memory over the soak: MiB at warm-up end and at the last sample, their difference, the
# slope over all samples and over the later half (MiB per 1,000 steps), and the verdict.
Flatness = collections.namedtuple("Flatness", "first last growth slope late_slope ok")


def flatness(samples, key, warmup, steps, tolerance):
    """Per rank index, a Flatness over the samples from --warmup up to, not including, the last step."""
    after = [s for s in samples if warmup <= s["step"] < steps]
    if len(after) < 2:
        return None
    ranks = max(len(s[key]) for s in after)
    result = []
    for i in range(ranks):
        points = [(s["step"], s[key][i]) for s in after if i < len(s[key]) and s[key][i] is not None]
        if len(points) < 2:
            return None
        first, last = points[0][1], points[-1][1]
        growth = last - first
        later = points[len(points) // 2:]
        late = slope_per_1000(later)
        late_rise = late * (later[-1][0] - later[0][0]) / 1000.0
        ok = growth <= max(tolerance[0], tolerance[1] * first) and (late <= LATE_SLOPE_LIMIT or
                                                                    late_rise <= LATE_RISE_FLOOR)
        result.append(Flatness(first, last, growth, slope_per_1000(points), late, ok))
    return result


def parts_changes(samples, warmup, steps):
    """Per rank, how the resident set's parts, the threads and the open fds changed over the judged
    samples (as flatness() picks them): where a growth lives. None where the samples lack them."""
    after = [s for s in samples if warmup <= s["step"] < steps]
    if len(after) < 2 or not all("threads" in s for s in after):
        return None
    first, last = after[0], after[-1]
    text = []
    for i in range(min(len(first["ranks"]), len(last["ranks"]))):
        def change(key, unit=" MiB", fmt="{:+.1f}"):
            a, b = first[key][i], last[key][i]
            return "?" if a is None or b is None else fmt.format(b - a) + unit
        text.append("anon {}, file {}, shmem {}, threads {}, fds {}".format(
            change("rss_anon_mib"), change("rss_file_mib"), change("rss_shmem_mib"),
            change("threads", "", "{:+d}"), change("fds", "", "{:+d}")))
    reserved = [s.get("torch_reserved_gib") for s in (first, last)]
    if None not in reserved:
        text.append("torch reserved (rank 0) {:+.1f} MiB".format((reserved[1] - reserved[0]) * 1024.0))
    return "; ".join(text)


def describe(rows):
    return "n/a" if rows is None else "; ".join(
        f"{r.first:.0f}->{r.last:.0f} ({r.growth:+.1f} MiB, {r.slope:+.1f}/1k steps, later half {r.late_slope:+.1f}/1k)"
        for r in rows)


def report(args):
    samples = read_jsonl(args.samples)
    rows, markdown, failures = [], [], 0
    markdown.append("| run | steps | ms/step (median) | host RSS MiB per rank, step {} -> last in training | growth "
                    "(later half, MiB/1k steps) | GPU MiB per rank | growth (later half) | profiler records "
                    "dropped/late | result |".format(args.warmup))
    markdown.append("|---|---|---|---|---|---|---|---|---|")
    logs = {}
    for spec in args.run:
        name, log, prof = spec.split(":", 2)
        logs[name] = log
        records = read_jsonl(log)
        steps = max((int(r["step"]) + 1 for r in records if "step" in r), default=0)
        times = [r["step_ms"] for r in records if r.get("step", 0) >= 10 and "step_ms" in r]
        median_ms = statistics.median(times) if times else float("nan")
        mine = [s for s in samples if s["run"] == name]
        host = flatness(mine, "rss_mib", args.warmup, args.steps, HOST_TOLERANCE)
        gpu_source = "nvidia-smi"
        gpu = flatness(mine, "gpu_mib", args.warmup, args.steps, GPU_TOLERANCE)
        if gpu is None:  # no per-process numbers from nvidia-smi here: the allocator's peak (rank 0)
            gpu_source = "allocator peak, rank 0"
            converted = [dict(s, peak=[(s["torch_peak_gib"] or 0) * 1024.0]) for s in mine
                         if s.get("torch_peak_gib") is not None]
            gpu = flatness(converted, "peak", args.warmup, args.steps, GPU_TOLERANCE)
        drops, reported_steps, buffers = 0, 0, []
        for path in sorted(os.listdir(prof)) if os.path.isdir(prof) else []:
            if not path.endswith(".jsonl"):
                continue
            for r in read_jsonl(os.path.join(prof, path)):
                if r.get("type") == "summary":
                    counters = r.get("counters", {})
                    drops += sum(int(counters.get(k, 0)) for k in DROP_COUNTERS)
                    drops += sum(int(r.get(k, 0)) for k in SUMMARY_DROPS)
                    b = r.get("cupti_buffers")
                    if isinstance(b, dict):
                        buffers.append("rank {}: {} allocated of {}, at most {} held, asked for on {} threads; "
                                       "{} device buffers of {} bytes made up front".format(
                                           r.get("rank", "?"), b.get("allocated"), b.get("limit"), b.get("max_held"),
                                           b.get("requesting_threads"), b.get("device_preallocated", "?"),
                                           b.get("device_bytes_each", "?")))
                elif r.get("type") == "step":
                    reported_steps += 1
        checks = []
        checks.append(("steps", steps >= args.steps, f"{steps}/{args.steps}"))
        # Judged over the samples the memory checks read: at the last step a rank may be gone already.
        training = [s for s in mine if s["step"] < args.steps]
        sampled = min((len(s["ranks"]) for s in training), default=0)
        checks.append(("ranks sampled", sampled >= args.ranks and bool(training),
                       f"{sampled} of {args.ranks} in every sample taken while training ({len(training)} samples)"))
        checks.append(("host memory flat", host is not None and all(h.ok for h in host), describe(host)))
        if not args.cpu:  # a dry run on a machine without a GPU has neither GPU memory nor CUPTI records
            checks.append((f"GPU memory flat ({gpu_source})", gpu is not None and all(g.ok for g in gpu),
                           describe(gpu)))
            if prof != "-":  # "-": a run without the profiler
                checks.append(("profiler records dropped or late", drops == 0 and reported_steps > 0,
                               f"{drops} (steps reported over all ranks: {reported_steps})"))
        ok = all(c[1] for c in checks)
        failures += 0 if ok else 1
        for label, good, detail in checks:
            rows.append(f"{name:<9} {label:<40} {'PASS' if good else 'FAIL'}  {detail}")
        if buffers:
            rows.append(f"{name:<9} {'profiler CUPTI buffers':<40} INFO  {'; '.join(buffers)}")
        parts = parts_changes(mine, args.warmup, args.steps)
        if parts:
            rows.append(f"{name:<9} {'where host memory went (per rank)':<40} INFO  {parts}")
        rows.append(f"{name:<9} {'median step ms (steps >= 10)':<40} INFO  {median_ms:.1f}")
        markdown.append("| {} | {} | {:.1f} | {} | {} | {} | {} | {} | {} |".format(
            name, steps, median_ms,
            " / ".join(f"{h.first:.0f} -> {h.last:.0f}" for h in host) if host else "n/a",
            " / ".join(f"{h.growth:+.1f} MiB ({h.late_slope:+.1f})" for h in host) if host else "n/a",
            " / ".join(f"{g.first:.0f} -> {g.last:.0f}" for g in gpu) if gpu else "n/a",
            " / ".join(f"{g.growth:+.1f} MiB ({g.late_slope:+.1f})" for g in gpu) if gpu else "n/a",
            drops if prof != "-" else "no profiler", "PASS" if ok else "FAIL"))
    if args.parity:
        a, b = args.parity
        parity = subprocess.run([sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..",
                                                              "loss_parity.py"), logs[a], logs[b],
                                 "--min-pearson", "0.95", "--max-rel-err", "0.05"], capture_output=True, text=True)
        la = [r["loss"] for r in read_jsonl(logs[a]) if "loss" in r][-100:]
        lb = [r["loss"] for r in read_jsonl(logs[b]) if "loss" in r][-100:]
        tail_ok, tail = False, "n/a"
        if la and lb:
            ma, mb = sum(la) / len(la), sum(lb) / len(lb)
            rel = abs(mb - ma) / max(abs(ma), 1e-12)
            tail_ok, tail = rel <= 0.03, f"last {len(la)} losses: {ma:.4f} vs {mb:.4f} ({100 * rel:.2f} %)"
        curve = (parity.stdout.strip().splitlines() or [parity.stderr.strip()])[-1]
        rows.append(f"{'parity':<9} {'loss curve ' + a + ' vs ' + b:<40} {'PASS' if parity.returncode == 0 else 'FAIL'}"
                    f"  {curve}")
        rows.append(f"{'parity':<9} {'loss at the end':<40} {'PASS' if tail_ok else 'FAIL'}  {tail}")
        markdown.append(f"\nLoss parity {a} vs {b}: {curve}; {tail}.")
        failures += (parity.returncode != 0) + (not tail_ok)
    print("==================== soak summary ====================")
    for r in rows:
        print(r)
    print(f"soak: {'PASS' if failures == 0 else 'FAIL'}")
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write("\n".join(markdown) + "\n")
    return 1 if failures else 0


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    w = sub.add_parser("watch")
    w.add_argument("--run", action="append", required=True, help="NAME:PID:TRAIN_LOG")
    w.add_argument("--every", type=int, default=100)
    w.add_argument("--poll", type=float, default=0.5)
    w.add_argument("--out", required=True)
    w.add_argument("--ranks", type=int, default=1, help="ranks each run has (recorded with every sample)")
    r = sub.add_parser("report")
    r.add_argument("--samples", required=True)
    r.add_argument("--run", action="append", required=True,
                   help="NAME:TRAIN_LOG:PROFILER_DIR (PROFILER_DIR '-': a run without the profiler)")
    r.add_argument("--steps", type=int, required=True)
    r.add_argument("--warmup", type=int, default=300)
    r.add_argument("--parity", nargs=2, metavar=("A", "B"))
    r.add_argument("--markdown")
    r.add_argument("--ranks", type=int, default=1, help="ranks each run must have been sampled with")
    r.add_argument("--cpu", action="store_true", help="dry run without a GPU: no GPU memory or profiler checks")
    args = p.parse_args()
    if args.command == "watch":
        if args.every < 1:
            p.error("--every must be at least 1")
        return watch(args)
    return report(args)


if __name__ == "__main__":
    sys.exit(main())
