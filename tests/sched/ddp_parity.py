#!/usr/bin/env python3
"""DDP parity under fp8wire: a small model built in code, N ranks on one GPU (emulated hosts), 200
steps, run once with plain NCCL and once with LD_PRELOAD=libfp8wire.so and thresholds at 0 so every
gradient all-reduce goes FP8. Checks:
  * with the shim, FP8 all-reduces actually ran (fp8wire_get_totals);
  * parameters bitwise identical across ranks at the end (both runs);
  * final evaluation loss within 1 % of the plain run.
Usage: ddp_parity.py [--nproc 2] [--steps 200] [--shim build/shim/libfp8wire.so] [--out DIR]"""
import hashlib
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "pylib"))
import verdict  # noqa: E402
import emulated_launch  # noqa: E402


def worker(result_dir, steps):
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    rank = int(os.environ["RANK"])
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", device_id=torch.device("cuda:0"))
    dev = torch.device("cuda:0")
    torch.manual_seed(1234)  # same initial weights everywhere (DDP broadcasts them anyway)
    model = torch.nn.Sequential(torch.nn.Linear(32, 256), torch.nn.GELU(), torch.nn.Linear(256, 256),
                                torch.nn.GELU(), torch.nn.Linear(256, 8)).to(dev)
    teacher = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(), torch.nn.Linear(64, 8)).to(dev)
    ddp = DDP(model, device_ids=[0])
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, steps)
    gen = torch.Generator(device=dev)
    gen.manual_seed(100 + rank)  # each rank its own data shard
    with torch.no_grad():
        x_eval = torch.randn(4096, 32, device=dev, generator=torch.Generator(device=dev).manual_seed(7))
        y_eval = teacher(x_eval)
    for _ in range(steps):
        x = torch.randn(256, 32, device=dev, generator=gen)
        with torch.no_grad():
            y = teacher(x)
        loss = torch.nn.functional.mse_loss(ddp(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
    with torch.no_grad():
        eval_loss = torch.nn.functional.mse_loss(model(x_eval), y_eval).item()
    torch.cuda.synchronize()
    digest = hashlib.sha256()
    for p in model.parameters():
        digest.update(p.detach().cpu().contiguous().numpy().tobytes())
    result = {"rank": rank, "eval_loss": eval_loss, "param_sha256": digest.hexdigest(),
              "totals": emulated_launch.fp8wire_totals()}
    emulated_launch.write_result(result_dir, rank, result)
    dist.destroy_process_group()


def main():
    ap = emulated_launch.script_parser()
    ap.add_argument("--steps", type=int, default=200)
    args, title, status = verdict.start(ap, "ddp_parity", lambda a: worker(a.worker, a.steps))
    if status is not None:
        return status
    wargs = ["--steps", str(args.steps)]
    # Each run is bounded below sched.sh's outer timeout, so a hang still prints the ranks' log tails.
    ok_plain, plain = emulated_launch.launch(__file__, args.nproc, {}, wargs, timeout_s=55, log_dir=args.out,
                                             tag=f"ddp_plain_n{args.nproc}")
    fp8_env = {"LD_PRELOAD": os.path.abspath(args.shim),
               "FP8WIRE_THRESHOLDS_ALL_REDUCE_NET": "0", "FP8WIRE_THRESHOLDS_ALL_REDUCE_PCIE": "0",
               "FP8WIRE_THRESHOLDS_ALL_REDUCE_NVLINK": "0", "FP8WIRE_LOG_LEVEL": "info"}
    ok_fp8, fp8 = emulated_launch.launch(__file__, args.nproc, fp8_env, wargs, timeout_s=55, log_dir=args.out,
                                         tag=f"ddp_fp8_n{args.nproc}")
    checks = [("plain run completed", ok_plain and len(plain) == args.nproc, ""),
              ("fp8 run completed", ok_fp8 and len(fp8) == args.nproc, "")]
    if ok_plain and ok_fp8 and plain and fp8:
        fp8_calls = emulated_launch.fp8_calls(fp8[0]["totals"])
        checks.append(("FP8 all-reduces ran under the shim", fp8_calls > 0, f"fp8 calls {fp8_calls}"))
        checks.append(("plain: params identical across ranks", len({r["param_sha256"] for r in plain}) == 1, ""))
        checks.append(("fp8: params bitwise identical across ranks",
                       len({r["param_sha256"] for r in fp8}) == 1, fp8[0]["param_sha256"][:16]))
        lp, lf = plain[0]["eval_loss"], fp8[0]["eval_loss"]
        rel = abs(lf - lp) / abs(lp)
        checks.append(("final loss within 1% of plain NCCL", rel <= 0.01,
                       f"plain {lp:.6g} fp8 {lf:.6g} rel {rel * 100:.3f}%"))
    return verdict.report(title, checks)


if __name__ == "__main__":
    sys.exit(main())
