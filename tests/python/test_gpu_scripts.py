#!/usr/bin/env python3
"""CPU tests of the GPU scripts' helpers: the soak monitor finds the ranks the trainer's launcher
starts (each by exec'ing /proc/self/exe, so most kernels name it "exe", a name the monitor must not
rely on since others keep the program's), fails a run sampled with
fewer ranks than it has, and judges memory on the samples taken while training; soak.sh's variants
run on the CPU; scripts/fidelity.py judges and reports the curves and rejects bad input;
scripts/gpu/prof_direct_check.py judges the profiler against the step-time estimate;
scripts/direct_timeline.py reads Kineto traces of several ranks and says how busy each direction of
the host link was and whether the ranks' copies ran at once; scripts/linklimit_table.py pairs each
variant with the default of its own round; the GPU scripts' shared step helper (scripts/gpu/lib.sh)
counts, logs and judges each check alike, a time-out and a program not built included."""
import json
import os
import subprocess
import sys
import tempfile
import time
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "scripts", "gpu"))
import soak_monitor  # noqa: E402

sys.path.insert(0, os.path.join(ROOT, "scripts"))
import kernel_breakdown  # noqa: E402
import direct_timeline  # noqa: E402
import linklimit_table  # noqa: E402

# A process tree like `fp8wire-train --ranks 2`: a launcher that forks two ranks, each re-exec'ing
# the same program; argv[0] stays "fp8wire-train" throughout, /proc/<pid>/comm becomes "exe" on most
# kernels and stays the program's name on some (seen: "python"), so the monitor goes by parentage.
TREE = r"""
import os, sys, time
if len(sys.argv) > 1 and sys.argv[1] == "rank":
    time.sleep(30)
    sys.exit(0)
kids = []
for _ in range(2):
    pid = os.fork()
    if pid == 0:
        os.execv("/proc/self/exe", ["fp8wire-train", "-c", open(sys.argv[0]).read(), "rank"])
    kids.append(pid)
print(" ".join(map(str, kids)), flush=True)
for k in kids:
    os.waitpid(k, 0)
"""


class RankDiscovery(unittest.TestCase):
    def test_ranks_are_the_launchers_children_though_named_exe(self):
        with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
            f.write(TREE)
            script = f.name
        # The launcher itself also runs as "fp8wire-train" (argv[0]) from an exec of /proc/self/exe.
        launcher = subprocess.Popen(["fp8wire-train", script], executable=sys.executable, stdout=subprocess.PIPE,
                                    text=True)
        try:
            kids = sorted(int(p) for p in launcher.stdout.readline().split())
            deadline = time.time() + 10
            found = []
            while time.time() < deadline:
                found = soak_monitor.ranks_under(launcher.pid)
                if found == kids:
                    break
                time.sleep(0.1)
            self.assertEqual(found, kids)
        finally:
            for k in soak_monitor.ranks_under(launcher.pid):
                os.kill(k, 9)
            launcher.wait(timeout=20)
            os.unlink(script)

    def test_report_fails_a_run_sampled_with_fewer_ranks(self):
        with tempfile.TemporaryDirectory() as d:
            log = os.path.join(d, "train_log.jsonl")
            with open(log, "w") as f:
                for s in range(40):
                    f.write(json.dumps({"step": s, "loss": 1.0 / (s + 1), "step_ms": 10.0}) + "\n")
            samples = os.path.join(d, "samples.jsonl")
            with open(samples, "w") as f:
                for step in (10, 20, 30, 40):
                    f.write(json.dumps({"run": "plain", "step": step, "ranks": [100], "rss_mib": [300.0],
                                        "gpu_mib": [None], "torch_peak_gib": None}) + "\n")
            cmd = [sys.executable, os.path.join(ROOT, "scripts", "gpu", "soak_monitor.py"), "report",
                   "--samples", samples, "--steps", "40", "--warmup", "10", "--cpu",
                   "--run", f"plain:{log}:{d}/prof"]
            one = subprocess.run(cmd + ["--ranks", "1"], capture_output=True, text=True)
            self.assertEqual(one.returncode, 0, one.stdout + one.stderr)
            two = subprocess.run(cmd + ["--ranks", "2"], capture_output=True, text=True)
            self.assertEqual(two.returncode, 1)
            self.assertRegex(two.stdout, r"ranks sampled\s+FAIL\s+1 of 2")


