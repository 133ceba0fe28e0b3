"""Starts N worker processes of a test script on GPU 0, each its own emulated host (NCCL_HOSTID), so
NCCL connects them over sockets as on separate machines. The one Python rank launcher of the project
(tests/sched, tests/integration, tests/shim, tests/profiler, scripts/gpu).

The launcher passes RANK / LOCAL_RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT as torchrun would,
plus the caller's extra environment (LD_PRELOAD, FP8WIRE_*), and collects each worker's JSON result
file. A worker that hangs is killed at the timeout. Workers import the `fp8wire` package from the
source tree (python/), so they read the library's totals the way users do.

Ranks sharing the GPU run side by side under a private MPS daemon where `nvidia-cuda-mps-control`
exists (its own pipe and log directories, never a daemon the user runs; started on the first launch,
stopped when this process exits, SIGTERM included); FP8WIRE_MPS=0 turns it off and the ranks are then
time-sliced. Each launch says which, and every result file carries it ("testbed"). The protocol is the
C++ launcher's (common/mps_daemon.hpp).

As a program:
    emulated_launch.py --nproc N [--timeout S] -- CMD ARGS...   N ranks of CMD (torchrun's variables)
    emulated_launch.py --exec-rank [--preload LIB] -- CMD ARGS...
                                    one rank started by mpiexec: take the rank from the MPI launcher,
                                    name its emulated host, then exec CMD (LIB preloaded into CMD only)
"""
import argparse
import atexit
import json
import os
import secrets
import shutil
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

MPS_CONTROL = "nvidia-cuda-mps-control"
TESTBED_MPS, TESTBED_TIME_SLICED = "mps", "time-sliced"


def emulated_host_id(rank):
    """NCCL_HOSTID of an emulated rank: the C++ launcher's spelling (common/rank_launcher.hpp)."""
    return f"emulated-host-{rank}"


class PrivateMps:
    """A private MPS daemon for ranks sharing one GPU (see the module docstring). start() decides the
    mode; stop() sends `quit` to a daemon this object started and removes its directory."""

    def __init__(self):
        self.mode, self.why = TESTBED_TIME_SLICED, ""
        self.dir = self.pipe_dir = self.log_dir = None
        self.control = None
        self.owned = False

    def start(self):
        opt = os.environ.get("FP8WIRE_MPS", "")
        if opt == "0":
            self.why = "FP8WIRE_MPS=0"
            return self
        if opt not in ("", "1"):
            self.why = f"FP8WIRE_MPS='{opt}' is not 0 or 1; taken as 0"
            return self
        outer_pipe = os.environ.get("CUDA_MPS_PIPE_DIRECTORY")
        if os.environ.get("FP8WIRE_TESTBED_MODE") == TESTBED_MPS and outer_pipe:
            self.mode, self.why = TESTBED_MPS, "the enclosing launcher's daemon"
            self.pipe_dir, self.log_dir = outer_pipe, os.environ.get("CUDA_MPS_LOG_DIRECTORY")
            return self
        self.control = shutil.which(MPS_CONTROL)
        if not self.control:
            self.why = f"{MPS_CONTROL} not found on PATH"
            return self
        self.dir = tempfile.mkdtemp(prefix="fp8wire-mps-")
        self.pipe_dir, self.log_dir = os.path.join(self.dir, "pipe"), os.path.join(self.dir, "log")
        os.mkdir(self.pipe_dir, 0o700)
        os.mkdir(self.log_dir, 0o700)
        rc = self._control(["-d"], "")
        if rc != 0:
            log = ""
            try:
                with open(os.path.join(self.log_dir, "control.log"), errors="replace") as f:
                    log = f.read()[-300:].strip()
            except OSError:
                pass
            self.why = f"the private MPS daemon did not start ({self.control} -d exited with {rc}" + \
                (f"; its log: {log})" if log else ")")
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = self.pipe_dir = self.log_dir = None
            return self
        self.owned, self.mode, self.why = True, TESTBED_MPS, f"pipe directory {self.pipe_dir}"
        return self

    def _control(self, args, stdin_text):
        env = dict(os.environ, CUDA_MPS_PIPE_DIRECTORY=self.pipe_dir, CUDA_MPS_LOG_DIRECTORY=self.log_dir)
        try:
            return subprocess.run([self.control, *args], input=stdin_text, text=True, env=env, timeout=60).returncode
        except (OSError, subprocess.TimeoutExpired) as e:
            print(f"emulated_launch: {self.control} {' '.join(args)}: {e}", file=sys.stderr)
            return -1

    def stop(self):
        if self.owned:
            self.owned = False
            rc = self._control([], "quit\n")
            if rc != 0:
                print(f"emulated_launch: stopping the private MPS daemon ({self.pipe_dir}) failed: exit {rc}",
                      file=sys.stderr)
        if self.dir:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None

    @property
    def side_by_side(self):
        return self.mode == TESTBED_MPS

    def describe(self):
        if self.side_by_side:
            return f"ranks side by side under a private MPS daemon ({self.why})"
        return f"time-sliced ({self.why})"

    def rank_env(self):
        env = {"FP8WIRE_TESTBED_MODE": self.mode}
        if self.side_by_side:
            env["CUDA_MPS_PIPE_DIRECTORY"] = self.pipe_dir
            if self.log_dir:
                env["CUDA_MPS_LOG_DIRECTORY"] = self.log_dir
        return env


