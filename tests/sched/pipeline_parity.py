#!/usr/bin/env python3
"""A two-stage pipeline-parallel job trained under fp8wire (N ranks on one GPU, emulated hosts, N even:
ranks 2k and 2k+1 form one pipeline, each with its own data). Each step runs 4 micro-batches
GPipe-style: stage 0 sends its activations (bf16) forward by dist.send, stage 1 sends their gradients
(bf16) back; PyTorch carries these over a two-rank communicator per pair (ncclSend / ncclRecv).

Two runs of the same worker, same seeds and data:
  1. plain: NCCL alone;
  2. fp8: LD_PRELOAD=libfp8wire.so, FP8WIRE_COLLECTIVES_SEND_RECV=1, thresholds 0 (activations and
     their gradients FP8).
Checks: both runs complete; FP8 messages ran on every rank (none in the plain run); each pipeline's
training-loss curve against plain NCCL as the main job judges loss parity (scripts/loss_parity.py:
Pearson >= 0.99, mean relative error <= 0.02); the final evaluation loss within 2 % of the plain run's.
Usage: pipeline_parity.py [--nproc 2] [--steps 300] [--shim build/shim/libfp8wire.so] [--out DIR]"""
import os
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "pylib"))
import emulated_launch  # noqa: E402
import verdict  # noqa: E402

MICRO_BATCHES, MICRO_BATCH = 4, 64
IN, WIDTH, OUT = 32, 256, 8
NOISE = 0.1


def worker(result_dir, steps):
    import torch
    import torch.distributed as dist

    rank = int(os.environ["RANK"])
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", device_id=torch.device("cuda:0"))
    dev = torch.device("cuda:0")
    stage, pipeline = rank % 2, rank // 2
    peer = rank + 1 if stage == 0 else rank - 1
    torch.manual_seed(1234)  # both stages build both halves alike, then keep their own
    first = torch.nn.Sequential(torch.nn.Linear(IN, WIDTH), torch.nn.GELU(), torch.nn.Linear(WIDTH, WIDTH),
                                torch.nn.GELU()).to(dev)
    second = torch.nn.Sequential(torch.nn.Linear(WIDTH, WIDTH), torch.nn.GELU(), torch.nn.Linear(WIDTH, OUT)).to(dev)
    teacher = torch.nn.Sequential(torch.nn.Linear(IN, 64), torch.nn.Tanh(), torch.nn.Linear(64, OUT)).to(dev)
    model = first if stage == 0 else second
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    gen = torch.Generator(device=dev).manual_seed(100 + pipeline)  # both stages draw the same batches
    x_eval = torch.randn(2048, IN, device=dev, generator=torch.Generator(device=dev).manual_seed(7 + pipeline))

    def batch():
        x = torch.randn(MICRO_BATCH, IN, device=dev, generator=gen)
        with torch.no_grad():  # a noisy target: the loss levels out where real training's does
            y = teacher(x) + NOISE * torch.randn(MICRO_BATCH, OUT, device=dev, generator=gen)
        return x, y

    losses = []
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        micro = [batch() for _ in range(MICRO_BATCHES)]
        if stage == 0:
            kept = []
            for x, _ in micro:  # forward: every micro-batch's activations to stage 1
                act = model(x)
                dist.send(act.detach().to(torch.bfloat16), peer)
                kept.append(act)
            for act in kept:  # backward: their gradients from stage 1
                grad = torch.empty(act.shape, dtype=torch.bfloat16, device=dev)
                dist.recv(grad, peer)
                act.backward(grad.float())
            step_loss = 0.0
        else:
            inputs, step_loss = [], 0.0
            for _, y in micro:
                act = torch.empty(MICRO_BATCH, WIDTH, dtype=torch.bfloat16, device=dev)
                dist.recv(act, peer)
                inputs.append((act.float().requires_grad_(), y))
            for act, y in inputs:
                loss = torch.nn.functional.mse_loss(model(act), y) / MICRO_BATCHES
                loss.backward()
                step_loss += loss.item()
                dist.send(act.grad.to(torch.bfloat16), peer)
        opt.step()
        losses.append(step_loss)
    # Evaluation through both stages, one forward message.
    with torch.no_grad():
        if stage == 0:
            dist.send(model(x_eval).to(torch.bfloat16), peer)
            eval_loss = None
        else:
            act = torch.empty(x_eval.shape[0], WIDTH, dtype=torch.bfloat16, device=dev)
            dist.recv(act, peer)
            eval_loss = torch.nn.functional.mse_loss(model(act.float()), teacher(x_eval)).item()
    torch.cuda.synchronize()
    if stage == 1:
        verdict.write_loss_log(os.path.join(result_dir, f"train_log.pipeline{pipeline}.jsonl"), losses)
    emulated_launch.write_result(result_dir, rank, {"rank": rank, "eval_loss": eval_loss,
                                                    "totals": emulated_launch.fp8wire_totals()})
    dist.destroy_process_group()


def main():
    ap = emulated_launch.script_parser()
    ap.add_argument("--steps", type=int, default=300)
    args, title, status = verdict.start(ap, "pipeline_parity", lambda a: worker(a.worker, a.steps))
    if status is not None:
        return status
    if args.nproc < 2 or args.nproc % 2:
        ap.error(f"--nproc must be even (two stages per pipeline), got {args.nproc}")
    out = args.out or tempfile.mkdtemp(prefix="fp8wire_pipeline_")
    results, checks, dirs = emulated_launch.plain_and_fp8(__file__, args.nproc, args.shim, "send_recv", out,
                                                          "pipeline", timeout_s=150, args=["--steps", str(args.steps)])
    if all(ok for _, ok, _ in checks):
        calls = [emulated_launch.fp8_calls(r["totals"]) for r in results["fp8"]]
        plain_calls = sum(emulated_launch.fp8_calls(r["totals"]) for r in results["plain"])
        checks.append(("FP8 messages ran on every rank, none in the plain run",
                       plain_calls == 0 and min(calls) > 0, f"per rank {calls}"))
        for p in range(args.nproc // 2):
            log = f"train_log.pipeline{p}.jsonl"
            ok, line = verdict.loss_parity(os.path.join(dirs["plain"], log), os.path.join(dirs["fp8"], log))
            checks.append((f"pipeline {p}: training loss against plain NCCL", ok, line))
            checks.append(verdict.eval_loss_check(f"pipeline {p}", results["plain"][2 * p + 1]["eval_loss"],
                                                  results["fp8"][2 * p + 1]["eval_loss"]))
    return verdict.report(title, checks)


if __name__ == "__main__":
    sys.exit(main())
