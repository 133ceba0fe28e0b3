#!/usr/bin/env python3
"""An expert-parallel mixture-of-experts layer trained under fp8wire (N ranks on one GPU, emulated
hosts): 2 experts per rank, top-1 routing, the tokens' dispatch and combine by uneven
all_to_all_single (a group of one ncclSend and one ncclRecv per peer, in bf16), forward and backward.

Three runs of the same worker, same seeds and data:
  1. plain: NCCL alone;
  2. fp8: LD_PRELOAD=libfp8wire.so, FP8WIRE_COLLECTIVES_SEND_RECV=1, thresholds 0 (dispatch, combine
     and their gradients all FP8);
  3. fp8, combine exact: as 2, but the combine (and its gradient) sends its bf16 bytes as uint8, which
     the library passes through untouched: how an application keeps one call in full precision (as
     DeepEP keeps its combine in bf16).
Checks: every run completes; FP8 messages ran in 2 and fewer in 3; the training-loss curves of 2 and 3
against 1 as the main job judges loss parity (scripts/loss_parity.py: Pearson >= 0.99, mean relative
error <= 0.02); the final evaluation loss of each within 2 % of the plain run's.
Usage: moe_parity.py [--nproc 2] [--steps 300] [--shim build/shim/libfp8wire.so] [--out DIR]"""
import argparse
import os
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "pylib"))
import emulated_launch  # noqa: E402
import verdict  # noqa: E402

EXPERTS_PER_RANK = 2
TOKENS = 256      # per rank and step
DIM, HIDDEN, IN, OUT = 64, 128, 16, 4
NOISE = 0.1


def make_all_to_all(torch, dist):
    """A differentiable uneven all-to-all over rows. `exact`: the bytes go as uint8, which
    fp8wire passes through, so the call stays in full precision under the library."""

    class AllToAll(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, out_splits, in_splits, exact):
            ctx.splits, ctx.exact = (out_splits, in_splits), exact
            return exchange(x, out_splits, in_splits, exact)

        @staticmethod
        def backward(ctx, grad):
            out_splits, in_splits = ctx.splits
            return exchange(grad, in_splits, out_splits, ctx.exact), None, None, None

    def exchange(x, out_splits, in_splits, exact):
        x = x.contiguous()
        out = x.new_empty((sum(out_splits),) + tuple(x.shape[1:]))
        if exact:
            dist.all_to_all_single(out.view(torch.uint8), x.view(torch.uint8), out_splits, in_splits)
        else:
            dist.all_to_all_single(out, x, out_splits, in_splits)
        return out

    return AllToAll.apply


