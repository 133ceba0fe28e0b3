#!/usr/bin/env python3
"""torch.distributed point-to-point traffic under fp8wire (N ranks on one GPU, emulated hosts): uneven
all_to_all_single (a group of one ncclSend and one ncclRecv per peer), batch_isend_irecv and
dist.send / dist.recv, which the shim carries in FP8 where collectives.send_recv says so.

Two runs of the same worker:
  1. plain: no LD_PRELOAD, NCCL's own send / recv (exact: the senders' messages);
  2. fp8wire: LD_PRELOAD=libfp8wire.so, FP8WIRE_COLLECTIVES_SEND_RECV=1, thresholds 0.
Checks on every rank:
  * uneven all_to_all_single (bf16, fp32; 1 .. 70001 elements, a count per sender and receiver, 1000
    and 4097 among them, one chunk empty): every message from another rank within one quantization of
    the plain one (|fp8 - plain| <= amax/28 of its 128-element block, blocks counted from the message's
    start, plus the dtype's rounding), the rank's own chunk and the whole plain run bit for bit; run
    twice, the two fp8 results bitwise identical;
  * a batch_isend_irecv ring (bf16, 1 MiB; irecv listed first on even ranks, isend on odd) and a
    pipeline of dist.send / dist.recv, forward then back (fp16, 3 rounds): within one quantization;
  * int32 uneven all_to_all_single bit for bit (passes through);
  * fp8wire.totals(): FP8 calls on every rank, one per float send and per float receive to another
    rank and none for int32; no totals in the plain run.
Usage: send_recv_torch.py [--nproc 2] [--shim build/shim/libfp8wire.so] [--out DIR]"""
import os
import sys
import zlib

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "pylib"))
import emulated_launch  # noqa: E402
import verdict  # noqa: E402

FLOAT_DTYPES = ["bfloat16", "float32"]  # the uneven all-to-alls
SPLITS = [1000, 33, 4097, 70001, 1, 2500, 129]  # elements per (sender, receiver), see split()
REPEATS = 2  # each float uneven all-to-all, for the determinism check
RING_COUNT = (1 << 20) // 2  # bf16 elements of a 1 MiB message
RING_ROUNDS = 2  # the second round reuses what the first set up
PIPE_COUNTS = [4097, 65567, 1000]  # fp16 elements of round 0, 1, 2
EPS = {"bfloat16": 2.0 ** -8, "float16": 2.0 ** -11, "float32": 2.0 ** -24}
BLOCK = 128


def split(src, dst, world):
    """Elements rank src sends rank dst in the uneven all-to-alls: SPLITS walked over the pairs, so a
    rank's counts differ from peer to peer (sent and received alike, up to 4 ranks), and nothing from
    rank 0 to rank 1 (an empty chunk)."""
    if (src, dst) == (0, 1):
        return 0
    return SPLITS[(src * world + dst) % len(SPLITS)]


