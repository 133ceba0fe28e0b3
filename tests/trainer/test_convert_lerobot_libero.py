#!/usr/bin/env python3
"""End-to-end test of scripts/convert_lerobot_libero.py on a synthetic LeRobot v2.1 LIBERO dataset.

    test_convert_lerobot_libero.py WORK_DIR [FP8WIRE_TRAIN CONFIG_DIR]

Builds a tiny dataset in LeRobot's on-disk layout (meta/info.json, tasks.jsonl, episodes.jsonl,
episodes_stats.jsonl, data/chunk-000/episode_NNNNNN.parquet with PNG image structs {bytes, path}),
in both column namings the converter recognises, converts it, and checks every shard value against
numpy computed here independently of the converter. With FP8WIRE_TRAIN, two training steps of the
tiny model run on the shards through the trainer's C++ shard reader. Exits 77 (skipped) when this
python lacks numpy, pyarrow or pillow; the tokeniser part is skipped without sentencepiece.
"""
import io
import json
import math
import os
import shutil
import struct
import subprocess
import sys

try:
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq
    from PIL import Image
except ImportError as e:
    print(f"SKIPPED: {e} (install numpy, pyarrow and pillow into {sys.executable}: scripts/install-deps.sh)")
    sys.exit(77)

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONVERTER = os.path.join(REPO, "scripts", "convert_lerobot_libero.py")
HORIZON, SIZE, STATE_DIM, ACTION_DIM = 50, 256, 8, 7
# Episode lengths straddle the horizon: shorter than a chunk, exactly one, and longer.
EPISODE_LENGTHS = (7, 50, 63)
TASKS = ["put the bowl on the plate", "open_the top drawer\nof the cabinet"]


class Checks:
    """check(condition, what): a PASS or FAIL line; the failures counted."""

    def __init__(self):
        self.failures = 0

    def __call__(self, condition, what):
        print(f"{'PASS' if condition else 'FAIL'}: {what}")
        if not condition:
            self.failures += 1


check = Checks()


def work_dir(usage):
    """WORK_DIR, the first argument, created empty; None (after printing `usage`) without one."""
    if len(sys.argv) < 2:
        print(usage)
        return None
    work = sys.argv[1]
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    return work


