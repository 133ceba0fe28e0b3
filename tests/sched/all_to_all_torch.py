#!/usr/bin/env python3
"""torch.distributed.all_to_all_single with equal splits under fp8wire (N ranks on one GPU, emulated
hosts). With equal splits PyTorch calls ncclAlltoAll, which the shim carries in FP8 where
collectives.all_to_all says so.

Two runs of the same worker (bf16, fp16 and fp32; 1, 1000, 4099 and 256 Ki elements per peer, every
128-element block its own magnitude; and an int32 call):
  1. plain: no LD_PRELOAD, NCCL's own all-to-all (exact: a permutation of the inputs);
  2. fp8wire: LD_PRELOAD=libfp8wire.so, FP8WIRE_COLLECTIVES_ALL_TO_ALL=1, thresholds 0.
Checks on every rank:
  * every float result within one quantization of the plain one: |fp8 - plain| <= amax/28 of its
    block (blocks of each received chunk's own, e4m3 with fp32 scales: half a step of the top binade,
    16/448 of the amax) plus the dtype's rounding; the rank's own chunk bit for bit;
  * the int32 result bit for bit the plain one (it passes through);
  * fp8wire.totals(): every float call carried in FP8 (path one_shot, "one exchange") and none of
    anything else, and its telemetry named "all_to_all/one_shot".
Usage: all_to_all_torch.py [--nproc 2] [--shim build/shim/libfp8wire.so] [--out DIR]"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "pylib"))
import emulated_launch  # noqa: E402
import verdict  # noqa: E402

COUNTS = [1, 1000, 4099, 1 << 18]  # elements per peer
DTYPES = ["bfloat16", "float16", "float32"]
EPS = {"bfloat16": 2.0 ** -8, "float16": 2.0 ** -11, "float32": 2.0 ** -24}
BLOCK = 128


def worker(result_dir):
    import torch
    import torch.distributed as dist

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.cuda.set_device(0)
    dev = torch.device("cuda:0")
    dist.init_process_group("nccl", device_id=dev)
    outputs = {}
    for dname in DTYPES:
        dtype = getattr(torch, dname)
        for n in COUNTS:
            gen = torch.Generator().manual_seed(1000 * rank + n)
            x = torch.randn(n * world, generator=gen)
            # A magnitude per 128-element block of the send buffer, 2^-6 .. 2^6.
            exponent = (torch.arange(n * world) // BLOCK * 7 + rank) % 13 - 6
            x = (x * torch.pow(2.0, exponent.double()).float()).to(dtype).to(dev)
            out = torch.empty_like(x)
            dist.all_to_all_single(out, x)
            outputs[f"{dname}/{n}"] = out.cpu()
    ints = torch.arange(4099 * world, dtype=torch.int32, device=dev) + 1000000 * rank
    out = torch.empty_like(ints)
    dist.all_to_all_single(out, ints)
    outputs["int32/4099"] = out.cpu()
    torch.cuda.synchronize()
    dist.barrier()
    torch.save(outputs, os.path.join(result_dir, f"rank{rank}.pt"))
    emulated_launch.write_result(result_dir, rank, {"rank": rank, "totals": emulated_launch.fp8wire_totals()})
    dist.destroy_process_group()


def compare(plain, fp8, rank, world):
    """(worst err/bound over the float calls, failures) for one rank's outputs."""
    import torch

    worst, failures = 0.0, []
    for key, want in plain.items():
        got = fp8[key]
        if key.startswith("int32"):
            if not torch.equal(got, want):
                failures.append(f"{key}: the int32 all-to-all is not NCCL's bit for bit")
            continue
        dname, n = key.split("/")[0], int(key.split("/")[1])
        if not torch.equal(got[rank * n:(rank + 1) * n], want[rank * n:(rank + 1) * n]):
            failures.append(f"{key}: the rank's own chunk is not exact")
        w, g = want.double(), got.double()
        if not torch.isfinite(g).all():
            failures.append(f"{key}: non-finite values")
            continue
        for j in range(world):
            if j == rank:
                continue
            chunk_w, chunk_g = w[j * n:(j + 1) * n], g[j * n:(j + 1) * n]
            padded = torch.nn.functional.pad(chunk_w.abs(), (0, (-n) % BLOCK))
            amax = padded.view(-1, BLOCK).amax(dim=1).repeat_interleave(BLOCK)[:n]
            bound = amax / 28.0 * 1.0001 + chunk_w.abs() * EPS[dname] * 1.01 + 1e-30
            ratio = ((chunk_g - chunk_w).abs() / bound).max().item()
            worst = max(worst, ratio)
            if ratio > 1.0:
                failures.append(f"{key}: chunk from rank {j}: err/bound {ratio:.3f}")
    return worst, failures


def main():
    args, title, status = verdict.start(emulated_launch.script_parser(), "all_to_all_torch", lambda a: worker(a.worker))
    if status is not None:
        return status
    import tempfile

    import torch

    out = args.out or tempfile.mkdtemp(prefix="fp8wire_a2a_")
    # Each rank's outputs (rank<r>.pt) land in its run's folder, beside its result.
    results, checks, dirs = emulated_launch.plain_and_fp8(__file__, args.nproc, args.shim, "all_to_all", out, "a2a")
    if all(ok for _, ok, _ in checks):
        float_calls = len(DTYPES) * len(COUNTS)
        for r in range(args.nproc):
            plain = torch.load(os.path.join(dirs["plain"], f"rank{r}.pt"))
            fp8 = torch.load(os.path.join(dirs["fp8"], f"rank{r}.pt"))
            worst, failures = compare(plain, fp8, r, args.nproc)
            checks.append((f"rank {r}: within one quantization, own chunk exact, int32 exact", not failures,
                           f"err/bound {worst:.3f}" + ("; " + failures[0] if failures else "")))
        totals = next(t["totals"] for t in results["fp8"] if t["rank"] == 0)
        calls = totals["calls"] if totals else {}
        checks.append(("fp8wire.totals(): every float all-to-all in FP8 (one_shot)",
                       calls.get("one_shot", 0) == float_calls and emulated_launch.fp8_calls(totals) == float_calls,
                       f"calls {calls}"))
        errors = totals.get("errors", {}) if totals else {}
        checks.append(("fp8wire.totals().errors names all_to_all/one_shot",
                       errors.get("all_to_all/one_shot", {}).get("measured_calls", 0) > 0, f"{sorted(errors)}"))
    return verdict.report(title, checks)


if __name__ == "__main__":
    sys.exit(main())
