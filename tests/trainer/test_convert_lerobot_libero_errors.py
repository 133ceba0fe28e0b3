#!/usr/bin/env python3
"""Bad input to scripts/convert_lerobot_libero.py: each case must end with exit status 2, one line on
stderr naming the input and what was expected (no traceback), and no --out folder (nor a staging
folder beside it) that the trainer could read.

    test_convert_lerobot_libero_errors.py WORK_DIR

Cases: Inf in an action and NaN in a state (episode and frame named), a re-run into a non-empty
--out (refused, the earlier shards untouched), an empty existing --out (accepted), a file that is
not parquet, an invalid meta/info.json, a tasks.jsonl line without "task", --max-episodes -1, and
an undecodable image found late (after shards were written). Exits 77 (skipped) without numpy,
pyarrow or pillow, like the converter's own test.
"""
import json
import os
import shutil
import subprocess
import sys

try:
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq
except ImportError as e:
    print(f"SKIPPED: {e}")
    sys.exit(77)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# The same synthetic dataset, checks and work folder as the converter's own test.
from test_convert_lerobot_libero import CONVERTER, Checks, make_dataset, work_dir  # noqa: E402

check = Checks()


def convert(dataset, out, *extra):
    return subprocess.run([sys.executable, CONVERTER, "--dataset", dataset, "--out", out, "--samples-per-shard", "32",
                           *extra], capture_output=True, text=True)


def leftovers(out):
    """--out itself and any staging folder beside it."""
    parent, name = os.path.dirname(out), os.path.basename(out)
    return sorted(n for n in os.listdir(parent) if n == name or n.startswith(name + ".partial-"))


def expect_refusal(what, dataset, out, expected, *extra):
    r = convert(dataset, out, *extra)
    lines = r.stderr.strip().splitlines()
    ok = (r.returncode == 2 and len(lines) == 1 and expected in lines[0] and "Traceback" not in r.stderr
          and not leftovers(out))
    if not ok:
        print(f"  rc={r.returncode} stderr={r.stderr!r} leftovers={leftovers(out)}")
    check(ok, f"{what}: exit 2, one line naming it ('{expected}'), nothing written")
    return r


def variant(base, work, name):
    path = os.path.join(work, name)
    shutil.copytree(base, path)
    return path


def edit_parquet(dataset, episode, edit):
    path = os.path.join(dataset, "data", "chunk-000", f"episode_{episode:06d}.parquet")
    table = pq.read_table(path)
    pq.write_table(edit(table), path)


def set_value(table, column, frame, index, value):
    rows = table.column(column).to_pylist()
    rows[frame] = list(rows[frame])
    rows[frame][index] = value
    i = table.column_names.index(column)
    return table.set_column(i, column, pa.array(rows, pa.list_(pa.float32())))


def main():
    work = work_dir(__doc__)
    if work is None:
        return 2
    base = os.path.join(work, "base")
    make_dataset(base, "lerobot")

    d = variant(base, work, "inf_action")
    edit_parquet(d, 1, lambda t: set_value(t, "action", 3, 2, float("inf")))
    expect_refusal("Inf in an action", d, os.path.join(work, "out_inf"),
                   "episode_000001.parquet (episode 1) frame 3: column 'action' value 2 is inf, expected a finite number")

    d = variant(base, work, "nan_state")
    edit_parquet(d, 2, lambda t: set_value(t, "observation.state", 10, 0, float("nan")))
    expect_refusal("NaN in a state", d, os.path.join(work, "out_nan"),
                   "(episode 2) frame 10: column 'observation.state' value 0 is nan, expected a finite number")

    # A first conversion, then a second one into the same folder: refused, the first run's shards kept.
    out = os.path.join(work, "out_twice")
    first = convert(base, out)
    check(first.returncode == 0, "the first conversion into a new folder succeeds")
    before = sorted(os.listdir(out)) if os.path.isdir(out) else []
    second = convert(base, out, "--max-episodes", "1")
    lines = second.stderr.strip().splitlines()
    check(second.returncode == 2 and len(lines) == 1 and "is not empty" in lines[0]
          and sorted(os.listdir(out)) == before and leftovers(out) == ["out_twice"],
          "a re-run into a non-empty --out is refused and leaves the earlier shards as they were")
    empty = os.path.join(work, "out_empty")
    os.makedirs(empty)
    r = convert(base, empty, "--max-episodes", "1")
    check(r.returncode == 0 and any(n.endswith(".safetensors") for n in os.listdir(empty)),
          "an existing empty --out is filled")

    d = variant(base, work, "bad_parquet")
    with open(os.path.join(d, "data", "chunk-000", "episode_000001.parquet"), "wb") as f:
        f.write(b"PAR1 this is not parquet")
    expect_refusal("a file that is not parquet", d, os.path.join(work, "out_parquet"),
                   "episode_000001.parquet: not a readable parquet file")

    d = variant(base, work, "bad_info")
    with open(os.path.join(d, "meta", "info.json"), "w") as f:
        f.write('{"codebase_version": "v2.1", "features": ')
    expect_refusal("invalid meta/info.json", d, os.path.join(work, "out_info"), "meta/info.json is not valid JSON")

    d = variant(base, work, "bad_features")
    with open(os.path.join(d, "meta", "info.json"), "w") as f:
        json.dump({"codebase_version": "v2.1", "features": ["image"]}, f)
    expect_refusal("info.json features of the wrong type", d, os.path.join(work, "out_features"),
                   "\"features\" is not an object")

    d = variant(base, work, "bad_tasks")
    with open(os.path.join(d, "meta", "tasks.jsonl"), "w") as f:
        f.write(json.dumps({"task_index": 0, "task": "put the bowl on the plate"}) + "\n")
        f.write(json.dumps({"task_index": 1, "description": "open the drawer"}) + "\n")
    expect_refusal("a tasks line without \"task\"", d, os.path.join(work, "out_tasks"),
                   "tasks.jsonl:2: expected {\"task_index\": <integer>, \"task\": <string>}")

    expect_refusal("--max-episodes -1", base, os.path.join(work, "out_max"),
                   "--max-episodes must be 0 (all) or more, got -1", "--max-episodes", "-1")

    # A bad image in the last episode is found after earlier shards were written to the staging
    # folder: it must not survive as a partial --out.
    d = variant(base, work, "bad_image")

    def break_image(table):
        name = "observation.images.image"
        cells = table.column(name).to_pylist()
        cells[5] = {"bytes": b"not an image", "path": "x.png"}
        i = table.column_names.index(name)
        return table.set_column(i, name, pa.array(cells, table.schema.field(name).type))

    edit_parquet(d, 2, break_image)
    expect_refusal("an undecodable image after shards were written", d, os.path.join(work, "out_image"),
                   "(episode 2) frame 5 camera observation.images.image: cannot decode image bytes")

    print(f"{'FAIL' if check.failures else 'PASS'}: convert_lerobot_libero bad input ({check.failures} failure(s))")
    return 1 if check.failures else 0


if __name__ == "__main__":
    sys.exit(main())
