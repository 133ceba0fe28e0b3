"""Starts N worker processes of a test script on GPU 0, each its own emulated host (NCCL_HOSTID), so
NCCL connects them over sockets as on separate machines. Used by ddp_parity.py and graph_capture.py.

The launcher passes RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT as torchrun would, plus an optional
LD_PRELOAD, and collects each worker's JSON result file. A worker that hangs is killed at the timeout."""
import json
import os
import socket
import subprocess
import sys
import tempfile
import time


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(script, nproc, extra_env=None, args=(), timeout_s=150, log_dir=None, tag="run"):
    """Runs `script --worker <result-dir> args...` as nproc ranks; returns (ok, [result dicts])."""
    result_dir = tempfile.mkdtemp(prefix=f"fp8wire_{tag}_")
    if log_dir:
        os.makedirs(log_dir, exist_ok=True)
    port = free_port()
    procs, logs = [], []
    for rank in range(nproc):
        env = dict(os.environ)
        env.update({"RANK": str(rank), "LOCAL_RANK": "0", "WORLD_SIZE": str(nproc),
                    "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
                    "NCCL_HOSTID": f"emulated-host-{rank}", "NCCL_NVLS_ENABLE": "0"})
        env.update(extra_env or {})
        log_path = os.path.join(log_dir or result_dir, f"{tag}.rank{rank}.log")
        log = open(log_path, "w")
        logs.append((log, log_path))
        procs.append(subprocess.Popen([sys.executable, script, "--worker", result_dir, *args],
                                      env=env, stdout=log, stderr=subprocess.STDOUT))
    deadline = time.time() + timeout_s
    ok = True
    for p in procs:
        try:
            p.wait(timeout=max(1, deadline - time.time()))
        except subprocess.TimeoutExpired:
            ok = False
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait()
        ok &= p.returncode == 0
    for log, _ in logs:
        log.close()
    if not ok:
        for _, path in logs:
            with open(path) as f:
                tail = f.read()[-3000:]
            print(f"--- {path} (tail) ---\n{tail}", flush=True)
    results = []
    for rank in range(nproc):
        path = os.path.join(result_dir, f"rank{rank}.json")
        if os.path.exists(path):
            with open(path) as f:
                results.append(json.load(f))
        else:
            ok = False
    return ok, results


def fp8wire_totals():
    """fp8wire_get_totals() when libfp8wire.so is preloaded, else None."""
    import ctypes

    try:
        fn = ctypes.CDLL(None).fp8wire_get_totals
    except AttributeError:
        return None

    class Totals(ctypes.Structure):
        _fields_ = [("calls", ctypes.c_uint64 * 5), ("app_bytes", ctypes.c_uint64 * 5),
                    ("wire_bytes", ctypes.c_uint64 * 5), ("dropped_records", ctypes.c_uint64)]

    t = Totals()
    fn(ctypes.byref(t))
    return {"calls": list(t.calls), "app_bytes": list(t.app_bytes), "wire_bytes": list(t.wire_bytes)}


def write_result(result_dir, rank, result):
    with open(os.path.join(result_dir, f"rank{rank}.json"), "w") as f:
        json.dump(result, f)
