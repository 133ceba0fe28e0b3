#!/usr/bin/env python3
"""DeepSpeed ZeRO under fp8wire: the student MLP in bf16 with ZeRO stage 1, 2 or 3, overlap_comm on,
and torch's own AdamW as the client optimizer (so no DeepSpeed op has to be compiled). Stages 1 and 2
all-reduce gradient buckets (use_multi_rank_bucket_allreduce), stage 3 reduce-scatters them; all
in bf16. Plain NCCL vs libfp8wire.so, same seed and data (harness.py judges the pair). Full
parameters at the end: the module's bf16 copies (stage 3: inside GatheredParameters).

    test_deepspeed.py --stage 1|2|3 [--steps 120] [--out DIR]"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402


def ds_config(stage, micro_batch):
    return {
        "train_micro_batch_size_per_gpu": micro_batch,
        "gradient_accumulation_steps": 1,
        "bf16": {"enabled": True},
        "zero_optimization": {
            "stage": stage,
            "overlap_comm": True,
            "contiguous_gradients": True,
            # Buckets of a few layers, so one step makes several collectives.
            "reduce_bucket_size": 600_000,
            "allgather_bucket_size": 600_000,
            **({"stage3_prefetch_bucket_size": 600_000, "stage3_param_persistence_threshold": 0}
               if stage == 3 else {}),
        },
        "zero_allow_untested_optimizer": True,
        "gradient_clipping": 0.0,
        "steps_per_print": 1_000_000,
        "wall_clock_breakdown": False,
    }


def worker(args):
    import deepspeed
    import torch

    import model as m

    ctx = harness.init(args, init_process_group=False)
    deepspeed.init_distributed(dist_backend=ctx.backend, auto_mpi_discovery=False)
    net = m.make_model()
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3, weight_decay=0.0)
    engine, _, _, _ = deepspeed.initialize(model=net, optimizer=opt, config=ds_config(args.stage, m.BATCH))
    data = m.Data(ctx.rank, ctx.device)
    losses = []
    for _ in range(args.steps):
        x, y = data.batch()
        loss = m.mse(engine(x.to(torch.bfloat16)), y)
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    engine.eval()
    with torch.no_grad():
        xe, ye = data.held_out()
        eval_loss = m.mse(engine(xe.to(torch.bfloat16)), ye).item()
    params = list(engine.module.parameters())
    if args.stage == 3:
        with deepspeed.zero.GatheredParameters(params):
            sha = harness.digest(params)
    else:
        sha = harness.digest(params)
    harness.finish(ctx, args, losses, eval_loss, sha)


def main():
    ap = harness.parser(__doc__)
    ap.add_argument("--stage", type=int, choices=[1, 2, 3], required=True)
    args = ap.parse_args()
    if args.worker:
        worker(args)
        return 0
    name = f"deepspeed_zero{args.stage}"
    stop = harness.preflight(name, args, needs=("deepspeed",))
    if stop is not None:
        return stop
    return harness.run_pair(name, os.path.abspath(__file__), args, 2, ["--stage", str(args.stage)])


if __name__ == "__main__":
    sys.exit(main())
