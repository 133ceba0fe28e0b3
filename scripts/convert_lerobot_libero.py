#!/usr/bin/env python3
"""Converts a local LeRobot LIBERO dataset into fp8wire-train shards (format: trainer/README.md).

    scripts/convert_lerobot_libero.py --dataset /data/libero --out /data/libero_shards \
        [--tokenizer paligemma_tokenizer.model] [--max-token-len 200] [--horizon 50] [--samples-per-shard 512]

Input: a LeRobot v2.x dataset directory (meta/info.json, meta/tasks.jsonl,
data/chunk-*/episode_*.parquet) whose cameras are image features (PNG/JPEG bytes in the parquet,
as struct {bytes, path}), with an 8-value state and 7-value actions. Column names are taken from
meta/info.json: openpi's LIBERO dataset (`image`, `wrist_image`, `state`, `actions`) and LeRobot's
naming (`observation.images.image`, `observation.images.wrist_image` or `.image2`,
`observation.state`, `action`) are both recognised; --cameras/--state-key/--action-key override.
Video features (frames in videos/*.mp4) are not read: decoding them needs a video decoder.

Output: shard-NNNNN.safetensors, each sample one frame t of an episode with its action chunk
actions[t : t + horizon]; past the episode's last frame the last action repeats (LeRobot clamps
delta_timestamps queries to the episode, openpi trains on that). Episodes are told apart by the
`episode_index` column, so a file holding several episodes is split correctly.
norm_stats.json holds the statistics (mean, std, q01, q99) as openpi's compute_norm_stats gathers
them: state over frames, actions over the elements of every action chunk (so the repeated last
action counts as often as the chunks repeat it). Quantiles are exact (numpy's linear
interpolation) where openpi approximates them with a 5000-bin histogram: the two differ by at most
one bin, (max - min) / 5000. Normalisation is applied here, so the trainer reads ready-to-use values:
    x_norm = (x - q01) / (q99 - q01 + 1e-6) * 2 - 1
Prompts follow pi05: "Task: <task>, State: <256-bin discretised state>;\\nAction: " with the
normalised 8-value state discretised by np.digitize as openpi does (no clipping, so a value below
-1 shows as -1), tokenised with SentencePiece (the PaliGemma tokenizer model, with BOS) when
--tokenizer is given; without one, the UTF-8 bytes + 1 stand in for token ids (enough to exercise
the pipeline, not to train a real policy).
Samples are written in dataset order (episode by episode); the trainer reads them in file order.
Needs numpy, pyarrow, pillow, and sentencepiece when --tokenizer is given.
"""
import argparse
import glob
import io
import json
import os
import shutil
import struct
import sys
import tempfile

# Names tried, in order, when the corresponding option is "auto".
STATE_KEYS = ("observation.state", "state")
ACTION_KEYS = ("action", "actions")
CAMERA_SETS = (("observation.images.image", "observation.images.wrist_image"),
               ("observation.images.image", "observation.images.image2"),
               ("image", "wrist_image"))


STAGING = []  # folders being written, removed unless published as --out


class ConversionError(Exception):
    """Bad input: reported as one line naming the input, exit status 2, nothing left in --out."""


def fail(message):
    raise ConversionError(message)