class MemoryJudgement(unittest.TestCase):
    """The soak's memory verdict: the sample taken at the last step (the teardown) is left out, and a
    steady late leak fails though its total stays inside the growth tolerance."""

    def judge(self, host_by_step):
        with tempfile.TemporaryDirectory() as d:
            log = os.path.join(d, "train_log.jsonl")
            with open(log, "w") as f:
                for s in range(2000):
                    f.write(json.dumps({"step": s, "loss": 1.0, "step_ms": 10.0}) + "\n")
            samples = os.path.join(d, "samples.jsonl")
            with open(samples, "w") as f:
                for step, rss in host_by_step:
                    # At the last step a rank may already be gone (the teardown): one rank sampled.
                    ranks, host = ([1, 2], [1000.0, rss]) if step < 2000 else ([1], [rss])
                    f.write(json.dumps({"run": "r", "step": step, "ranks": ranks, "rss_mib": host,
                                        "gpu_mib": [None] * len(ranks), "torch_peak_gib": None}) + "\n")
            return subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "gpu", "soak_monitor.py"), "report",
                                   "--samples", samples, "--steps", "2000", "--warmup", "300", "--cpu", "--ranks", "2",
                                   "--run", f"r:{log}:{d}/prof"], capture_output=True, text=True)

    def test_teardown_sample_is_left_out(self):
        flat = [(s, 1000.0) for s in range(100, 2000, 100)] + [(2000, 1500.0)]  # +500 MiB at teardown only
        r = self.judge(flat)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertRegex(r.stdout, r"host memory flat\s+PASS\s+1000->1000 \(\+0\.0 MiB")
        self.assertRegex(r.stdout, r"ranks sampled\s+PASS\s+2 of 2 in every sample taken while training \(19 samples\)")

    def test_a_late_steady_leak_fails_inside_the_growth_tolerance(self):
        # Flat to step 1000, then 3.5 MiB per 100 steps: +31.5 MiB in all (under the 64 MiB tolerance).
        leak = [(s, 1000.0 + max(0, s - 1000) * 0.035) for s in range(100, 2000, 100)]
        r = self.judge(leak)
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        self.assertRegex(r.stdout, r"host memory flat\s+FAIL\s+1000->1000 .*; 1000->1032 \(\+31\.5 MiB.*later half \+35\.0/1k\)")

    def test_where_host_memory_went_is_reported(self):
        # Rank 1's anonymous memory grows by 30 MiB and it gains 4 threads; the profiler's summary
        # says how many CUPTI buffers its pool grew to.
        with tempfile.TemporaryDirectory() as d:
            log = os.path.join(d, "train_log.jsonl")
            with open(log, "w") as f:
                for s in range(2000):
                    f.write(json.dumps({"step": s, "loss": 1.0, "step_ms": 10.0,
                                        "reserved_mem_gib": 1.0 + (s >= 1000) / 1024.0}) + "\n")
            samples = os.path.join(d, "samples.jsonl")
            with open(samples, "w") as f:
                for step in range(100, 2000, 100):
                    grow = max(0, step - 1000) / 30.0
                    f.write(json.dumps({"run": "r", "step": step, "ranks": [1, 2], "rss_mib": [1000.0, 1000.0 + grow],
                                        "rss_anon_mib": [800.0, 800.0 + grow], "rss_file_mib": [150.0, 150.0],
                                        "rss_shmem_mib": [50.0, 50.0], "threads": [40, 40 + (step >= 1500) * 4],
                                        "fds": [90, 90], "gpu_mib": [None, None], "torch_peak_gib": None,
                                        "torch_reserved_gib": 1.0 + (step > 1000) / 1024.0}) + "\n")
            os.makedirs(os.path.join(d, "prof"))
            with open(os.path.join(d, "prof", "rank1.jsonl"), "w") as f:
                f.write(json.dumps({"type": "summary", "rank": 1, "cupti_buffers": {
                    "allocated": 64, "limit": 128, "max_held": 60, "requesting_threads": 3,
                    "device_preallocated": 12, "device_bytes_each": 1048576}}) + "\n")
            r = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "gpu", "soak_monitor.py"), "report",
                                "--samples", samples, "--steps", "2000", "--warmup", "300", "--cpu", "--ranks", "2",
                                "--run", f"r:{log}:{d}/prof"], capture_output=True, text=True)
            self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
            self.assertRegex(r.stdout, r"where host memory went \(per rank\)\s+INFO  anon \+0\.0 MiB, file \+0\.0 MiB, "
                                       r"shmem \+0\.0 MiB, threads \+0, fds \+0; anon \+30\.0 MiB, file \+0\.0 MiB, "
                                       r"shmem \+0\.0 MiB, threads \+4, fds \+0; torch reserved \(rank 0\) \+1\.0 MiB")
            self.assertRegex(r.stdout, r"profiler CUPTI buffers\s+INFO  rank 1: 64 allocated of 128, at most 60 held, "
                                       r"asked for on 3 threads; 12 device buffers of 1048576 bytes made up front")

    def test_a_process_status_is_read(self):
        st = soak_monitor.process_status(os.getpid())
        self.assertGreater(st["rss_mib"], 1.0)
        self.assertGreaterEqual(st["rss_mib"], st["rss_anon_mib"])
        self.assertGreaterEqual(st["threads"], 1)
        self.assertGreaterEqual(st["fds"], 3)
        gone = soak_monitor.process_status(2 ** 22 + 12345)  # above any pid_max: no such process
        self.assertEqual(set(gone.values()), {None})

    def test_page_noise_passes(self):
        noisy = [(s, 1000.0 + (2.0 if s in (700, 1500) else 0.0) + (2.0 if s >= 1600 else 0.0)) for s in range(100, 2000, 100)]
        r = self.judge(noisy)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)