def worker(result_dir, steps, exact_combine):
    import torch
    import torch.distributed as dist

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", device_id=torch.device("cuda:0"))
    dev = torch.device("cuda:0")
    all_to_all = make_all_to_all(torch, dist)
    n_experts = EXPERTS_PER_RANK * world

    torch.manual_seed(1234)  # the replicated parts: the same initial weights on every rank
    embed = torch.nn.Linear(IN, DIM).to(dev)
    router = torch.nn.Linear(DIM, n_experts).to(dev)
    head = torch.nn.Linear(DIM, OUT).to(dev)
    teacher = torch.nn.Sequential(torch.nn.Linear(IN, 64), torch.nn.Tanh(), torch.nn.Linear(64, OUT)).to(dev)
    experts = torch.nn.ModuleList()
    for j in range(EXPERTS_PER_RANK):  # this rank's experts, each seeded by its global number
        torch.manual_seed(5000 + rank * EXPERTS_PER_RANK + j)
        experts.append(torch.nn.Sequential(torch.nn.Linear(DIM, HIDDEN), torch.nn.GELU(),
                                           torch.nn.Linear(HIDDEN, DIM)).to(dev))
    replicated = list(embed.parameters()) + list(router.parameters()) + list(head.parameters())
    params = replicated + list(experts.parameters())
    opt = torch.optim.Adam(params, lr=2e-3)

    def forward(x):
        h = embed(x)
        probs = torch.softmax(router(h), dim=-1)
        gate, expert = probs.max(dim=-1)
        order = torch.argsort(expert, stable=True)
        counts = torch.bincount(expert, minlength=n_experts)  # tokens this rank sends each expert
        recv_counts = torch.empty_like(counts)  # int64: passes through the library
        dist.all_to_all_single(recv_counts, counts)
        send_splits = counts.view(world, EXPERTS_PER_RANK).sum(1).tolist()
        recv_splits = recv_counts.view(world, EXPERTS_PER_RANK).sum(1).tolist()
        tokens = all_to_all(h[order].to(torch.bfloat16), recv_splits, send_splits, False)
        # Received rows: by source rank, within each by this rank's expert.
        pieces = torch.split(tokens.float(), recv_counts.tolist())
        outputs = torch.cat([experts[i % EXPERTS_PER_RANK](p) for i, p in enumerate(pieces)])
        back = all_to_all(outputs.to(torch.bfloat16), send_splits, recv_splits, exact_combine).float()
        combined = back[torch.argsort(order)]
        return head(h + gate.unsqueeze(1) * combined)

    gen = torch.Generator(device=dev).manual_seed(100 + rank)  # each rank its own data
    eval_gen = torch.Generator(device=dev).manual_seed(7 + rank)
    x_eval = torch.randn(2048, IN, device=dev, generator=eval_gen)
    losses = []
    for step in range(steps):
        x = torch.randn(TOKENS, IN, device=dev, generator=gen)
        with torch.no_grad():  # a noisy target: the loss levels out where real training's does
            y = teacher(x) + NOISE * torch.randn(TOKENS, OUT, device=dev, generator=gen)
        loss = torch.nn.functional.mse_loss(forward(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        # The replicated parts' gradients averaged over the ranks; the experts' scaled alike (each
        # rank's loss is its own tokens' mean).
        flat = torch.cat([p.grad.reshape(-1) for p in replicated])
        dist.all_reduce(flat)
        offset = 0
        for p in replicated:
            p.grad.copy_(flat[offset:offset + p.numel()].view_as(p) / world)
            offset += p.numel()
        for p in experts.parameters():
            p.grad.div_(world)
        opt.step()
        losses.append(loss.item())
    with torch.no_grad():
        eval_loss = torch.nn.functional.mse_loss(forward(x_eval), teacher(x_eval)).item()
    torch.cuda.synchronize()
    if rank == 0:
        verdict.write_loss_log(os.path.join(result_dir, "train_log.jsonl"), losses)
    emulated_launch.write_result(result_dir, rank, {"rank": rank, "eval_loss": eval_loss,
                                                    "totals": emulated_launch.fp8wire_totals()})
    dist.destroy_process_group()


def main():
    ap = emulated_launch.script_parser()
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--exact-combine", action="store_true", help=argparse.SUPPRESS)
    args, title, status = verdict.start(ap, "moe_parity", lambda a: worker(a.worker, a.steps, a.exact_combine))
    if status is not None:
        return status
    out = args.out or tempfile.mkdtemp(prefix="fp8wire_moe_")
    exact = ("fp8_exact_combine", emulated_launch.fp8_env(args.shim, "send_recv"), ["--exact-combine"])
    results, checks, dirs = emulated_launch.plain_and_fp8(__file__, args.nproc, args.shim, "send_recv", out, "moe",
                                                          timeout_s=150, args=["--steps", str(args.steps)],
                                                          more_runs=[exact])
    if all(ok for _, ok, _ in checks):
        calls = {n: sum(emulated_launch.fp8_calls(r["totals"]) for r in res) for n, res in results.items()}
        checks.append(("FP8 messages ran, fewer with the combine exact",
                       calls["plain"] == 0 and calls["fp8"] > calls["fp8_exact_combine"] > 0,
                       f"fp8 {calls['fp8']}, combine exact {calls['fp8_exact_combine']}"))
        for name in ("fp8", "fp8_exact_combine"):
            ok, line = verdict.loss_parity(os.path.join(dirs["plain"], "train_log.jsonl"),
                                           os.path.join(dirs[name], "train_log.jsonl"))
            checks.append((f"{name}: training loss against plain NCCL", ok, line))
            checks.append(verdict.eval_loss_check(name, results["plain"][0]["eval_loss"], results[name][0]["eval_loss"]))
    return verdict.report(title, checks)


if __name__ == "__main__":
    sys.exit(main())