def message(tag, src, dst, n, dname):
    """The n elements rank src sends rank dst in call `tag`, made on the CPU so the parent can make
    them again. Floats: every 128-element block from the message's start its own magnitude, 2^-6 ..
    2^6, so a block misplaced on the wire shows; int32: arbitrary bit patterns."""
    import torch

    gen = torch.Generator().manual_seed(zlib.crc32(f"{tag}/{src}/{dst}".encode()))
    if dname == "int32":
        return torch.randint(-2 ** 31, 2 ** 31 - 1, (n,), generator=gen, dtype=torch.int32)
    x = torch.randn(n, generator=gen)
    exponent = (torch.arange(n) // BLOCK * 7 + src + dst) % 13 - 6
    return (x * torch.pow(2.0, exponent.double()).float()).to(getattr(torch, dname))


def receive_buffer(n, dname, dev):
    """NaN (ints: a pattern) where nothing arrives, so an element left unwritten shows."""
    import torch

    dtype = getattr(torch, dname)
    return torch.full((n,), float("nan") if dtype.is_floating_point else 0x5A5A5A5A, dtype=dtype, device=dev)


def uneven_all_to_all(dname, rank, world, dev):
    import torch
    import torch.distributed as dist

    send = [split(rank, d, world) for d in range(world)]
    recv = [split(s, rank, world) for s in range(world)]
    x = torch.cat([message(f"a2a/{dname}", rank, d, send[d], dname) for d in range(world)]).to(dev)
    out = receive_buffer(sum(recv), dname, dev)
    dist.all_to_all_single(out, x, output_split_sizes=recv, input_split_sizes=send)
    return out.cpu()


def ring(rnd, rank, world, dev):
    import torch.distributed as dist

    nxt, prv = (rank + 1) % world, (rank - 1) % world
    x = message(f"ring/{rnd}", rank, nxt, RING_COUNT, "bfloat16").to(dev)
    got = receive_buffer(RING_COUNT, "bfloat16", dev)
    ops = [dist.P2POp(dist.isend, x, nxt), dist.P2POp(dist.irecv, got, prv)]
    if rank % 2 == 0:
        ops.reverse()  # neighbours list their halves in opposite orders: the group must still match them
    for work in dist.batch_isend_irecv(ops):
        work.wait()
    return got.cpu()


def pipeline(rnd, rank, world, dev, outputs):
    import torch.distributed as dist

    n = PIPE_COUNTS[rnd]
    if rank > 0:
        got = receive_buffer(n, "float16", dev)
        dist.recv(got, src=rank - 1)
        outputs[f"pipe/{rnd}/act"] = got.cpu()
    if rank < world - 1:
        act = message(f"pipe/{rnd}/act", rank, rank + 1, n, "float16").to(dev)
        dist.send(act, dst=rank + 1)
        got = receive_buffer(n, "float16", dev)
        dist.recv(got, src=rank + 1)
        outputs[f"pipe/{rnd}/grad"] = got.cpu()
    if rank > 0:
        grad = message(f"pipe/{rnd}/grad", rank, rank - 1, n, "float16").to(dev)
        dist.send(grad, dst=rank - 1)


def worker(result_dir):
    import torch
    import torch.distributed as dist

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.cuda.set_device(0)
    dev = torch.device("cuda:0")
    dist.init_process_group("nccl", device_id=dev)
    outputs, fp8_calls = {}, {}

    def fp8_so_far():
        torch.cuda.synchronize()
        return emulated_launch.fp8_calls(emulated_launch.fp8wire_totals())

    # Totals around each case, not only at the end: they tell which case went FP8 (int32 must not).
    for i in range(REPEATS):
        for dname in FLOAT_DTYPES:
            key, before = f"a2a/{dname}/{i}", fp8_so_far()
            outputs[key] = uneven_all_to_all(dname, rank, world, dev)
            fp8_calls[key] = fp8_so_far() - before
    before = fp8_so_far()
    outputs["a2a/int32/0"] = uneven_all_to_all("int32", rank, world, dev)
    fp8_calls["a2a/int32/0"] = fp8_so_far() - before
    before = fp8_so_far()
    for rnd in range(RING_ROUNDS):
        outputs[f"ring/{rnd}"] = ring(rnd, rank, world, dev)
    fp8_calls["ring"] = fp8_so_far() - before
    before = fp8_so_far()
    for rnd in range(len(PIPE_COUNTS)):
        pipeline(rnd, rank, world, dev, outputs)
    fp8_calls["pipe"] = fp8_so_far() - before

    torch.cuda.synchronize()
    dist.barrier()
    torch.save(outputs, os.path.join(result_dir, f"rank{rank}.pt"))
    emulated_launch.write_result(result_dir, rank, {"rank": rank, "totals": emulated_launch.fp8wire_totals(),
                                                    "fp8_calls_by_case": fp8_calls})
    dist.destroy_process_group()


def output_keys(rank, world):
    keys = [f"a2a/{d}/{i}" for i in range(REPEATS) for d in FLOAT_DTYPES] + ["a2a/int32/0"]
    keys += [f"ring/{rnd}" for rnd in range(RING_ROUNDS)]
    for rnd in range(len(PIPE_COUNTS)):
        keys += [f"pipe/{rnd}/act"] * (rank > 0) + [f"pipe/{rnd}/grad"] * (rank < world - 1)
    return keys


def received_messages(key, rank, world):
    """[(sender, exact message)] that output `key` of `rank` holds, in order."""
    part = key.split("/")
    if part[0] == "a2a":
        return [(s, message(f"a2a/{part[1]}", s, rank, split(s, rank, world), part[1])) for s in range(world)]
    if part[0] == "ring":
        prv = (rank - 1) % world
        return [(prv, message(key, prv, rank, RING_COUNT, "bfloat16"))]
    src = rank - 1 if part[2] == "act" else rank + 1
    return [(src, message(key, src, rank, PIPE_COUNTS[int(part[1])], "float16"))]


def bitwise_equal(a, b):
    import torch

    # Bytes, not values: -0.0 == 0.0 and NaN != NaN would hide or invent differences.
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.view(torch.uint8), b.view(torch.uint8))