def build_dir():
    """This build's folder (the tests run with FP8WIRE_SHIM_LIB=<build>/shim/libfp8wire.so)."""
    shim = os.environ.get("FP8WIRE_SHIM_LIB", os.path.join(ROOT, "build", "shim", "libfp8wire.so"))
    return os.path.dirname(os.path.dirname(os.path.abspath(shim)))


class SoakDryRun(unittest.TestCase):
    """scripts/gpu/soak.sh's mechanics on the CPU (SOAK_DEVICE=cpu: the tiny preset, one rank, the
    shim passing through): every run of SOAK_RUNS starts, completes and is judged, parity is
    computed. How many samples a 20-step CPU run gets, and its memory verdicts, depend on the
    machine's load, so they are not asserted."""

    def test_every_variant_runs_and_is_judged(self):
        build = build_dir()
        needed = [os.path.join(build, p) for p in ("trainer/fp8wire-train", "profiler/fp8wire-prof",
                                                   "profiler/libfp8wire_prof.so", "shim/libfp8wire.so")]
        missing = [p for p in needed if not os.path.exists(p)]
        if missing:
            self.skipTest(f"not built: {', '.join(missing)}")
        with tempfile.TemporaryDirectory() as out:
            env = dict(os.environ, SOAK_DEVICE="cpu", SOAK_STEPS="20", SOAK_EVERY="5", SOAK_WARMUP="5",
                       SOAK_LIMIT_S="150", SOAK_RUNS="plain fp8wire fp8wire_noprof fp8wire_allgather",
                       FP8WIRE_BUILD=build, OUT=out, PYTHON=sys.executable)
            r = subprocess.run(["bash", os.path.join(ROOT, "scripts", "gpu", "soak.sh")], env=env,
                               capture_output=True, text=True, timeout=200)
            log = r.stdout + r.stderr
            # A run the shim refused to configure (an FP8WIRE_ variable of the scripts' own taken
            # for a key) would say so and pass through.
            self.assertNotIn("configuration error", log)
            for name in ("plain", "fp8wire", "fp8wire_noprof", "fp8wire_allgather"):
                self.assertRegex(log, rf"{name}\s+steps\s+PASS\s+20/20", log)
                self.assertRegex(log, rf"{name}\s+ranks sampled\s+(PASS|FAIL)\s+\d of 1", log)
                self.assertRegex(log, rf"{name}\s+host memory flat\s+(PASS|FAIL)", log)
            self.assertRegex(log, r"parity\s+loss curve plain vs fp8wire\s+PASS", log)
            self.assertIn("| fp8wire_noprof | 20 |", log)
            self.assertRegex(log, r"\| fp8wire_noprof \|.*\| no profiler \|")
            bad = subprocess.run(["bash", os.path.join(ROOT, "scripts", "gpu", "soak.sh")],
                                 env=dict(env, SOAK_RUNS="plain fp8wire_typo"), capture_output=True, text=True,
                                 timeout=60)
            self.assertEqual(bad.returncode, 2, bad.stdout + bad.stderr)
            self.assertIn("SOAK_RUNS: unknown run 'fp8wire_typo'", bad.stdout)