_mps = None


def _exit_on_sigterm(signum, _frame):
    sys.exit(128 + signum)  # runs atexit, so the daemon is stopped


def shared_gpu_daemon():
    """The process's one PrivateMps, started on first use and stopped at exit (SIGTERM included)."""
    global _mps
    if _mps is None:
        _mps = PrivateMps().start()
        if _mps.owned:
            atexit.register(_mps.stop)
            if signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
                signal.signal(signal.SIGTERM, _exit_on_sigterm)
    return _mps


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
    independent runs (with and without the library) can share the GPU at the same time.

    Each rank runs `python script --worker <result_dir> args...`, or `command` as given.
    drop_env_prefixes: variables of this process left out of the ranks' environment (a baseline run
    without FP8WIRE_* or LD_PRELOAD). log_dir/result_dir: where rank logs and result files go
    (default: a fresh temporary directory)."""

    def __init__(self, script, nproc, extra_env=None, args=(), timeout_s=150, log_dir=None, tag="run",
                 python=None, command=None, drop_env_prefixes=(), result_dir=None, quiet=False):
        self.nproc, self.timeout_s, self.tag = nproc, timeout_s, tag
        self.result_dir = result_dir or tempfile.mkdtemp(prefix=f"fp8wire_{tag}_")
        os.makedirs(self.result_dir, exist_ok=True)
        if log_dir:
            os.makedirs(log_dir, exist_ok=True)
        mps = shared_gpu_daemon()
        self.testbed = mps.mode
        if not quiet:
            print(f"emulated_launch: {tag}: {nproc} ranks on one GPU, {mps.describe()}", flush=True)
        port = free_port()
        # The job's secret for fp8wire's own bootstrap (common/rank_launcher.hpp), which C++ ranks
        # started here (fp8wire-bench, the multi-rank tests) use; drawn afresh, as its launcher does.
        secret = secrets.token_hex(32)
        self.procs, self.logs = [], []
        self.started = time.time()
        pythonpath = os.pathsep.join(p for p in (PYTHON_PACKAGE_DIR, os.path.dirname(os.path.abspath(__file__)),
                                                 os.environ.get("PYTHONPATH", "")) if p)
        argv = list(command) if command else [python or sys.executable, script, "--worker", self.result_dir, *args]
        for rank in range(nproc):
            env = {k: v for k, v in os.environ.items() if not k.startswith(tuple(drop_env_prefixes))}
            env.update({"RANK": str(rank), "LOCAL_RANK": "0", "WORLD_SIZE": str(nproc),
                        "LOCAL_WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
                        "NCCL_HOSTID": emulated_host_id(rank), "NCCL_NVLS_ENABLE": "0",
                        "FP8WIRE_BOOTSTRAP_SECRET": secret,
                        "PYTHONPATH": pythonpath, "PYTHONUNBUFFERED": "1", **mps.rank_env()})
            env.update(extra_env or {})
            log_path = os.path.join(log_dir or self.result_dir, f"{tag}.rank{rank}.log")
            log = open(log_path, "w")
            self.logs.append((log, log_path))
            self.procs.append(subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT,
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


def script_parser():
    """The arguments of a test script that launches itself as its ranks (tests/sched): --worker (a
    rank's result directory, as Launch passes it), --nproc, --shim and --out; the script adds its own."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--shim", default="build/shim/libfp8wire.so")
    ap.add_argument("--out", default=os.environ.get("OUT"))
    return ap


def launch(script, nproc, extra_env=None, args=(), timeout_s=150, log_dir=None, tag="run"):
    """Runs `script --worker <result-dir> args...` as nproc ranks; returns (ok, [result dicts])."""
    return Launch(script, nproc, extra_env, args, timeout_s, log_dir, tag).wait()


def fp8_env(shim, collective):
    """The environment of a run under the shim with collectives.<collective> on and its thresholds 0
    (FP8 at every size)."""
    key = collective.upper()
    env = {"LD_PRELOAD": os.path.abspath(shim), f"FP8WIRE_COLLECTIVES_{key}": "1", "FP8WIRE_LOG_LEVEL": "info"}
    env.update({f"FP8WIRE_THRESHOLDS_{key}_{fabric}": "0" for fabric in ("NVLINK", "PCIE", "NET")})
    return env


def plain_and_fp8(script, nproc, shim, collective, out, prefix, timeout_s=90, args=(), more_runs=()):
    """Runs `script`'s worker (with `args`) twice on nproc ranks: plain (no LD_PRELOAD), then under
    the shim with collectives.<collective> on and its thresholds 0 (FP8 at every size); then each of
    `more_runs`, (name, environment, extra worker arguments). Returns (results, checks, dirs): each
    run's per-rank results, one "<run> run completed" check per run, each run's folder (its ranks'
    files beside their results)."""
    results, checks, dirs = {}, [], {}
    runs = (("plain", {}, ()), ("fp8", fp8_env(shim, collective), ())) + tuple(more_runs)
    for name, env, extra in runs:
        tag = f"{prefix}_{name}_n{nproc}"
        dirs[name] = os.path.join(out, tag)
        ok, res = Launch(script, nproc, env, [*args, *extra], timeout_s=timeout_s, log_dir=out, tag=tag,
                         result_dir=dirs[name]).wait()
        checks.append((f"{name} run completed", ok and len(res) == nproc, ""))
        results[name] = res
    return results, checks, dirs


def fp8wire_totals():
    """The library's totals by path name (the fp8wire package's helper), or None without the library."""
    import fp8wire

    t = fp8wire.totals()
    return t.to_dict() if t.loaded else None


def fp8_calls(totals):
    """Calls fp8wire carried itself, from a fp8wire_totals() dict (0 when there is none)."""
    return totals["fp8_calls"] if totals else 0


def write_result(result_dir, rank, result):
    """Writes a worker's result; it carries the testbed mode its launcher chose."""
    result = dict(result, testbed=os.environ.get("FP8WIRE_TESTBED_MODE", ""))
    path = os.path.join(result_dir, f"rank{rank}.json")
    with open(path + ".tmp", "w") as f:
        json.dump(result, f)
    os.replace(path + ".tmp", path)


def _mpi_rank():
    for name in ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "MPI_LOCALRANKID"):
        if os.environ.get(name, "") != "":
            return int(os.environ[name])
    return None


