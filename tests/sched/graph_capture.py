#!/usr/bin/env python3
"""CUDA-graph capture of dist.all_reduce under fp8wire (N ranks on one GPU, emulated hosts).
A first eager all-reduce lets the ranks agree (fp8wire never exchanges under capture); then a
torch.cuda.graph captures dist.all_reduce of a bf16 tensor and is replayed with new inputs. Checks:
  * every replay equals, bit for bit, an eager FP8 all-reduce of the same input;
  * the result is within the two-quantization bound of the exact sum (2/28 of the summed amax plus
    bf16 rounding);
  * ranks hold bitwise identical results; FP8 calls ran (fp8wire_get_totals).
Usage: graph_capture.py [--nproc 2] [--shim build/shim/libfp8wire.so] [--out DIR]"""
import argparse
import hashlib
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import emulated_launch  # noqa: E402


def worker(result_dir):
    import torch
    import torch.distributed as dist

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", device_id=torch.device("cuda:0"))
    dev = torch.device("cuda:0")
    n = (1 << 20) + 77

    def inputs(seed):
        g = torch.Generator(device=dev).manual_seed(seed)
        return [torch.randn(n, device=dev, generator=g).to(torch.bfloat16) for _ in range(world)]

    warm = inputs(0)[rank].clone()
    dist.all_reduce(warm)  # eager: the agreement exchange happens here, outside capture
    torch.cuda.synchronize()

    static = torch.zeros(n, device=dev, dtype=torch.bfloat16)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            dist.all_reduce(static)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        dist.all_reduce(static)
    torch.cuda.synchronize()

    checks = {"replay_equals_eager": True, "within_bound": True}
    worst = 0.0
    digest = hashlib.sha256()
    for replay in range(3):
        xs = inputs(10 + replay)
        static.copy_(xs[rank])
        graph.replay()
        eager = xs[rank].clone()
        dist.all_reduce(eager)
        torch.cuda.synchronize()
        checks["replay_equals_eager"] &= bool(torch.equal(static, eager))
        exact = torch.stack([x.double() for x in xs]).sum(0)
        # Per-element bound: 1/28 of each rank's block amax per quantization (two of them).
        pad = (-n) % 128
        amax = sum(torch.nn.functional.pad(x.double().abs(), (0, pad)).view(-1, 128).amax(1) for x in xs)
        amax = amax.repeat_interleave(128)[:n]
        bound = 2.0 / 28.0 * amax * 1.0001 + exact.abs() * 2.0 ** -8 * 1.01 + 1e-30
        err = (static.double() - exact).abs()
        worst = max(worst, (err / bound).max().item())
        checks["within_bound"] &= bool((err <= bound).all())
        digest.update(static.cpu().view(torch.int16).numpy().tobytes())
    emulated_launch.write_result(result_dir, rank, {"rank": rank, "checks": checks, "worst": worst,
                                                    "sha256": digest.hexdigest(),
                                                    "totals": emulated_launch.fp8wire_totals()})
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--shim", default="build/shim/libfp8wire.so")
    ap.add_argument("--out", default=os.environ.get("OUT"))
    args = ap.parse_args()
    if args.worker:
        worker(args.worker)
        return 0
    if not os.path.exists(args.shim):
        print(f"FAIL graph_capture: shim '{args.shim}' not found (build it first)")
        return 1
    env = {"LD_PRELOAD": os.path.abspath(args.shim), "FP8WIRE_THRESHOLDS_ALL_REDUCE_NET": "0",
           "FP8WIRE_THRESHOLDS_ALL_REDUCE_PCIE": "0", "FP8WIRE_THRESHOLDS_ALL_REDUCE_NVLINK": "0",
           "FP8WIRE_LOG_LEVEL": "info"}
    ok, res = emulated_launch.launch(__file__, args.nproc, env, [], log_dir=args.out,
                                     tag=f"graph_n{args.nproc}")
    checks = [("all ranks completed", ok and len(res) == args.nproc, "")]
    if ok and res:
        fp8_calls = sum(res[0]["totals"]["calls"][1:4]) if res[0]["totals"] else 0
        checks.append(("FP8 all-reduces ran under the shim", fp8_calls > 0, f"fp8 calls {fp8_calls}"))
        checks.append(("graph replays equal eager FP8 all-reduce",
                       all(r["checks"]["replay_equals_eager"] for r in res), ""))
        checks.append(("replays within the FP8 error bound", all(r["checks"]["within_bound"] for r in res),
                       f"worst err/bound {max(r['worst'] for r in res):.3f}"))
        checks.append(("ranks bitwise identical", len({r["sha256"] for r in res}) == 1, ""))
    failed = 0
    for name, good, detail in checks:
        print(f"{'PASS' if good else 'FAIL'} graph_capture n={args.nproc}: {name} {detail}", flush=True)
        failed += not good
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