def write_log(path, losses, grads):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        for s, (l, g) in enumerate(zip(losses, grads)):
            f.write(json.dumps({"step": s, "loss": l, "grad_norm": g}) + "\n")


class Fidelity(unittest.TestCase):
    SCRIPT = os.path.join(ROOT, "scripts", "fidelity.py")

    def run_script(self, *args):
        return subprocess.run([sys.executable, self.SCRIPT, *args], capture_output=True, text=True)

    def test_table_and_thresholds(self):
        with tempfile.TemporaryDirectory() as d:
            base = [2.0 / (1 + 0.05 * s) for s in range(200)]
            grads = [1.0 + 0.5 / (1 + s) for s in range(200)]
            write_log(f"{d}/plain/train_log.jsonl", base, grads)
            write_log(f"{d}/close/train_log.jsonl", [x * 1.001 for x in base], grads)
            write_log(f"{d}/far/train_log.jsonl", [x * (1.02 if s % 2 else 0.98) for s, x in enumerate(base)], grads)
            good = self.run_script(f"{d}/plain/train_log.jsonl", f"close={d}/close/train_log.jsonl")
            self.assertEqual(good.returncode, 0, good.stdout + good.stderr)
            self.assertIn("| close | 200 | 1.00000 | 0.100 % | +0.100 % | 1.00000 | 0.000 % | PASS |", good.stdout)
            bad = self.run_script(f"{d}/plain/train_log.jsonl", f"close={d}/close/train_log.jsonl",
                                  f"far={d}/far/train_log.jsonl")
            self.assertEqual(bad.returncode, 1)
            self.assertRegex(bad.stdout, r"\| far \| 200 \|.*\| FAIL \|")

    def test_bad_input_is_named(self):
        with tempfile.TemporaryDirectory() as d:
            write_log(f"{d}/plain/train_log.jsonl", [1.0, 0.5], [1.0, 1.0])
            r = self.run_script(f"{d}/plain/train_log.jsonl", f"{d}/plain/train_log.jsonl")
            self.assertEqual(r.returncode, 2)
            self.assertIn("expected LABEL=path", r.stderr)
            with open(f"{d}/nograd.jsonl", "w") as f:
                f.write('{"step": 0, "loss": 1.0}\n')
            r = self.run_script(f"{d}/plain/train_log.jsonl", f"x={d}/nograd.jsonl")
            self.assertEqual(r.returncode, 2)
            self.assertIn("nograd.jsonl:1", r.stderr)
            self.assertIn("grad_norm", r.stderr)