def quantization_ratio(want, got, dname):
    """max |got - want| / bound of one message, blocks counted from its start (inf when not finite)."""
    import torch

    n = want.numel()
    w, g = want.double(), got.double()
    if not torch.isfinite(g).all():
        return float("inf")
    padded = torch.nn.functional.pad(w.abs(), (0, (-n) % BLOCK))
    amax = padded.view(-1, BLOCK).amax(dim=1).repeat_interleave(BLOCK)[:n]
    bound = amax / 28.0 * 1.0001 + w.abs() * EPS[dname] * 1.01 + 1e-30
    return ((g - w).abs() / bound).max().item()


def compare(key, plain, fp8, rank, world):
    """(worst err/bound, failures) of output `key` on one rank: the plain run holds the senders'
    messages bit for bit; the fp8 run those of other ranks within one quantization of the plain
    ones (ints bit for bit), the rank's own bit for bit."""
    if key not in plain or key not in fp8:
        return 0.0, [f"{key}: not saved by the {'plain' if key not in plain else 'fp8'} run"]
    worst, failures, at = 0.0, [], 0
    for src, exact in received_messages(key, rank, world):
        n = exact.numel()
        want, got = plain[key][at:at + n], fp8[key][at:at + n]
        at += n
        if not bitwise_equal(want, exact):
            failures.append(f"{key} from rank {src}: the plain run is not the sender's message")
            continue
        if src == rank or not exact.dtype.is_floating_point:
            if not bitwise_equal(got, want):
                failures.append(f"{key} from rank {src}: not bit for bit")
            continue
        if n == 0:
            continue
        ratio = quantization_ratio(want, got, str(exact.dtype).removeprefix("torch."))
        worst = max(worst, ratio)
        if ratio > 1.0:
            failures.append(f"{key} from rank {src}: err/bound {ratio:.3f}")
    if plain[key].numel() != at or fp8[key].numel() != at:
        failures.append(f"{key}: {plain[key].numel()} (plain) / {fp8[key].numel()} (fp8) elements, not {at}")
    return worst, failures


def expected_fp8_calls(rank, world):
    """FP8 calls per case on `rank`: one per send and one per receive of a float message to or from
    another rank; the own chunk, the empty chunk and int32 not."""
    sends = sum(1 for d in range(world) if d != rank and split(rank, d, world) > 0)
    recvs = sum(1 for s in range(world) if s != rank and split(s, rank, world) > 0)
    calls = {f"a2a/{d}/{i}": sends + recvs for i in range(REPEATS) for d in FLOAT_DTYPES}
    calls["a2a/int32/0"] = 0
    calls["ring"] = 2 * RING_ROUNDS
    calls["pipe"] = 2 * len(PIPE_COUNTS) * ((rank > 0) + (rank < world - 1))
    return calls


