#!/usr/bin/env python3
"""Converts a local LeRobot LIBERO dataset into fp8wire-train shards (format: trainer/README.md).

    scripts/convert_lerobot_libero.py --dataset /data/libero --out /data/libero_shards \
        [--tokenizer paligemma_tokenizer.model] [--max-token-len 200] [--horizon 50] [--samples-per-shard 512]

Input: a LeRobot v2 dataset directory (meta/info.json, meta/tasks.jsonl, data/chunk-*/episode_*.parquet)
with image columns (`image`, `wrist_image` or `observation.images.*`) holding 256x256 frames as
encoded bytes, `state` (8) and `actions` (7), as in the LIBERO dataset openpi trains on.
Output: shard-NNNNN.safetensors, each sample one frame t with its action chunk actions[t : t + horizon]
(past the episode end the last action repeats, as LeRobot's delta_timestamps padding does), and
norm_stats.json with openpi's quantile statistics (q01/q99, mean, std) of state and actions.
Normalisation is applied here, so the trainer reads ready-to-use values:
    x_norm = (x - q01) / (q99 - q01 + 1e-6) * 2 - 1
Prompts follow pi05: "Task: <task>, State: <256-bin discretised state>;\\nAction: ", tokenised with
SentencePiece (the PaliGemma tokenizer model, with BOS) when --tokenizer is given; without one, the
UTF-8 bytes + 1 stand in for token ids (enough to exercise the pipeline, not to train a real policy).
Needs numpy, pyarrow, pillow, and sentencepiece when --tokenizer is given.
"""
import argparse
import glob
import io
import json
import os
import struct
import sys


def fail(message):
    print(f"convert_lerobot_libero: {message}", file=sys.stderr)
    sys.exit(2)


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


def quantile_stats(values):
    import numpy as np
    v = np.asarray(values, dtype=np.float64)
    return {"mean": v.mean(0).tolist(), "std": v.std(0).tolist(),
            "q01": np.quantile(v, 0.01, axis=0).tolist(), "q99": np.quantile(v, 0.99, axis=0).tolist()}


def normalise(x, stats):
    import numpy as np
    q01, q99 = np.asarray(stats["q01"], np.float32), np.asarray(stats["q99"], np.float32)
    return (x - q01) / (q99 - q01 + 1e-6) * 2.0 - 1.0