def write_prof_run(out, label, train_step, exposed, wait, idle, marks=0, log=""):
    """One run folder as scripts/gpu/prof_direct.sh leaves it: 12 steps of rank 0's profiler
    records and the trainer's log."""
    os.makedirs(os.path.join(out, label, "train"), exist_ok=True)
    with open(os.path.join(out, label, "train", "train_log.jsonl"), "w") as f:
        for s in range(12):
            f.write(json.dumps({"step": s, "step_ms": train_step + (s % 3) - 1}) + "\n")
    with open(os.path.join(out, label, "rank0.jsonl"), "w") as f:
        for s in range(12):
            f.write(json.dumps({"type": "step", "rank": 0, "step": s, "step_ms": train_step, "compute_ms": 20.0,
                                "exposed_comm_ms": exposed, "exposed_data_ms": exposed - wait,
                                "exposed_wait_ms": wait, "exposed_memcpy_ms": 1.0, "idle_ms": idle,
                                "top": [{"transport": "host_memory"}] if marks else []}) + "\n")
        f.write(json.dumps({"type": "summary", "rank": 0, "counters": {"call_marks": marks}}) + "\n")
    with open(os.path.join(out, label + ".log"), "w") as f:
        f.write(log)


class ProfDirectCheck(unittest.TestCase):
    SCRIPT = os.path.join(ROOT, "scripts", "gpu", "prof_direct_check.py")
    LOG = "fp8wire: rank 0: 120 collectives, 120 on FP8 paths (one_shot 120); over host_memory 120\n"

    def check(self, direct_exposed, direct_idle, marks=900):
        with tempfile.TemporaryDirectory() as out:
            write_prof_run(out, "direct", 156.0, direct_exposed, direct_exposed - 15.0, direct_idle, marks, self.LOG)
            write_prof_run(out, "free", 60.0, 0.0, 0.0, 30.0)
            return subprocess.run([sys.executable, self.SCRIPT, out, "--skip", "2"], capture_output=True, text=True)

    def test_within_ten_percent_passes(self):
        r = self.check(100.0, 32.0)  # estimate 156 - 60 = 96 ms: 4 % off
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("96.0 ms: 4.2 % off", r.stdout)
        self.assertIn("exposed 15.0, idle 117.0", r.stdout)  # the earlier rule's figures, same run
        self.assertIn("prof_direct: PASS", r.stdout)

    def test_exposed_far_from_the_estimate_fails(self):
        r = self.check(60.0, 32.0)
        self.assertEqual(r.returncode, 1, r.stdout)
        self.assertIn("(<= 10 %): FAIL", r.stdout)

    def test_idle_that_grew_fails(self):
        r = self.check(100.0, 60.0)  # 30 ms more idle than without communication, 15.6 allowed
        self.assertEqual(r.returncode, 1, r.stdout)
        self.assertIn("idle: direct 60.0 ms vs free 30.0 ms (+30.0", r.stdout)

    def test_no_marks_fails(self):
        r = self.check(100.0, 32.0, marks=0)
        self.assertEqual(r.returncode, 1, r.stdout)
        self.assertIn("call-begin marks came (0): FAIL", r.stdout)


class KernelFamilies(unittest.TestCase):
    def test_the_trainers_fused_kernels_are_not_the_codec(self):
        fused = "void fp8wire::trainer::fused::(anonymous namespace)::norm_backward_kernel<1>(__nv_bfloat16 const*)"
        self.assertEqual(kernel_breakdown.family(fused), "trainer fused")
        self.assertEqual(kernel_breakdown.family("void fp8wire::quant::quantize_blocks<float>(...)"), "fp8wire codec")
        self.assertEqual(kernel_breakdown.family("nvjet_sm90_tst_128x256_64x4_2x1_v_bz_coopA_NTN"), "matmul")


def kineto_trace(ops):
    """A Kineto chrome trace with `ops` = (start_us, dur_us, stream, what, bytes); what: D2H, H2D or a kernel name."""
    events = [{"ph": "X", "cat": "cuda_runtime", "name": "cudaMemcpyAsync", "ts": 0, "dur": 1, "args": {}}]
    for ts, dur, stream, what, nbytes in ops:
        if what in ("D2H", "H2D"):
            name = "Memcpy DtoH (Device -> Pinned)" if what == "D2H" else "Memcpy HtoD (Pinned -> Device)"
            events.append({"ph": "X", "cat": "gpu_memcpy", "name": name, "ts": ts, "dur": dur,
                           "args": {"stream": stream, "bytes": nbytes}})
        else:
            events.append({"ph": "X", "cat": "kernel", "name": what, "ts": ts, "dur": dur, "args": {"stream": stream}})
    return {"traceEvents": events}


