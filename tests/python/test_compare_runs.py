#!/usr/bin/env python3
"""CPU tests of scripts/compare_runs.py on synthetic run folders: the wire row compares wire bytes
with wire bytes. A baseline without libfp8wire.so has no call records, so its column shows what
NCCL's own algorithms send for the fp8wire run's calls (plain_wire_bytes), marked as computed; a
baseline with records shows its own; a report from before plain_wire_bytes leaves the cell empty."""
import json
import os
import subprocess
import sys
import tempfile
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "scripts", "compare_runs.py")
MIB = 2**20
WIRE_ROW = "MiB on the wire / step (all ranks)"


def write_run(folder, app=0, wire=0, plain=None, steps=8):
    """A folder as `fp8wire-prof --out` and fp8wire-train leave it: report.json merged over ranks
    (bytes per step summed over ranks, `plain` left out when None) and the trainer's log."""
    os.makedirs(os.path.join(folder, "train"))
    rows = []
    for s in range(steps):
        row = {"step": s, "ranks": 4, "step_ms": {"max": 100.0, "mean": 95.0},
               "exposed_comm_ms": {"max": 20.0, "mean": 18.0}, "comm_ms": {"max": 40.0, "mean": 38.0},
               "compute_ms": {"max": 70.0, "mean": 68.0}, "overlap_pct": {"max": 60.0, "mean": 55.0},
               "app_bytes": app, "wire_bytes": wire, "calls": 12 if app else 0}
        if plain is not None:
            row["plain_wire_bytes"] = plain
        rows.append(row)
    with open(os.path.join(folder, "report.json"), "w") as f:
        json.dump({"ranks": 4, "steps": rows, "mean": rows[0], "top": []}, f)
    with open(os.path.join(folder, "train", "train_log.jsonl"), "w") as f:
        for s in range(steps):
            f.write(json.dumps({"step": s, "loss": 2.0 / (s + 1), "step_ms": 110.0, "samples_per_s": 36.0}) + "\n")


def compare(baseline, candidate):
    """The script's output (it must succeed) and its wire row's cells: NCCL, fp8wire, ratio."""
    r = subprocess.run([sys.executable, SCRIPT, baseline, candidate, "--skip", "2"], capture_output=True, text=True)
    if r.returncode != 0:
        raise AssertionError(f"compare_runs exited {r.returncode}:\n{r.stdout}{r.stderr}")
    row = next(line for line in r.stdout.splitlines() if line.startswith(WIRE_ROW))
    return r.stdout, row[len(WIRE_ROW):].split()


class WireRow(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.base = os.path.join(self.tmp.name, "baseline")
        self.fp8 = os.path.join(self.tmp.name, "fp8wire")

    def tearDown(self):
        self.tmp.cleanup()

    def test_baseline_without_records_shows_nccl_algorithms_bytes_computed(self):
        # 4 ranks: 1507 MiB asked for, of which NCCL's ring all-reduce sends 2(N-1)/N = 1.5x.
        write_run(self.base)
        write_run(self.fp8, app=1507 * MIB, wire=1166 * MIB, plain=2260 * MIB)
        out, cells = compare(self.base, self.fp8)
        self.assertEqual(cells, ["2260.0*", "1166.0", f"{1166 / 2260:.3f}"])
        self.assertIn("* computed, not measured", out)
        asked = next(line for line in out.splitlines() if line.startswith("MiB asked for"))
        self.assertEqual(asked.split()[-3:], ["-", "1507.0", "-"])  # the baseline asked nothing of the shim

    def test_baseline_with_records_shows_its_own(self):
        write_run(self.base, app=1507 * MIB, wire=2261 * MIB, plain=2261 * MIB)
        write_run(self.fp8, app=1507 * MIB, wire=1166 * MIB, plain=2260 * MIB)
        out, cells = compare(self.base, self.fp8)
        self.assertEqual(cells, ["2261.0", "1166.0", f"{1166 / 2261:.3f}"])
        self.assertNotIn("computed", out)

    def test_report_before_the_field_leaves_the_cell_empty(self):
        write_run(self.base)
        write_run(self.fp8, app=1507 * MIB, wire=1166 * MIB)
        out, cells = compare(self.base, self.fp8)
        self.assertEqual(cells, ["-", "1166.0", "-"])
        self.assertNotIn("computed", out)


if __name__ == "__main__":
    unittest.main()
