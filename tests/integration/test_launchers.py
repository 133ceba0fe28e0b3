#!/usr/bin/env python3
"""`fp8wire run` reaches the ranks that launchers start on this host.

  --launcher torchrun   fp8wire run -- python -m torch.distributed.run --standalone --nproc_per_node 2 ...
  --launcher deepspeed  fp8wire run -- python -m deepspeed.launcher.runner --num_gpus 1 ...
                        (deepspeed's runner on one node passes its own environment to its ranks and
                        does not read .deepspeed_env; fp8wire writes that file for other nodes all the
                        same, checked here too)

Each rank (the probe) reports whether libfp8wire.so is loaded and active in it; on a GPU the two
torchrun ranks (emulated hosts on GPU 0) also all-reduce a 2 MiB bf16 buffer, which must go FP8.
With --cpu the ranks use gloo and only the preload is checked (this runs in CI).
The package is run from the source tree (python/) with FP8WIRE_SHIM_LIB naming the built library.

    test_launchers.py --launcher torchrun|deepspeed [--cpu] [--out DIR]"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402


def probe(out_dir, cpu):
    rank = int(os.environ["RANK"])
    # Each rank its own emulated host, before the communicator exists (tests/sched does the same).
    os.environ["NCCL_HOSTID"] = f"emulated-host-{rank}"
    import fp8wire
    import torch
    import torch.distributed as dist

    result = {"rank": rank, "loaded": fp8wire.loaded(), "ld_preload": os.environ.get("LD_PRELOAD", "")}
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        if cpu:
            dist.init_process_group("gloo")
            x = torch.ones(1 << 20)
        else:
            torch.cuda.set_device(0)
            dist.init_process_group("nccl", device_id=torch.device("cuda:0"))
            x = torch.ones(1 << 20, device="cuda", dtype=torch.bfloat16)
        for _ in range(3):
            dist.all_reduce(x)
        if not cpu:
            torch.cuda.synchronize()
        result["sum_ok"] = bool(x[0].item() == float(dist.get_world_size()) ** 3)
        dist.destroy_process_group()
    # Able to act needs NCCL in the process and a GPU: asked once the job has used them (with --cpu
    # it reflects the machine, and is not checked).
    result["active"] = fp8wire.active()
    result["totals"] = fp8wire.totals().to_dict()
    with open(os.path.join(out_dir, f"probe.rank{rank}.json"), "w") as f:
        json.dump(result, f)


def main():
    ap = harness.parser(__doc__)
    ap.add_argument("--launcher", choices=["torchrun", "deepspeed"])
    ap.add_argument("--probe", metavar="DIR", help=argparse_suppress())
    ap.add_argument("--local_rank", help=argparse_suppress())  # deepspeed's launcher adds it
    args = ap.parse_args()
    if args.probe:
        probe(args.probe, args.cpu)
        return 0
    name = f"launcher_{args.launcher}"
    stop = harness.preflight(name, args, needs=("deepspeed",) if args.launcher == "deepspeed" else ())
    if stop is not None:
        return stop
    if not os.path.isfile(args.shim):
        print(f"FAIL {name}: {args.shim} not found (build it first)", flush=True)
        return 1
    work = tempfile.mkdtemp(prefix=f"fp8wire_{name}_")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([os.path.join(harness.REPO, "python"), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.update({"FP8WIRE_SHIM_LIB": os.path.abspath(args.shim), "FP8WIRE_LOG_LEVEL": "info",
                "NCCL_NVLS_ENABLE": "0", "PYTHONUNBUFFERED": "1"})
    env.update({k: v for k, v in harness.fp8_environment(args.shim).items() if k.startswith("FP8WIRE_THRESHOLDS")})
    env.pop("LD_PRELOAD", None)
    me = [os.path.abspath(__file__), "--probe", work] + (["--cpu"] if args.cpu else [])
    if args.launcher == "torchrun":
        nproc = 2
        job = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc), *me]
    else:
        nproc = 1
        port = str(harness.emulated_launch.free_port())
        job = [sys.executable, "-m", "deepspeed.launcher.runner", "--num_gpus", "1", "--master_port", port, *me]
        if args.cpu:
            env["CUDA_VISIBLE_DEVICES"] = ""
    cmd = [sys.executable, "-m", "fp8wire", "run", "--", *job]
    t = time.time()
    try:
        r = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True, timeout=args.timeout)
        output, rc = r.stdout + r.stderr, r.returncode
    except subprocess.TimeoutExpired as e:
        output, rc = f"{e.stdout or ''}{e.stderr or ''}\n(killed after {args.timeout:.0f} s)", -1
    os.makedirs(os.path.join(args.out, name), exist_ok=True)
    with open(os.path.join(args.out, name, "job.log"), "w") as f:
        f.write(" ".join(cmd) + "\n" + output)
    results = []
    for rank in range(nproc):
        path = os.path.join(work, f"probe.rank{rank}.json")
        if os.path.exists(path):
            with open(path) as f:
                results.append(json.load(f))
    shim = os.path.abspath(args.shim)
    checks = [("the job exited 0", rc == 0, f"status {rc}, {time.time() - t:.0f} s"),
              ("fp8wire run printed what it preloaded", "fp8wire" in output and f"preloading {shim}" in output, ""),
              (f"every rank reported ({len(results)}/{nproc})", len(results) == nproc, ""),
              ("libfp8wire.so loaded (and, on a GPU, active) in every rank", bool(results) and all(
                  r["loaded"] and (args.cpu or r["active"]) and r["ld_preload"].split(":")[0] == shim
                  for r in results), "")]
    calls = min((r["totals"]["fp8_calls"] for r in results), default=0)
    if args.launcher == "torchrun":
        checks.append(("the all-reduces summed correctly", bool(results) and all(r.get("sum_ok") for r in results), ""))
        if not args.cpu:
            checks.append(("FP8 calls were made on every rank", calls > 0, str(calls)))
    if args.launcher == "deepspeed":
        env_file = os.path.join(work, ".deepspeed_env")
        lines = open(env_file).read().splitlines() if os.path.exists(env_file) else []
        checks.append(("./.deepspeed_env carries LD_PRELOAD and the FP8WIRE_* settings for other nodes",
                       f"LD_PRELOAD={shim}" in lines and "FP8WIRE_LOG_LEVEL=info" in lines,
                       "; ".join(lines)[:300]))
    summary = {"stack": name + (" (cpu check)" if args.cpu else ""), "steps": 0, "pearson": None,
               "final_gap": None, "fp8_calls": calls, "ok": all(ok for _, ok, _ in checks)}
    if not summary["ok"]:
        print(output[-4000:], flush=True)
    shutil.rmtree(work, ignore_errors=True)
    return harness.report(name, checks, summary, args.out)


def argparse_suppress():
    import argparse

    return argparse.SUPPRESS


if __name__ == "__main__":
    sys.exit(main())