class DirectTimeline(unittest.TestCase):
    QUANTIZE = ("void fp8wire::quant::detail::quantize_kernel<(fp8wire::quant::ElemType)2, (fp8wire::Fp8Format)0>"
                "(fp8wire::quant::detail::QuantizeParams)")

    def write(self, folder, name, ops):
        path = os.path.join(folder, name)
        with open(path, "w") as f:
            json.dump(kineto_trace(ops), f)
        return path

    def test_copies_one_at_a_time_and_a_stray_op_before_the_calls(self):
        with tempfile.TemporaryDirectory() as d:
            # Rank 0: a stray op 1 s before the calls (left out), then D2H 1000..1100, H2D 1200..1300.
            # Rank 1: D2H 1100..1200 (after rank 0's: one at a time), H2D 1250..1350 (50 us beside rank 0's).
            r0 = self.write(d, "r0.json", [(0, 5, 7, "D2H", 1000), (1_000_000, 4, 16, self.QUANTIZE, 0),
                                           (1_000_010, 100, 16, "D2H", 5_000_000),
                                           (1_000_200, 100, 17, "H2D", 5_000_000)])
            r1 = self.write(d, "r1.json", [(1_000_110, 100, 16, "D2H", 5_000_000),
                                           (1_000_250, 100, 17, "H2D", 5_000_000)])
            ops = direct_timeline.after_last_pause(direct_timeline.load(r0), 50_000)
            self.assertEqual(len(ops), 3)
            self.assertEqual(ops[0][3], "quantize_kernel")
            out = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "direct_timeline.py"), "--calls", "1",
                                  r0, r1], capture_output=True, text=True, check=True).stdout
        self.assertIn("2 ranks, 1 calls in 350 us", out)
        # D2H: 200 us busy of 350, 10 MB in 200 us = 50 GB/s, no overlap; H2D: 150 us busy, 50 of them twice.
        self.assertIn("D2H: busy 57.1 % of the span, 50.0 GB/s while busy; two or more ranks' copies at once 0.0 %", out)
        self.assertIn("H2D: busy 42.9 % of the span, 66.7 GB/s while busy; two or more ranks' copies at once 33.3 %", out)
        self.assertRegex(out, r"\n +0\.0 +4\.0 +4\.0 +0 +16 quantize_kernel")  # times from the first kept op

    def test_idle_gaps_between_copies_and_the_busiest_period_listed(self):
        with tempfile.TemporaryDirectory() as d:
            # Two calls of 500 us. D2H: 0..100 (rank 0), 120..220 (rank 1), 240..340 (rank 0): gaps of 20
            # after another rank's copy; 360..380 (rank 0): a gap of 20 after the same rank's.
            # Then a pause of 520 us (longer than a call: left out of the idle sums), 900..1000 (rank 1).
            # H2D: 100..200 (rank 1), 230..330 (rank 0): one gap of 30. Call period 0 holds 6 ops, period 1
            # one: the busiest is listed, not the middle one (1).
            r0 = self.write(d, "r0.json", [(0, 100, 16, "D2H", 1), (240, 100, 16, "D2H", 1), (230, 100, 17, "H2D", 1),
                                           (360, 20, 16, "D2H", 1)])
            r1 = self.write(d, "r1.json", [(120, 100, 16, "D2H", 1), (100, 100, 17, "H2D", 1), (900, 100, 16, "D2H", 1)])
            out = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "direct_timeline.py"), "--calls", "2",
                                  r0, r1], capture_output=True, text=True, check=True).stdout
        self.assertIn("2 ranks, 2 calls in 1000 us: 500 us per call", out)
        self.assertIn("D2H idle between copies: 1.5 gaps per call, median 20.0 us, 30 us per call; "
                      "after the same rank's copy: 1, median 20.0 us; after another rank's: 2, median 20.0 us", out)
        self.assertIn("H2D idle between copies: 0.5 gaps per call, median 30.0 us, 15 us per call; "
                      "after another rank's: 1, median 30.0 us", out)
        self.assertIn("call period 0 (0..500 us)", out)
        self.assertNotRegex(out, r"\n +900\.0 ")  # period 1's lone copy is not listed

    def test_a_trace_without_gpu_work_is_refused(self):
        with tempfile.TemporaryDirectory() as d:
            empty = self.write(d, "r0.json", [])
            r = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "direct_timeline.py"), empty],
                               capture_output=True, text=True)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("holds no kernels or copies", r.stderr)