def decode_image(cell, size):
    """A LeRobot image cell: {'bytes': PNG/JPEG, 'path': ...}, raw bytes, or an HxWx3 array."""
    import numpy as np
    from PIL import Image
    if isinstance(cell, dict):
        cell = cell.get("bytes")
    if isinstance(cell, (bytes, bytearray)):
        img = Image.open(io.BytesIO(cell)).convert("RGB")
        if img.size != (size, size):
            img = img.resize((size, size), Image.BILINEAR)
        return np.asarray(img, dtype=np.uint8)
    array = np.asarray(cell, dtype=np.uint8)
    if array.shape != (size, size, 3):
        fail(f"image of shape {array.shape}, expected ({size}, {size}, 3); pass --camera-size")
    return array


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dataset", required=True, help="LeRobot dataset directory")
    p.add_argument("--out", required=True, help="output directory for shards and norm_stats.json")
    p.add_argument("--tokenizer", help="SentencePiece model (PaliGemma's) for the prompts")
    p.add_argument("--cameras", default="image,wrist_image",
                   help="comma-separated image columns, in slot order (default image,wrist_image)")
    p.add_argument("--state-key", default="state")
    p.add_argument("--action-key", default="actions")
    p.add_argument("--camera-size", type=int, default=256)
    p.add_argument("--max-token-len", type=int, default=200)
    p.add_argument("--horizon", type=int, default=50)
    p.add_argument("--samples-per-shard", type=int, default=512)
    p.add_argument("--max-episodes", type=int, default=0, help="convert only the first N episodes (0 = all)")
    args = p.parse_args()

    try:
        import numpy as np
        import pyarrow.parquet as pq
    except ImportError as e:
        fail(f"{e}; install numpy, pyarrow and pillow")
    tokenizer = None
    if args.tokenizer:
        try:
            import sentencepiece
        except ImportError:
            fail("--tokenizer needs the sentencepiece package")
        tokenizer = sentencepiece.SentencePieceProcessor(model_file=args.tokenizer)

    files = sorted(glob.glob(os.path.join(args.dataset, "data", "*", "*.parquet")))
    if not files:
        fail(f"no data/*/*.parquet under {args.dataset}: not a LeRobot v2 dataset")
    if args.max_episodes:
        files = files[:args.max_episodes]
    tasks = {}
    tasks_path = os.path.join(args.dataset, "meta", "tasks.jsonl")
    if os.path.exists(tasks_path):
        for line in open(tasks_path):
            if line.strip():
                t = json.loads(line)
                tasks[int(t["task_index"])] = t["task"]
    cameras = [c for c in args.cameras.split(",") if c]

    # Pass 1: statistics over every frame (openpi computes them before training, on raw values).
    states, actions = [], []
    for path in files:
        table = pq.read_table(path, columns=[args.state_key, args.action_key]).to_pydict()
        states.extend(table[args.state_key])
        actions.extend(table[args.action_key])
    stats = {"state": quantile_stats(states), "actions": quantile_stats(actions)}
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "norm_stats.json"), "w") as f:
        json.dump({"norm_stats": stats, "normalisation": "quantile: (x - q01) / (q99 - q01 + 1e-6) * 2 - 1"}, f, indent=1)
    raw_action_dim = len(actions[0])
    del states, actions

    bins = np.linspace(-1, 1, 257)[:-1]
    buffer = {k: [] for k in ("images", "image_mask", "tokens", "token_mask", "actions")}
    shard_index = 0
    total = 0

    def flush():
        nonlocal shard_index
        if not buffer["images"]:
            return
        arrays = {k: np.stack(v) for k, v in buffer.items()}
        write_safetensors(os.path.join(args.out, f"shard-{shard_index:05d}.safetensors"), arrays,
                          {"format": "fp8wire-libero-v1", "source": os.path.abspath(args.dataset)})
        shard_index += 1
        for v in buffer.values():
            v.clear()

    for path in files:
        table = pq.read_table(path).to_pydict()
        missing = [c for c in cameras + [args.state_key, args.action_key] if c not in table]
        if missing:
            fail(f"{path}: no column(s) {missing}; columns are {sorted(table)} (see --cameras/--state-key/--action-key)")
        state = normalise(np.asarray(table[args.state_key], np.float32), stats["state"])
        act = normalise(np.asarray(table[args.action_key], np.float32), stats["actions"])
        n = len(state)
        task_ids = table.get("task_index", [0] * n)
        for t in range(n):
            chunk = act[np.minimum(np.arange(t, t + args.horizon), n - 1)]
            text = tasks.get(int(task_ids[t]), "").strip().replace("_", " ").replace("\n", " ")
            discrete = np.digitize(np.clip(state[t], -1, 1), bins) - 1
            prompt = f"Task: {text}, State: {' '.join(map(str, discrete))};\nAction: "
            ids = tokenizer.encode(prompt, add_bos=True) if tokenizer else [b + 1 for b in prompt.encode()]
            ids = ids[:args.max_token_len]
            tokens = np.zeros(args.max_token_len, np.int32)
            tokens[:len(ids)] = ids
            mask = np.zeros(args.max_token_len, bool)
            mask[:len(ids)] = True
            buffer["images"].append(np.stack([decode_image(table[c][t], args.camera_size) for c in cameras]))
            buffer["image_mask"].append(np.ones(len(cameras), bool))
            buffer["tokens"].append(tokens)
            buffer["token_mask"].append(mask)
            buffer["actions"].append(chunk.astype(np.float32))
            total += 1
            if len(buffer["images"]) == args.samples_per_shard:
                flush()
    flush()
    print(f"convert_lerobot_libero: {total} samples from {len(files)} episode file(s) -> {shard_index} shard(s) in "
          f"{args.out}; set data.source=\"shards\", data.shard_dir, data.num_images={len(cameras)}, "
          f"data.raw_action_dim={raw_action_dim}, data.max_token_len={args.max_token_len}")


if __name__ == "__main__":
    main()