def main(argv=None):
    ap = argparse.ArgumentParser(description="Ranks emulated on one GPU (see the module docstring).")
    ap.add_argument("--nproc", type=int, help="ranks to start")
    ap.add_argument("--timeout", type=float, default=600, help="seconds for the whole run")
    ap.add_argument("--log-dir", help="rank logs here (default: printed at the end, per rank)")
    ap.add_argument("--exec-rank", action="store_true", help="be one rank started by mpiexec, then exec CMD")
    ap.add_argument("--preload", help="--exec-rank: put this library first in CMD's LD_PRELOAD (CMD only, "
                                      "not the MPI launcher)")
    ap.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD ARGS...")
    a = ap.parse_args(argv)
    command = a.command[1:] if a.command[:1] == ["--"] else a.command
    if not command:
        ap.error("no command given (after --)")
    if a.exec_rank:
        rank = _mpi_rank()
        if rank is None:
            ap.error("--exec-rank: no rank from an MPI launcher (PMI_RANK, OMPI_COMM_WORLD_RANK, PMIX_RANK)")
        os.environ["NCCL_HOSTID"] = emulated_host_id(rank)
        os.environ["NCCL_NVLS_ENABLE"] = "0"
        if a.preload:
            os.environ["LD_PRELOAD"] = a.preload + (":" + os.environ["LD_PRELOAD"] if os.environ.get("LD_PRELOAD") else "")
        os.execvp(command[0], command)
    if not a.nproc or a.nproc < 1:
        ap.error("--nproc N (N >= 1) is required without --exec-rank")
    run = Launch(None, a.nproc, timeout_s=a.timeout, log_dir=a.log_dir, tag="rank", command=command)
    run.wait(print_tails=False)
    for path in run.log_paths():
        sys.stdout.write(f"---- {path}\n{run.log_text(path)}")
    codes = run.returncodes
    print(f"emulated_launch: exit codes {codes}{' (timed out)' if run.timed_out else ''}, testbed {run.testbed}")
    return 0 if all(c == 0 for c in codes) and not run.timed_out else 1


if __name__ == "__main__":
    sys.exit(main())