def write_sweep(folder, rnd, variant, ranks, points):
    """A sweep.json of fp8wire-bench under folder/r<rnd>/<variant>_n<ranks>: points are
    (collective, bytes, path, transport, median us, link limit us)."""
    d = os.path.join(folder, f"r{rnd}", f"{variant}_n{ranks}")
    os.makedirs(d)
    pts = []
    for coll, nbytes, path, transport, us, limit in points:
        p = {"collective": coll, "bytes": nbytes, "path": path, "transport": transport, "time_us": {"median": us}}
        if limit:
            p.update(link_limit_us=limit, link_limit_pct=100 * limit / us)
        pts.append(p)
    with open(os.path.join(d, "sweep.json"), "w") as f:
        json.dump({"points": pts, "pinned_copy": {"d2h_gbps": 54.7, "h2d_gbps": 54.8,
                                                  "link_limit_basis": {"reduce_scatter": "(n-1)/n w each way"}}}, f)


class LinkLimitTable(unittest.TestCase):
    MiB16 = 16 << 20

    def sweep(self, folder, rnd, variant, rs_us, ar_us):
        write_sweep(folder, rnd, variant, 4, [
            ("reduce_scatter", self.MiB16, "passthrough", "", 9000.0, 0),
            ("reduce_scatter", self.MiB16, "two_shot", "host_memory", rs_us, 474.0),
            ("all_reduce", self.MiB16, "two_shot", "host_memory", ar_us, 948.0),
            ("all_reduce", self.MiB16, "one_shot", "host_memory", ar_us * 1.5, 948.0)])

    def test_each_variant_against_the_default_of_its_own_round(self):
        with tempfile.TemporaryDirectory() as d:
            # The reduce-scatter: faster than its round's default in both rounds though round 2's default
            # is faster than round 1's outbox (drift between rounds); the all-reduce: once each way.
            self.sweep(d, 1, "default", 1100.0, 2000.0)
            self.sweep(d, 1, "outbox", 1000.0, 1900.0)
            self.sweep(d, 2, "default", 900.0, 2000.0)
            self.sweep(d, 2, "outbox", 800.0, 2100.0)
            rows = linklimit_table.rows_of(d)
            ratios = linklimit_table.vs_default(rows)
            self.assertAlmostEqual(ratios[(1, 4, "reduce_scatter", self.MiB16, "outbox")], 1.1)
            self.assertAlmostEqual(ratios[(2, 4, "reduce_scatter", self.MiB16, "outbox")], 900 / 800)
            summary = {key[1]: (gmean, way) for key, _, gmean, way in linklimit_table.paired(rows)}
            self.assertEqual(summary["reduce_scatter"][1], "+")
            self.assertAlmostEqual(summary["reduce_scatter"][0], (1.1 * 900 / 800) ** 0.5)
            self.assertEqual(summary["all_reduce"][1], "mixed")
            out = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "linklimit_table.py"), d],
                                 capture_output=True, text=True, check=True).stdout
        # The faster direct path's time and % of the limit (two-shot: 474 us of limit in 1100 us).
        self.assertRegex(out, r"4 reduce_scatter +16MiB default +1 +9\.000 +1\.100 +- +0\.474  43\.1%")
        self.assertRegex(out, r"4 reduce_scatter +16MiB outbox +2 .* +1\.12x")
        self.assertIn("paired over 2 rounds", out)
        self.assertRegex(out, r"reduce_scatter +16MiB outbox +1\.10 1\.12 +1\.11x \+")
        self.assertRegex(out, r"all_reduce +16MiB outbox +1\.05 0\.95 +1\.00x mixed")
        self.assertIn("limit basis, 4 ranks, reduce_scatter", out)

    def test_no_sweeps_is_an_error(self):
        with tempfile.TemporaryDirectory() as d:
            r = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "linklimit_table.py"), d],
                               capture_output=True, text=True)
        self.assertEqual(r.returncode, 1)
        self.assertIn("no sweep.json under", r.stderr)


