#!/usr/bin/env python3
"""FSDP2 (fully_shard) under fp8wire: the student MLP, each Linear its own FSDP unit, bf16 parameters
and gradients reduced in fp32 or bf16 (MixedPrecisionPolicy.reduce_dtype), AdamW with a cosine
schedule; with --hsdp a 2-D mesh (replicate x shard = 2 x 2: reduce-scatter inside a shard group,
all-reduce across the replicas). Plain NCCL vs libfp8wire.so, same seed and data (harness.py).
Full parameters at the end: DTensor.full_tensor() on every rank (under HSDP it gathers only within
the shard group, so equal digests also show the replicas stayed in sync).

    test_fsdp2.py --reduce-dtype fp32|bf16 [--hsdp] [--steps 120] [--out DIR]"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402


def worker(args):
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    import model as m

    ctx = harness.init(args)
    if args.hsdp:
        mesh = init_device_mesh(ctx.device.type, (2, ctx.world // 2), mesh_dim_names=("replicate", "shard"))
    else:
        mesh = init_device_mesh(ctx.device.type, (ctx.world,))
    reduce_dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[args.reduce_dtype]
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=reduce_dtype)
    net = m.make_model().to(ctx.device)
    for layer in net:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh, mp_policy=mp)
    fully_shard(net, mesh=mesh, mp_policy=mp)
    opt = torch.optim.AdamW(net.parameters(), lr=2e-3, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, args.steps)
    data = m.Data(ctx.rank, ctx.device)
    losses = m.train(net, opt, sched, data, args.steps)
    with torch.no_grad():
        xe, ye = data.held_out()
        eval_loss = m.mse(net(xe), ye).item()
    full = [p.full_tensor() for p in net.parameters()]
    harness.finish(ctx, args, losses, eval_loss, harness.digest(full))


def main():
    ap = harness.parser(__doc__)
    ap.add_argument("--reduce-dtype", choices=["fp32", "bf16"], default="fp32")
    ap.add_argument("--hsdp", action="store_true", help="2-D mesh, 4 ranks")
    ap.add_argument("--nproc", type=int, default=0, help="ranks (default 2, or 4 with --hsdp)")
    args = ap.parse_args()
    if args.worker:
        worker(args)
        return 0
    nproc = args.nproc or (4 if args.hsdp else 2)
    name = "hsdp" if args.hsdp else f"fsdp2_reduce_{args.reduce_dtype}" + (f"_n{nproc}" if args.nproc else "")
    stop = harness.preflight(name, args)
    if stop is not None:
        return stop
    wargs = ["--reduce-dtype", args.reduce_dtype] + (["--hsdp"] if args.hsdp else [])
    return harness.run_pair(name, os.path.abspath(__file__), args, nproc, wargs)


if __name__ == "__main__":
    sys.exit(main())