def main():
    parser = emulated_launch.script_parser()
    args, title, status = verdict.start(parser, "send_recv_torch", lambda a: worker(a.worker))
    if status is not None:
        return status
    if args.nproc < 2:
        parser.error("--nproc: point-to-point needs 2 ranks or more")
    import tempfile

    import torch

    out = args.out or tempfile.mkdtemp(prefix="fp8wire_p2p_")
    # Each rank's outputs (rank<r>.pt) land in its run's folder, beside its result.
    runs, checks, dirs = emulated_launch.plain_and_fp8(__file__, args.nproc, args.shim, "send_recv", out, "p2p")
    results = {name: {r["rank"]: r for r in res} for name, res in runs.items()}
    if all(ok for _, ok, _ in checks):
        titles = {"a2a": "uneven all_to_all_single (bf16, fp32): within one quantization, own chunk and plain run "
                         "exact",
                  "ring": f"batch_isend_irecv ring (bf16, 1 MiB, opposite orders, {RING_ROUNDS} rounds): within one "
                          "quantization, plain run exact",
                  "pipe": f"dist.send / dist.recv pipeline (fp16, {len(PIPE_COUNTS)} rounds, forward and back): "
                          "within one quantization, plain run exact",
                  "int32": "int32 uneven all_to_all_single bit for bit (passes through)"}
        worst, failures = dict.fromkeys(titles, 0.0), {case: [] for case in titles}
        repeat_failures = []
        for r in range(args.nproc):
            plain = torch.load(os.path.join(dirs["plain"], f"rank{r}.pt"))
            fp8 = torch.load(os.path.join(dirs["fp8"], f"rank{r}.pt"))
            for key in output_keys(r, args.nproc):
                case = "int32" if key.startswith("a2a/int32") else key.split("/")[0]
                w, f = compare(key, plain, fp8, r, args.nproc)
                worst[case] = max(worst[case], w)
                failures[case] += [f"rank {r}: {x}" for x in f]
            for dname in FLOAT_DTYPES:
                first, again = fp8.get(f"a2a/{dname}/0"), fp8.get(f"a2a/{dname}/1")
                if first is None or again is None or not bitwise_equal(first, again):
                    repeat_failures.append(f"rank {r}: {dname} differs")
        for case, name in titles.items():
            detail = [f"err/bound {worst[case]:.3f}"] if case != "int32" else []
            if failures[case]:
                detail.append(f"{len(failures[case])} failures, first: {failures[case][0]}")
            checks.append((name, not failures[case], "; ".join(detail)))
        checks.append(("uneven all_to_all_single twice under fp8wire: bitwise identical on every rank",
                       not repeat_failures, "; ".join(repeat_failures[:2])))
        fp8_totals = {r: results["fp8"][r]["totals"] for r in range(args.nproc)}
        by_rank = [emulated_launch.fp8_calls(fp8_totals[r]) for r in range(args.nproc)]
        plain_totals = [results["plain"][r]["totals"] for r in range(args.nproc)]
        checks.append(("fp8wire.totals(): FP8 calls on every rank, no totals in the plain run",
                       all(n > 0 for n in by_rank) and all(t is None for t in plain_totals),
                       f"fp8 calls by rank {by_rank}, rank 0 calls {(fp8_totals[0] or {}).get('calls')}"))
        wrong = []
        for r in range(args.nproc):
            want, got = expected_fp8_calls(r, args.nproc), results["fp8"][r].get("fp8_calls_by_case", {})
            wrong += [f"rank {r} {case}: {got.get(case)}, not {n}" for case, n in want.items() if got.get(case) != n]
        name = "fp8wire.totals(): one FP8 call per float send and per float receive to another rank, none for int32"
        checks.append((name, not wrong, f"{len(wrong)} wrong, first: {wrong[0]}" if wrong else ""))
    return verdict.report(title, checks)


if __name__ == "__main__":
    sys.exit(main())
