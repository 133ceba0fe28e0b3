"""Starts N worker processes of a test script on GPU 0, each its own emulated host (NCCL_HOSTID), so
NCCL connects them over sockets as on separate machines. The one Python rank launcher of the tests
(tests/sched, tests/integration).

The launcher passes RANK / LOCAL_RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT as torchrun would,
plus the caller's extra environment (LD_PRELOAD, FP8WIRE_*), and collects each worker's JSON result
file. A worker that hangs is killed at the timeout. Workers import the `fp8wire` package from the
source tree (python/), so they read the library's totals the way users do."""
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PYTHON_PACKAGE_DIR = os.path.join(REPO, "python")
if PYTHON_PACKAGE_DIR not in sys.path:
    sys.path.insert(0, PYTHON_PACKAGE_DIR)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def gpu_available():
    """(True, "") when torch sees a CUDA device, else (False, why)."""
    try:
        import torch
    except ImportError as e:
        return False, f"torch not importable ({e})"
    if not torch.cuda.is_available():
        return False, "no CUDA device"
    return True, ""


def _die_with_parent():
    """In the child before exec: SIGKILL when the launching process dies (a ctest timeout), so no
    rank is left running on the GPU."""
    import ctypes

    PR_SET_PDEATHSIG = 1
    ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


class Launch:
    """One multi-rank run in flight: start() returns at once, wait() collects the results, so
    independent runs (with and without the library) can share the GPU at the same time."""

    def __init__(self, script, nproc, extra_env=None, args=(), timeout_s=150, log_dir=None, tag="run",
                 python=None):
        self.nproc, self.timeout_s, self.tag = nproc, timeout_s, tag
        self.result_dir = tempfile.mkdtemp(prefix=f"fp8wire_{tag}_")
        if log_dir:
            os.makedirs(log_dir, exist_ok=True)
        port = free_port()
        self.procs, self.logs = [], []
        self.started = time.time()
        pythonpath = os.pathsep.join(p for p in (PYTHON_PACKAGE_DIR, os.path.dirname(os.path.abspath(__file__)),
                                                 os.environ.get("PYTHONPATH", "")) if p)
        for rank in range(nproc):
            env = dict(os.environ)
            env.update({"RANK": str(rank), "LOCAL_RANK": "0", "WORLD_SIZE": str(nproc),
                        "LOCAL_WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
                        "NCCL_HOSTID": f"emulated-host-{rank}", "NCCL_NVLS_ENABLE": "0",
                        "PYTHONPATH": pythonpath, "PYTHONUNBUFFERED": "1"})
            env.update(extra_env or {})
            log_path = os.path.join(log_dir or self.result_dir, f"{tag}.rank{rank}.log")
            log = open(log_path, "w")
            self.logs.append((log, log_path))
            self.procs.append(subprocess.Popen([python or sys.executable, script, "--worker", self.result_dir, *args],
                                               env=env, stdout=log, stderr=subprocess.STDOUT,
                                               preexec_fn=_die_with_parent))

    @staticmethod
    def _kill(p):
        if p.poll() is None:
            p.kill()
            p.wait()

    def wait(self, stop_others_after_rank0=False, print_tails=True):
        """Returns (ok, [result dicts]). ok: every rank exited 0 in time and wrote its result.
        stop_others_after_rank0: once rank 0 has ended, end the other ranks (a test where they are
        meant to stall)."""
        deadline = self.started + self.timeout_s
        ok = True
        self.timed_out = False
        for i, p in enumerate(self.procs):
            try:
                p.wait(timeout=max(1, deadline - time.time()))
            except subprocess.TimeoutExpired:
                ok = False
                self.timed_out = True
            if i == 0 and stop_others_after_rank0:
                for q in self.procs[1:]:
                    self._kill(q)
        for p in self.procs:
            self._kill(p)
        self.returncodes = [p.returncode for p in self.procs]
        self.elapsed_s = time.time() - self.started
        ok &= all(rc == 0 for rc in self.returncodes)
        for log, _ in self.logs:
            log.close()
        if not ok and print_tails:
            for _, path in self.logs:
                print(f"--- {path} (tail) ---\n{self.log_text(path)[-3000:]}", flush=True)
        results = []
        for rank in range(self.nproc):
            path = os.path.join(self.result_dir, f"rank{rank}.json")
            if os.path.exists(path):
                with open(path) as f:
                    results.append(json.load(f))
            else:
                ok = False
        return ok, results

    @staticmethod
    def log_text(path):
        with open(path, errors="replace") as f:
            return f.read()

    def log_paths(self):
        return [path for _, path in self.logs]


def launch(script, nproc, extra_env=None, args=(), timeout_s=150, log_dir=None, tag="run"):
    """Runs `script --worker <result-dir> args...` as nproc ranks; returns (ok, [result dicts])."""
    return Launch(script, nproc, extra_env, args, timeout_s, log_dir, tag).wait()


def fp8wire_totals():
    """The library's totals by path name (the fp8wire package's helper), or None without the library."""
    import fp8wire

    t = fp8wire.totals()
    return t.to_dict() if t.loaded else None


def fp8_calls(totals):
    """Calls fp8wire carried itself, from a fp8wire_totals() dict (0 when there is none)."""
    return totals["fp8_calls"] if totals else 0


def write_result(result_dir, rank, result):
    path = os.path.join(result_dir, f"rank{rank}.json")
    with open(path + ".tmp", "w") as f:
        json.dump(result, f)
    os.replace(path + ".tmp", path)