def frame_image(episode, frame, camera):
    """A smooth 256x256 pattern unique to (episode, frame, camera), so a misplaced frame shows."""
    y, x = np.mgrid[0:SIZE, 0:SIZE]
    r = (x + 3 * frame + 40 * camera) % 256
    g = (y + 17 * episode) % 256
    b = ((x // 32 + y // 32 + frame + episode + camera) * 29) % 256
    return np.stack([r, g, b], -1).astype(np.uint8)


def png(array):
    out = io.BytesIO()
    Image.fromarray(array).save(out, format="PNG")
    return out.getvalue()


def make_dataset(root, naming):
    """naming 'lerobot': observation.state/action/observation.images.*; 'openpi': state/actions/image."""
    rng = np.random.default_rng(1234)
    if naming == "lerobot":
        state_key, action_key = "observation.state", "action"
        cameras = ["observation.images.image", "observation.images.wrist_image"]
    else:
        state_key, action_key, cameras = "state", "actions", ["image", "wrist_image"]
    os.makedirs(os.path.join(root, "meta"))
    os.makedirs(os.path.join(root, "data", "chunk-000"))
    image_type = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    episodes, index = [], 0
    for e, n in enumerate(EPISODE_LENGTHS):
        # Heavy-tailed values so q01/q99 differ clearly from min/max.
        state = rng.standard_t(3, size=(n, STATE_DIM)).astype(np.float32)
        action = (rng.standard_t(3, size=(n, ACTION_DIM)) * 0.3).astype(np.float32)
        task_index = e % len(TASKS)
        columns = {
            state_key: pa.array(state.tolist(), pa.list_(pa.float32())),
            action_key: pa.array(action.tolist(), pa.list_(pa.float32())),
            "timestamp": pa.array(np.arange(n, dtype=np.float32) / 10),
            "frame_index": pa.array(np.arange(n, dtype=np.int64)),
            "episode_index": pa.array(np.full(n, e, np.int64)),
            "index": pa.array(np.arange(index, index + n, dtype=np.int64)),
            "task_index": pa.array(np.full(n, task_index, np.int64)),
        }
        images = [[frame_image(e, t, c) for t in range(n)] for c in range(len(cameras))]
        for c, name in enumerate(cameras):
            cells = [{"bytes": png(images[c][t]), "path": f"frame_{t:06d}.png"} for t in range(n)]
            if e == 1 and c == 1:
                # One cell as LeRobot leaves it when the image was not embedded: a path, no bytes.
                rel = os.path.join("images", name, f"episode_{e:06d}", "frame_000002.png")
                os.makedirs(os.path.join(root, os.path.dirname(rel)), exist_ok=True)
                with open(os.path.join(root, rel), "wb") as f:
                    f.write(cells[2]["bytes"])
                cells[2] = {"bytes": None, "path": rel}
            columns[name] = pa.array(cells, image_type)
        pq.write_table(pa.table(columns), os.path.join(root, "data", "chunk-000", f"episode_{e:06d}.parquet"))
        episodes.append({"state": state, "action": action, "task_index": task_index, "images": images})
        index += n
    features = {name: {"dtype": "image", "shape": [SIZE, SIZE, 3], "names": ["height", "width", "channel"]}
                for name in cameras}
    features[state_key] = {"dtype": "float32", "shape": [STATE_DIM], "names": ["state"]}
    features[action_key] = {"dtype": "float32", "shape": [ACTION_DIM], "names": ["actions"]}
    for name in ("frame_index", "episode_index", "index", "task_index"):
        features[name] = {"dtype": "int64", "shape": [1], "names": None}
    features["timestamp"] = {"dtype": "float32", "shape": [1], "names": None}
    info = {"codebase_version": "v2.1", "robot_type": "panda", "total_episodes": len(EPISODE_LENGTHS),
            "total_frames": index, "total_tasks": len(TASKS), "total_videos": 0, "total_chunks": 1,
            "chunks_size": 1000, "fps": 10, "splits": {"train": f"0:{len(EPISODE_LENGTHS)}"},
            "data_path": "data/chunk-{episode_chunk:03d}/episode_{episode_index:06d}.parquet",
            "video_path": None, "features": features}
    with open(os.path.join(root, "meta", "info.json"), "w") as f:
        json.dump(info, f, indent=2)
    with open(os.path.join(root, "meta", "tasks.jsonl"), "w") as f:
        for i, t in enumerate(TASKS):
            f.write(json.dumps({"task_index": i, "task": t}) + "\n")
    with open(os.path.join(root, "meta", "episodes.jsonl"), "w") as f:
        for e, ep in enumerate(episodes):
            f.write(json.dumps({"episode_index": e, "tasks": [TASKS[ep["task_index"]]],
                                "length": EPISODE_LENGTHS[e]}) + "\n")
    with open(os.path.join(root, "meta", "episodes_stats.jsonl"), "w") as f:
        for e, ep in enumerate(episodes):  # present as in v2.1; the converter computes its own stats
            f.write(json.dumps({"episode_index": e, "stats": {
                state_key: {"min": ep["state"].min(0).tolist(), "max": ep["state"].max(0).tolist()}}}) + "\n")
    return episodes


def read_safetensors(path):
    """A reader written from the format description, independent of the converter's writer."""
    dtypes = {"F32": np.float32, "I32": np.int32, "I64": np.int64, "U8": np.uint8, "BOOL": np.bool_}
    with open(path, "rb") as f:
        blob = f.read()
    n = struct.unpack("<Q", blob[:8])[0]
    header = json.loads(blob[8:8 + n])
    meta = header.pop("__metadata__", {})
    out = {}
    for name, e in header.items():
        begin, end = e["data_offsets"]
        out[name] = np.frombuffer(blob[8 + n + begin:8 + n + end], dtypes[e["dtype"]]).reshape(e["shape"])
    return out, meta


def expected_stats(episodes):
    states = np.concatenate([ep["state"] for ep in episodes]).astype(np.float64)
    # openpi gathers action statistics from the training samples: every element of every chunk,
    # padded past the episode end with the last action.
    chunks = np.concatenate([ep["action"][np.minimum(np.arange(len(ep["action"]))[:, None] + np.arange(HORIZON), len(ep["action"]) - 1)]
                             for ep in episodes]).reshape(-1, ACTION_DIM).astype(np.float64)
    stats = {}
    for key, v in (("state", states), ("actions", chunks)):
        stats[key] = {"mean": v.mean(0), "std": v.std(0),
                      "q01": np.quantile(v, 0.01, axis=0), "q99": np.quantile(v, 0.99, axis=0)}
    return stats


def normalise(x, s):
    return (np.asarray(x, np.float64) - s["q01"]) / (s["q99"] - s["q01"] + 1e-6) * 2.0 - 1.0


def run_converter(dataset, out, *extra):
    cmd = [sys.executable, CONVERTER, "--dataset", dataset, "--out", out, "--samples-per-shard", "32",
           "--max-token-len", "160", *extra]
    r = subprocess.run(cmd, capture_output=True, text=True)
    print(r.stdout.strip())
    if r.returncode != 0:
        print(r.stderr)
    check(r.returncode == 0, f"converter exits 0 ({' '.join(extra) or 'no options'})")
    return r


def load_shards(out):
    names = sorted(n for n in os.listdir(out) if n.endswith(".safetensors"))
    parts = [read_safetensors(os.path.join(out, n)) for n in names]
    return names, {k: np.concatenate([p[0][k] for p in parts]) for k in parts[0][0]}, [p[1] for p in parts]


def verify(episodes, out, tokenizer=None, max_token_len=160):
    total = sum(EPISODE_LENGTHS)
    names, data, metas = load_shards(out)
    check(len(names) == math.ceil(total / 32), f"{len(names)} shards of at most 32 samples for {total} frames")
    check(all(m.get("format") == "fp8wire-libero-v1" for m in metas), "every shard has format fp8wire-libero-v1")
    shapes = {"images": ((total, 2, SIZE, SIZE, 3), np.uint8), "image_mask": ((total, 2), np.bool_),
              "tokens": ((total, max_token_len), np.int32), "token_mask": ((total, max_token_len), np.bool_),
              "actions": ((total, HORIZON, ACTION_DIM), np.float32)}
    for key, (shape, dtype) in shapes.items():
        check(data[key].shape == shape and data[key].dtype == dtype,
              f"{key}: {data[key].shape} {data[key].dtype}, expected {shape} {np.dtype(dtype)}")
    check(bool(data["image_mask"].all()), "image_mask is true for both cameras")

    with open(os.path.join(out, "norm_stats.json")) as f:
        got_stats = json.load(f)["norm_stats"]
    want = expected_stats(episodes)
    for key in ("state", "actions"):
        for stat in ("q01", "q99", "mean", "std"):
            g, w = np.asarray(got_stats[key][stat]), want[key][stat]
            check(g.shape == w.shape and np.allclose(g, w, rtol=1e-9, atol=1e-9),
                  f"norm_stats {key}.{stat} matches numpy (max diff {np.max(np.abs(g - w)):.2e})")
    # The stats must not collapse to min/max or frame-only statistics: the chunk weighting matters.
    frame_q99 = np.quantile(np.concatenate([ep["action"] for ep in episodes]), 0.99, axis=0)
    check(not np.allclose(frame_q99, want["actions"]["q99"]), "chunk-weighted action q99 differs from per-frame q99")

    images_ok = actions_ok = tokens_ok = True
    boundary_ok = True
    bins = np.linspace(-1, 1, 257)[:-1]
    row = 0
    for e, ep in enumerate(episodes):
        n = len(ep["action"])
        norm_actions = normalise(ep["action"], want["actions"]).astype(np.float32)
        norm_state = normalise(ep["state"], want["state"])
        for t in range(n):
            for c in range(2):
                images_ok &= bool(np.array_equal(data["images"][row, c], ep["images"][c][t]))
            chunk = data["actions"][row]
            expected = norm_actions[[min(t + k, n - 1) for k in range(HORIZON)]]
            actions_ok &= bool(np.allclose(chunk, expected, atol=2e-6))
            if t + HORIZON > n:  # the tail of the chunk repeats the episode's last action, not the next episode's
                boundary_ok &= bool(np.array_equal(chunk[n - t:], np.repeat(chunk[n - t - 1:n - t], t + HORIZON - n, 0)))
            text = TASKS[ep["task_index"]].strip().replace("_", " ").replace("\n", " ")
            discrete = np.digitize(norm_state[t], bins) - 1
            prompt = f"Task: {text}, State: {' '.join(map(str, discrete))};\nAction: "
            ids = tokenizer.encode(prompt, add_bos=True) if tokenizer else [b + 1 for b in prompt.encode()]
            ids = ids[:max_token_len]
            tokens_ok &= bool(np.array_equal(data["tokens"][row, :len(ids)], ids)
                              and not data["tokens"][row, len(ids):].any()
                              and data["token_mask"][row, :len(ids)].all()
                              and not data["token_mask"][row, len(ids):].any())
            row += 1
    check(images_ok, "images: every sample holds its own frame of both cameras, 256x256 uint8, pixel exact")
    check(actions_ok, "actions: 50-step chunks of quantile-normalised actions (7 values; the trainer pads to 32)")
    check(boundary_ok, "chunks past an episode end repeat its last action, never the next episode's")
    check(tokens_ok, "tokens/token_mask: pi05 prompt with the 256-bin state" + (" (SentencePiece)" if tokenizer else " (bytes + 1)"))
    return data


def main():
    work = work_dir(__doc__)
    if work is None:
        return 2

    # LeRobot's naming, converted with automatic column detection, then through the trainer.
    dataset = os.path.join(work, "libero_lerobot")
    episodes = make_dataset(dataset, "lerobot")
    out = os.path.join(work, "shards_lerobot")
    r = run_converter(dataset, out)
    if r.returncode == 0:
        verify(episodes, out)

    # openpi's naming (physical-intelligence/libero): same data, same result.
    dataset_openpi = os.path.join(work, "libero_openpi")
    make_dataset(dataset_openpi, "openpi")
    out_openpi = os.path.join(work, "shards_openpi")
    if run_converter(dataset_openpi, out_openpi).returncode == 0:
        a, b = load_shards(out)[1], load_shards(out_openpi)[1]
        check(all(np.array_equal(a[k], b[k]) for k in a), "openpi column names give the same shards as LeRobot's")

    # Bad input is refused with a message naming the problem.
    r = subprocess.run([sys.executable, CONVERTER, "--dataset", dataset, "--out", os.path.join(work, "bad"),
                        "--cameras", "observation.images.nonexistent"], capture_output=True, text=True)
    check(r.returncode == 2 and "observation.images.nonexistent" in r.stderr, "an unknown camera column is refused by name")

    # A dataset whose cameras are video features (frames in videos/*.mp4) is refused, not misread.
    video = os.path.join(work, "libero_video")
    shutil.copytree(dataset, video)
    with open(os.path.join(video, "meta", "info.json")) as f:
        info = json.load(f)
    for name in ("observation.images.image", "observation.images.wrist_image"):
        info["features"][name]["dtype"] = "video"
    with open(os.path.join(video, "meta", "info.json"), "w") as f:
        json.dump(info, f)
    for name in os.listdir(os.path.join(video, "data", "chunk-000")):
        path = os.path.join(video, "data", "chunk-000", name)
        table = pq.read_table(path)
        pq.write_table(table.drop_columns(["observation.images.image", "observation.images.wrist_image"]), path)
    r = subprocess.run([sys.executable, CONVERTER, "--dataset", video, "--out", os.path.join(work, "bad_video")],
                       capture_output=True, text=True)
    check(r.returncode == 2 and "video feature" in r.stderr, "a dataset with video cameras is refused with a message")

    try:
        import sentencepiece as spm
    except ImportError:
        print("SKIPPED (part): sentencepiece is not installed; tokenisation with --tokenizer untested")
        spm = None
    if spm is not None:
        corpus = os.path.join(work, "corpus.txt")
        with open(corpus, "w") as f:
            for i in range(200):
                f.write(f"Task: {TASKS[i % 2]}, State: {' '.join(str((i * 37 + k * 11) % 256) for k in range(8))};\n")
        prefix = os.path.join(work, "spm")
        spm.SentencePieceTrainer.train(input=corpus, model_prefix=prefix, vocab_size=120, model_type="unigram",
                                       minloglevel=2, bos_id=2, eos_id=1, unk_id=3, pad_id=0)
        tokenizer = spm.SentencePieceProcessor(model_file=prefix + ".model")
        out_spm = os.path.join(work, "shards_spm")
        if run_converter(dataset, out_spm, "--tokenizer", prefix + ".model").returncode == 0:
            verify(episodes, out_spm, tokenizer)

    if len(sys.argv) >= 4:
        trainer, config_dir = sys.argv[2], sys.argv[3]
        cmd = [trainer, "--config", os.path.join(config_dir, "tiny.toml"), "--steps", "2",
               "--set", "data.source=shards", "--set", f"data.shard_dir={out}",
               "--set", f"data.camera_size={SIZE}", "--set", f"data.state_dim={STATE_DIM}",
               "--set", f"data.raw_action_dim={ACTION_DIM}", "--set", "data.max_token_len=160",
               "--set", "model.action_dim=32", "--set", f"model.action_horizon={HORIZON}",
               # 2 x 36 samples of the 120, shuffled (data.shuffle defaults to true for shards):
               # each batch draws rows from all four 32-sample shards.
               "--set", "train.micro_batch=36",
               "--set", f"train.out_dir={os.path.join(work, 'train')}"]
        r = subprocess.run(cmd, capture_output=True, text=True)
        print(r.stdout[-2000:], r.stderr[-2000:])
        check(r.returncode == 0, "fp8wire-train runs 2 steps of 36 samples on the converted shards (C++ shard reader)")
        log = os.path.join(work, "train", "train_log.jsonl")
        losses = []
        if os.path.exists(log):
            with open(log) as f:
                losses = [json.loads(line)["loss"] for line in f if line.strip()]
        check(len(losses) == 2 and all(math.isfinite(x) for x in losses), f"two finite losses logged: {losses}")

    print(f"{'FAIL' if check.failures else 'PASS'}: convert_lerobot_libero ({check.failures} failure(s))")
    return 1 if check.failures else 0


if __name__ == "__main__":
    sys.exit(main())