def write_safetensors(path, tensors, metadata):
    """tensors: name -> numpy array. Header JSON padded to 8 bytes, then raw little-endian data."""
    import numpy as np
    names = {np.dtype("float32"): "F32", np.dtype("int32"): "I32", np.dtype("uint8"): "U8",
             np.dtype("bool"): "BOOL", np.dtype("int64"): "I64"}
    header = {"__metadata__": metadata}
    blobs, offset = [], 0
    for name, array in tensors.items():
        array = np.ascontiguousarray(array)
        data = array.astype(array.dtype.newbyteorder("<"), copy=False).tobytes()
        header[name] = {"dtype": names[array.dtype], "shape": list(array.shape),
                        "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
        blobs.append(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)
    os.replace(tmp, path)


def repeated_stats(values, counts):
    """mean, std, q01, q99 per column of `values` [N, D] with row i repeated counts[i] times, without
    materialising the repeats; quantiles as np.quantile's default (linear) method on the repeated rows."""
    import numpy as np
    v = np.asarray(values, np.float64)
    c = np.asarray(counts, np.int64)
    total = int(c.sum())
    if total < 2:
        fail("fewer than 2 values: cannot compute normalisation statistics")
    mean = (v * c[:, None]).sum(0) / total
    std = np.sqrt(((v - mean) ** 2 * c[:, None]).sum(0) / total)
    result = {"mean": mean.tolist(), "std": std.tolist()}
    for name, q in (("q01", 0.01), ("q99", 0.99)):
        position = q * (total - 1)
        lo = int(np.floor(position))
        frac = position - lo
        column_values = []
        for d in range(v.shape[1]):
            order = np.argsort(v[:, d], kind="stable")
            sorted_v, ends = v[order, d], np.cumsum(c[order])
            # Repeated-row index k lives in the first run whose cumulative end exceeds k.
            a = sorted_v[np.searchsorted(ends, lo, side="right")]
            b = sorted_v[np.searchsorted(ends, min(lo + 1, total - 1), side="right")]
            column_values.append(float(a + (b - a) * frac))
        result[name] = column_values
    return result


def normalise(x, stats):
    """openpi's quantile normalisation, in float64 as openpi's numpy pipeline computes it."""
    import numpy as np
    q01, q99 = np.asarray(stats["q01"], np.float64), np.asarray(stats["q99"], np.float64)
    return (np.asarray(x, np.float64) - q01) / (q99 - q01 + 1e-6) * 2.0 - 1.0


def chunk_indices(length, horizon):
    """[length, horizon] frame indices of each frame's action chunk, clamped to the episode's last frame."""
    import numpy as np
    return np.minimum(np.arange(length)[:, None] + np.arange(horizon)[None, :], length - 1)


def decode_image(cell, size, dataset_dir, where):
    """A LeRobot image cell: {'bytes': PNG/JPEG, 'path': ...} (bytes may be null when only the path,
    relative to the dataset, was stored), raw bytes, or an HxWx3 array."""
    import numpy as np
    from PIL import Image
    if isinstance(cell, dict):
        data = cell.get("bytes")
        if data is None and cell.get("path"):
            path = cell["path"] if os.path.isabs(cell["path"]) else os.path.join(dataset_dir, cell["path"])
            try:
                with open(path, "rb") as f:
                    data = f.read()
            except OSError as e:
                fail(f"{where}: image cell has no bytes and its path cannot be read: {e}")
        cell = data
    if isinstance(cell, (bytes, bytearray)):
        try:
            img = Image.open(io.BytesIO(cell)).convert("RGB")
        except Exception as e:  # PIL raises several types for undecodable data
            fail(f"{where}: cannot decode image bytes: {e}")
        if img.size != (size, size):
            img = img.resize((size, size), Image.BILINEAR)
        return np.asarray(img, dtype=np.uint8)
    if cell is None:
        fail(f"{where}: empty image cell")
    array = np.asarray(cell, dtype=np.uint8)
    if array.shape != (size, size, 3):
        fail(f"{where}: image of shape {array.shape}, expected ({size}, {size}, 3); pass --camera-size")
    return array


def column_matrix(table, name, where, frames):
    """A list<float> column as a float64 [rows, dim] array of finite values. `frames` are the rows'
    frame indices, for naming the frame of a bad value."""
    import numpy as np
    rows = table.column(name).to_pylist()
    try:
        matrix = np.asarray(rows, np.float64)
    except (ValueError, TypeError):
        fail(f"{where}: column '{name}' has rows of different lengths or empty cells, expected a vector per frame")
    if matrix.ndim != 2:
        fail(f"{where}: column '{name}' is not a vector per frame (shape {matrix.shape})")
    bad = np.argwhere(~np.isfinite(matrix))
    if len(bad):
        row, k = bad[0]
        fail(f"{where} frame {int(frames[row])}: column '{name}' value {int(k)} is {matrix[row, k]}, expected a finite "
             f"number ({len(bad)} non-finite value(s) in this episode)")
    return matrix


def integer_column(table, name, where):
    """An integer column (episode_index, frame_index, task_index) as int64, refusing nulls and floats."""
    import numpy as np
    values = table.column(name).to_pylist()
    if any(not isinstance(v, int) or isinstance(v, bool) for v in values):
        bad = next(v for v in values if not isinstance(v, int) or isinstance(v, bool))
        fail(f"{where}: column '{name}' holds {bad!r}, expected integers")
    return np.asarray(values, np.int64)


def read_json(path, what):
    """A JSON file, or one line naming it and the problem."""
    try:
        with open(path) as f:
            return json.load(f)
    except OSError as e:
        fail(f"{path}: cannot read {what}: {e.strerror}")
    except (ValueError, UnicodeDecodeError) as e:
        fail(f"{path}: {what} is not valid JSON: {e}")


def read_tasks(path):
    """meta/tasks.jsonl: task_index -> task, every line checked."""
    tasks = {}
    try:
        with open(path) as f:
            lines = f.read().splitlines()
    except OSError as e:
        fail(f"{path}: cannot read: {e.strerror}")
    except UnicodeDecodeError as e:
        fail(f"{path}: not UTF-8 text: {e}")
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            t = json.loads(line)
        except ValueError as e:
            fail(f"{path}:{number}: not valid JSON: {e}")
        index = t.get("task_index") if isinstance(t, dict) else None
        text = t.get("task") if isinstance(t, dict) else None
        if not isinstance(index, int) or isinstance(index, bool) or not isinstance(text, str):
            fail(f"{path}:{number}: expected {{\"task_index\": <integer>, \"task\": <string>}}, got {line.strip()[:80]}")
        tasks[index] = text
    return tasks


def read_parquet(pq, path, columns=None):
    """One parquet file (the columns asked for), or one line naming the file and the problem."""
    import pyarrow as pa
    try:
        return pq.read_table(path, columns=columns)
    except (pa.ArrowException, OSError, KeyError, ValueError) as e:
        fail(f"{path}: not a readable parquet file with columns {columns or 'all'}: {str(e).splitlines()[0]}")


def prepare_output(out):
    """A fresh staging folder beside --out; --out itself must not exist or be empty, so shards of an
    earlier run are never read together with these. The staging folder becomes --out only when
    everything was written (publish_output)."""
    if os.path.lexists(out):
        if not os.path.isdir(out):
            fail(f"--out {out} exists and is not a directory")
        entries = sorted(os.listdir(out))
        if entries:
            fail(f"--out {out} is not empty ({len(entries)} entries, e.g. {entries[0]}); give a new folder or remove "
                 f"it: the trainer reads every shard in the folder")
    parent = os.path.dirname(os.path.abspath(out))
    try:
        os.makedirs(parent, exist_ok=True)
        staging = tempfile.mkdtemp(prefix=os.path.basename(os.path.abspath(out)) + ".partial-", dir=parent)
        STAGING.append(staging)
        return staging
    except OSError as e:
        fail(f"--out {out}: cannot create a folder beside it: {e.strerror}")


def publish_output(staging, out):
    if os.path.isdir(out):
        os.rmdir(out)  # empty (checked before the conversion); rename cannot replace it otherwise
    os.rename(staging, out)


def resolve_columns(args, features, available):
    """Picks the state/action/camera columns: explicit options win, else the first known name present."""
    def pick(option, candidates, what):
        if option != "auto":
            return option
        for name in candidates:
            if name in available:
                return name
        fail(f"no {what} column among {list(candidates)}; columns are {sorted(available)} (pass --{what}-key)")
    state_key = pick(args.state_key, STATE_KEYS, "state")
    action_key = pick(args.action_key, ACTION_KEYS, "action")
    if args.cameras != "auto":
        cameras = [c for c in args.cameras.split(",") if c]
    else:
        for candidate in CAMERA_SETS:
            if all(c in available or c in features for c in candidate):
                cameras = list(candidate)
                break
        else:
            fail(f"no known LIBERO camera pair ({[list(c) for c in CAMERA_SETS]}); columns are "
                 f"{sorted(available)} (pass --cameras)")
    for c in cameras:
        if features.get(c, {}).get("dtype") == "video":
            fail(f"camera '{c}' is a video feature (frames in videos/*.mp4): this converter reads image "
                 f"features only (PNG/JPEG bytes in the parquet files)")
        if c not in available:
            fail(f"camera column '{c}' is not in the parquet files; columns are {sorted(available)}")
    return state_key, action_key, cameras


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dataset", required=True, help="LeRobot dataset directory")
    p.add_argument("--out", required=True, help="output directory for shards and norm_stats.json")
    p.add_argument("--tokenizer", help="SentencePiece model (PaliGemma's) for the prompts")
    p.add_argument("--cameras", default="auto",
                   help="comma-separated image columns in slot order (default: auto, from the known LIBERO names)")
    p.add_argument("--state-key", default="auto", help="state column (default: auto)")
    p.add_argument("--action-key", default="auto", help="action column (default: auto)")
    p.add_argument("--camera-size", type=int, default=256)
    p.add_argument("--max-token-len", type=int, default=200)
    p.add_argument("--horizon", type=int, default=50)
    p.add_argument("--samples-per-shard", type=int, default=512)
    p.add_argument("--max-episodes", type=int, default=0, help="convert only the first N episodes (0 = all)")
    args = p.parse_args()
    try:
        convert(args)
    except ConversionError as e:
        print(f"convert_lerobot_libero: {e}", file=sys.stderr)
        return 2
    finally:
        # Whatever stopped the conversion (bad input, Ctrl-C, a full disk), nothing half-written is
        # left behind: the staging folder exists only until it is published as --out.
        for staging in STAGING:
            shutil.rmtree(staging, ignore_errors=True)
    return 0


def convert(args):
    """The conversion (raises ConversionError on bad input)."""
    for name in ("camera_size", "max_token_len", "horizon", "samples_per_shard"):
        if getattr(args, name) < 1:
            fail(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    if args.max_episodes < 0:
        fail(f"--max-episodes must be 0 (all) or more, got {args.max_episodes}")
    if not os.path.isdir(args.dataset):
        fail(f"--dataset {args.dataset} is not a directory")

    try:
        import numpy as np
        import pyarrow.parquet as pq
        import PIL  # noqa: F401  (checked here so a missing pillow fails before any work)
    except ImportError as e:
        fail(f"{e}; install numpy, pyarrow and pillow")
    tokenizer = None
    if args.tokenizer:
        try:
            import sentencepiece
        except ImportError:
            fail("--tokenizer needs the sentencepiece package")
        try:
            tokenizer = sentencepiece.SentencePieceProcessor(model_file=args.tokenizer)
        except (OSError, RuntimeError) as e:
            fail(f"--tokenizer {args.tokenizer}: not a readable SentencePiece model: {str(e).splitlines()[0]}")

    info = {}
    info_path = os.path.join(args.dataset, "meta", "info.json")
    if os.path.exists(info_path):
        info = read_json(info_path, "meta/info.json")
        if not isinstance(info, dict):
            fail(f"{info_path}: expected a JSON object, got {type(info).__name__}")
    version = str(info.get("codebase_version", "v2"))
    if not version.startswith("v2"):
        fail(f"{info_path}: codebase_version {version}; this converter reads LeRobot v2.x datasets "
             f"(one parquet file per episode, meta/tasks.jsonl)")
    features = info.get("features", {})
    if not isinstance(features, dict) or not all(isinstance(v, dict) for v in features.values()):
        fail(f"{info_path}: \"features\" is not an object of feature objects")

    files = sorted(glob.glob(os.path.join(args.dataset, "data", "*", "*.parquet")))
    if not files:
        fail(f"no data/*/*.parquet under {args.dataset}: not a LeRobot v2 dataset")
    tasks = {}
    tasks_path = os.path.join(args.dataset, "meta", "tasks.jsonl")
    if os.path.exists(tasks_path):
        tasks = read_tasks(tasks_path)
    try:
        available = set(pq.read_schema(files[0]).names)
    except Exception as e:  # pyarrow raises several types for a file that is not parquet
        fail(f"{files[0]}: not a readable parquet file: {str(e).splitlines()[0]}")
    state_key, action_key, cameras = resolve_columns(args, features, available)

    def episodes(columns):
        """Yields (file, episode index, table rows of that episode in frame order), the first
        --max-episodes episodes only."""
        seen = 0
        for path in files:
            table = read_parquet(pq, path, columns)
            if "episode_index" in table.column_names:
                ids = integer_column(table, "episode_index", path)
            else:
                ids = np.zeros(table.num_rows, np.int64)  # no column: the file is one episode
            frame = (integer_column(table, "frame_index", path)
                     if "frame_index" in table.column_names else np.arange(table.num_rows))
            for episode in dict.fromkeys(ids.tolist()):  # in order of first appearance
                rows = np.flatnonzero(ids == episode)
                rows = rows[np.argsort(frame[rows], kind="stable")]
                yield path, episode, table.take(rows), frame[rows]
                seen += 1
                if args.max_episodes and seen >= args.max_episodes:
                    return

    # Pass 1: statistics on raw values, over what openpi's compute_norm_stats sees: every frame's
    # state once, and every element of every frame's action chunk.
    numeric = [c for c in (state_key, action_key, "episode_index", "frame_index") if c in available]
    states, actions, action_counts = [], [], []
    for path, episode, table, frames in episodes(numeric):
        where = f"{path} (episode {episode})"
        state = column_matrix(table, state_key, where, frames)
        act = column_matrix(table, action_key, where, frames)
        states.append(state)
        actions.append(act)
        action_counts.append(np.bincount(chunk_indices(len(act), args.horizon).ravel(), minlength=len(act)))
    if not states:
        fail(f"no frames in the parquet files under {args.dataset}")
    if len({s.shape[1] for s in states}) > 1 or len({a.shape[1] for a in actions}) > 1:
        fail(f"episodes under {args.dataset} have different state or action widths "
             f"(state {sorted({s.shape[1] for s in states})}, actions {sorted({a.shape[1] for a in actions})})")
    states, actions, action_counts = np.concatenate(states), np.concatenate(actions), np.concatenate(action_counts)
    stats = {"state": repeated_stats(states, np.ones(len(states), np.int64)),
             "actions": repeated_stats(actions, action_counts)}
    staging = prepare_output(args.out)
    with open(os.path.join(staging, "norm_stats.json"), "w") as f:
        json.dump({"norm_stats": stats,
                   "normalisation": "quantile: (x - q01) / (q99 - q01 + 1e-6) * 2 - 1",
                   "columns": {"state": state_key, "actions": action_key, "cameras": cameras},
                   "horizon": args.horizon}, f, indent=1)
    raw_action_dim = actions.shape[1]
    del states, actions, action_counts

    bins = np.linspace(-1, 1, 256 + 1)[:-1]
    buffer = {k: [] for k in ("images", "image_mask", "tokens", "token_mask", "actions")}
    shard_index = 0
    total = 0
    episode_count = 0

    def flush():
        nonlocal shard_index
        if not buffer["images"]:
            return
        arrays = {k: np.stack(v) for k, v in buffer.items()}
        write_safetensors(os.path.join(staging, f"shard-{shard_index:05d}.safetensors"), arrays,
                          {"format": "fp8wire-libero-v1", "source": os.path.abspath(args.dataset)})
        shard_index += 1
        for v in buffer.values():
            v.clear()

    for path, episode, table, frames in episodes(None):
        where = f"{path} (episode {episode})"
        episode_count += 1
        state = normalise(column_matrix(table, state_key, where, frames), stats["state"])
        act = normalise(column_matrix(table, action_key, where, frames), stats["actions"]).astype(np.float32)
        n = len(state)
        if act.shape[1] != raw_action_dim:
            fail(f"{where}: {act.shape[1]} action values per frame, earlier episodes have {raw_action_dim}")
        task_ids = (integer_column(table, "task_index", where).tolist() if "task_index" in table.column_names
                    else [0] * n)
        image_cells = {c: table.column(c).to_pylist() for c in cameras}
        chunks = chunk_indices(n, args.horizon)
        for t in range(n):
            task_index = int(task_ids[t])
            if task_index not in tasks:
                fail(f"{where}: frame {t} has task_index {task_index}, which {tasks_path} does not list")
            text = tasks[task_index].strip().replace("_", " ").replace("\n", " ")
            discrete = np.digitize(state[t], bins) - 1
            prompt = f"Task: {text}, State: {' '.join(map(str, discrete))};\nAction: "
            ids = tokenizer.encode(prompt, add_bos=True) if tokenizer else [b + 1 for b in prompt.encode()]
            ids = ids[:args.max_token_len]
            tokens = np.zeros(args.max_token_len, np.int32)
            tokens[:len(ids)] = ids
            mask = np.zeros(args.max_token_len, bool)
            mask[:len(ids)] = True
            buffer["images"].append(np.stack([decode_image(image_cells[c][t], args.camera_size, args.dataset,
                                                           f"{where} frame {t} camera {c}") for c in cameras]))
            buffer["image_mask"].append(np.ones(len(cameras), bool))
            buffer["tokens"].append(tokens)
            buffer["token_mask"].append(mask)
            buffer["actions"].append(act[chunks[t]])
            total += 1
            if len(buffer["images"]) == args.samples_per_shard:
                flush()
    flush()
    publish_output(staging, args.out)
    STAGING.remove(staging)
    print(f"convert_lerobot_libero: {total} samples from {episode_count} episode(s) -> {shard_index} shard(s) in "
          f"{args.out}; set data.source=\"shards\", data.shard_dir, data.num_images={len(cameras)}, "
          f"data.camera_size={args.camera_size}, data.raw_action_dim={raw_action_dim}, "
          f"data.max_token_len={args.max_token_len}, model.action_horizon={args.horizon}")


if __name__ == "__main__":
    sys.exit(main())