class GpuStepHelper(unittest.TestCase):
    """gpu_step / gpu_step_show / gpu_fail / gpu_summary of scripts/gpu/lib.sh, in bash on the CPU."""

    def script(self, body):
        """Runs body after sourcing lib.sh with OUT in a fresh folder; returns (result, OUT)."""
        out = tempfile.mkdtemp(prefix="fp8wire-gpu-step-")
        self.addCleanup(subprocess.run, ["rm", "-rf", out])
        env = {**os.environ, "OUT": out, "FP8WIRE_TESTBED_MODE": "time-sliced"}
        r = subprocess.run(["bash", "-c", f'source "{ROOT}/scripts/gpu/lib.sh"\ngpu_out demo\n{body}'],
                           env=env, capture_output=True, text=True, timeout=60)
        return r, out

    def test_every_check_is_a_row_and_any_failure_fails_the_script(self):
        r, out = self.script("""
gpu_step ok 10 sh -c 'echo PASS one; echo PASS n=3; echo INFO aside'
gpu_step bad 10 sh -c 'echo FAIL two; exit 3'
echo "bad returned $?"
gpu_step cases 10 sh -c 'printf "%s\\n" "[doctest] test cases:  16 |  15 passed | 1 failed | 0 skipped" \
  "[doctest] test cases:   2 |   2 passed | 0 failed | 0 skipped"; exit 1'
gpu_step slow 1 sleep 20
gpu_fail "thing not built (cmake --build build --target thing)"
gpu_summary demo
""")
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        lines = r.stdout.splitlines()
        self.assertEqual(lines[-1], "DEMO: FAIL")
        self.assertIn("testbed time-sliced", r.stdout)
        # The verdict lines of each log, never doctest's per-case "PASS n=" nor other lines.
        self.assertIn("PASS one", lines)
        self.assertIn("FAIL two", lines)
        self.assertNotIn("PASS n=3", lines)
        self.assertNotIn("INFO aside", lines)
        self.assertIn("bad returned 3", lines)
        self.assertRegex(r.stdout, r"\nPASS ok +rc=0 +\d+s  1 pass, 0 fail, 0 skipped\n")
        self.assertRegex(r.stdout, r"\nFAIL bad +rc=3 +\d+s  0 pass, 1 fail, 0 skipped\n")
        self.assertRegex(r.stdout, r"\nFAIL cases +rc=1 +\d+s  0 pass, 0 fail, 0 skipped; doctest: 17 of 18 cases passed, 1 failed\n")
        self.assertRegex(r.stdout, r"\nFAIL slow +rc=124 .*, timed out after 1 s\n")
        self.assertIn("FAIL thing not built (cmake --build build --target thing)", lines)
        self.assertIn("---- bad failed (rc=3), the end of", r.stdout)
        with open(os.path.join(out, "ok.log")) as f:
            self.assertEqual(f.read(), "PASS one\nPASS n=3\nINFO aside\n")

    def test_all_passing_exits_0_and_the_shown_lines_follow_the_pattern(self):
        r, _ = self.script("""
gpu_step_show '^INFO'
gpu_step first 10 sh -c 'echo PASS one; echo INFO shown'
gpu_step_show
gpu_step second 10 sh -c 'echo PASS two; echo INFO hidden'
gpu_summary demo
""")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        lines = r.stdout.splitlines()
        self.assertEqual(lines[-1], "DEMO: PASS")
        self.assertIn("INFO shown", lines)
        self.assertNotIn("INFO hidden", lines)
        self.assertNotIn("PASS one", lines)
        self.assertEqual(sum(line.startswith("PASS ") for line in lines), 2)  # the two rows


if __name__ == "__main__":
    unittest.main()
