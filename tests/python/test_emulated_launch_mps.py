#!/usr/bin/env python3
"""The Python rank launcher's private MPS daemon (tests/pylib/emulated_launch.py), CPU only, with a
stand-in nvidia-cuda-mps-control on PATH that records its arguments, its MPS variables and its stdin:
a private pipe directory (never the default), `quit` sent at exit (SIGTERM included), the daemon's
environment and the mode reaching every rank, FP8WIRE_MPS=0 and a missing program giving time-sliced
ranks, a failed start falling back to time-sliced, and --exec-rank naming the emulated host."""
import os
import signal
import subprocess
import sys
import tempfile
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
LAUNCHER = os.path.join(os.path.dirname(HERE), "pylib", "emulated_launch.py")

FAKE = """#!/bin/sh
input=$(cat)
echo "args=[$*] pipe=$CUDA_MPS_PIPE_DIRECTORY log=$CUDA_MPS_LOG_DIRECTORY stdin=[$input]" >> "{calls}"
if [ -n "$FAKE_MPS_FAIL" ]; then echo 'cannot start' > "$CUDA_MPS_LOG_DIRECTORY/control.log"; exit 1; fi
exit 0
"""


def field(line, key):
    for word in line.split():
        if word.startswith(key + "="):
            return word[len(key) + 1:]
    return None


class MpsLauncher(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="fp8wire-mps-pytest-")
        self.bin = os.path.join(self.dir, "bin")
        os.mkdir(self.bin)
        self.calls = os.path.join(self.dir, "calls.log")
        self.env = {k: v for k, v in os.environ.items()
                    if k not in ("FP8WIRE_MPS", "FP8WIRE_TESTBED_MODE", "CUDA_MPS_PIPE_DIRECTORY",
                                 "CUDA_MPS_LOG_DIRECTORY")}
        self.env["PATH"] = f"{self.bin}:/bin:/usr/bin"

    def tearDown(self):
        subprocess.run(["rm", "-rf", self.dir])

    def install_fake(self):
        path = os.path.join(self.bin, "nvidia-cuda-mps-control")
        with open(path, "w") as f:
            f.write(FAKE.format(calls=self.calls))
        os.chmod(path, 0o755)

    def launch(self, rank_cmd, nproc=2, **env):
        """Runs the launcher as a program; each rank runs `sh -c rank_cmd`."""
        return subprocess.run([sys.executable, LAUNCHER, "--nproc", str(nproc), "--timeout", "30", "--",
                               "/bin/sh", "-c", rank_cmd], env={**self.env, **env}, capture_output=True,
                              text=True, timeout=60)

    def record_env(self):
        return (f'echo "mode=$FP8WIRE_TESTBED_MODE pipe=$CUDA_MPS_PIPE_DIRECTORY log=$CUDA_MPS_LOG_DIRECTORY '
                f'host=$NCCL_HOSTID" > {self.dir}/rank$RANK.env')

    def rank_env(self, rank):
        with open(os.path.join(self.dir, f"rank{rank}.env")) as f:
            return f.read()

    def call_lines(self):
        if not os.path.exists(self.calls):
            return []
        with open(self.calls) as f:
            return f.read().splitlines()

    def test_mps_private_daemon_started_reaches_ranks_and_quits(self):
        self.install_fake()
        r = self.launch(self.record_env())
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("ranks side by side under a private MPS daemon", r.stdout)
        self.assertIn("testbed mps", r.stdout)
        lines = self.call_lines()
        self.assertEqual(len(lines), 2, lines)
        start, quit_ = lines
        self.assertIn("args=[-d]", start)
        self.assertIn("args=[]", quit_)
        self.assertIn("stdin=[quit]", quit_)
        pipe = field(start, "pipe")
        self.assertIn("/fp8wire-mps-", pipe)
        self.assertNotEqual(pipe, "/tmp/nvidia-mps")
        self.assertEqual(field(quit_, "pipe"), pipe)
        for rank in range(2):
            env = self.rank_env(rank)
            self.assertEqual(field(env, "mode"), "mps")
            self.assertEqual(field(env, "pipe"), pipe)
            self.assertEqual(field(env, "log"), field(start, "log"))
            self.assertEqual(field(env, "host"), f"emulated-host-{rank}")
        self.assertFalse(os.path.exists(os.path.dirname(pipe)), "private directory left behind")

    def test_mps_opt_out_is_time_sliced_and_never_calls_control(self):
        self.install_fake()
        r = self.launch(self.record_env(), FP8WIRE_MPS="0")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("time-sliced (FP8WIRE_MPS=0)", r.stdout)
        self.assertEqual(self.call_lines(), [])
        self.assertEqual(field(self.rank_env(1), "mode"), "time-sliced")
        self.assertEqual(field(self.rank_env(1), "pipe"), "")

    def test_mps_missing_control_program_is_time_sliced(self):
        r = self.launch(self.record_env())
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("not found on PATH", r.stdout)
        self.assertEqual(field(self.rank_env(0), "mode"), "time-sliced")

    def test_mps_failed_start_falls_back_to_time_sliced(self):
        self.install_fake()
        r = self.launch(self.record_env(), FAKE_MPS_FAIL="1")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("did not start", r.stdout)
        self.assertIn("cannot start", r.stdout)
        lines = self.call_lines()
        self.assertEqual(len(lines), 1, lines)  # started, nothing to stop
        self.assertEqual(field(self.rank_env(0), "mode"), "time-sliced")

    def test_mps_daemon_stopped_when_launcher_gets_sigterm(self):
        self.install_fake()
        p = subprocess.Popen([sys.executable, LAUNCHER, "--nproc", "2", "--timeout", "60", "--",
                              "/bin/sh", "-c", "exec sleep 30"], env=self.env, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
        for _ in range(500):
            if self.call_lines():
                break
            time.sleep(0.01)
        time.sleep(0.3)
        p.send_signal(signal.SIGTERM)
        out, _ = p.communicate(timeout=30)
        self.assertNotEqual(p.returncode, 0, out)
        self.assertTrue(any("stdin=[quit]" in line for line in self.call_lines()), self.call_lines())

    def test_mps_joins_an_enclosing_launchers_daemon(self):
        self.install_fake()
        r = self.launch(self.record_env(), FP8WIRE_TESTBED_MODE="mps", CUDA_MPS_PIPE_DIRECTORY="/tmp/outer-pipe")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertEqual(self.call_lines(), [])
        self.assertEqual(field(self.rank_env(0), "pipe"), "/tmp/outer-pipe")

    def test_mps_exec_rank_takes_the_mpi_rank(self):
        r = subprocess.run([sys.executable, LAUNCHER, "--exec-rank", "--preload", "/x/libfp8wire.so", "--",
                            "/bin/sh", "-c", "echo host=$NCCL_HOSTID preload=$LD_PRELOAD"],
                           env={**self.env, "PMI_RANK": "3", "LD_PRELOAD": ""}, capture_output=True, text=True,
                           timeout=30)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout.strip(), "host=emulated-host-3 preload=/x/libfp8wire.so")

    # scripts/gpu/lib.sh: the same daemon for a GPU script and everything it starts.
    def script(self, body, **env):
        lib = os.path.join(os.path.dirname(os.path.dirname(HERE)), "scripts", "gpu", "lib.sh")
        return subprocess.run(["bash", "-c", f'source "{lib}"\n{body}'], env={**self.env, **env},
                              capture_output=True, text=True, timeout=60)

    def test_mps_script_lib_starts_exports_and_quits(self):
        self.install_fake()
        r = self.script('gpu_mps_start\necho "mode=$FP8WIRE_TESTBED_MODE pipe=$CUDA_MPS_PIPE_DIRECTORY"')
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("testbed: ranks side by side under a private MPS daemon", r.stdout)
        lines = self.call_lines()
        self.assertEqual(len(lines), 2, lines)
        self.assertIn("args=[-d]", lines[0])
        self.assertIn("stdin=[quit]", lines[1])
        pipe = field(lines[0], "pipe")
        self.assertIn("/fp8wire-mps-", pipe)
        self.assertEqual(field(lines[1], "pipe"), pipe)
        self.assertIn(f"mode=mps pipe={pipe}", r.stdout)
        self.assertFalse(os.path.exists(os.path.dirname(pipe)))

    def test_mps_script_lib_quits_when_the_script_fails_or_is_killed(self):
        self.install_fake()
        r = self.script("gpu_mps_start\nfalse || exit 3")
        self.assertEqual(r.returncode, 3)
        self.assertIn("stdin=[quit]", self.call_lines()[-1])
        os.remove(self.calls)
        r = self.script("gpu_mps_start\nkill -TERM $$\nsleep 5")
        self.assertEqual(r.returncode, 143)
        self.assertIn("stdin=[quit]", self.call_lines()[-1])

    def test_mps_script_lib_opt_out_and_missing_program(self):
        self.install_fake()
        r = self.script('gpu_mps_start\necho "mode=$FP8WIRE_TESTBED_MODE"', FP8WIRE_MPS="0")
        self.assertIn("testbed: time-sliced (FP8WIRE_MPS=0)", r.stdout)
        self.assertIn("mode=time-sliced", r.stdout)
        self.assertEqual(self.call_lines(), [])
        os.remove(os.path.join(self.bin, "nvidia-cuda-mps-control"))
        r = self.script("gpu_mps_start")
        self.assertIn("not found on PATH", r.stdout)

    def test_mps_script_and_python_launcher_share_one_daemon(self):
        self.install_fake()
        r = self.script(f'gpu_mps_start\n"{sys.executable}" "{LAUNCHER}" --nproc 2 -- /bin/sh -c \'{self.record_env()}\'')
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        lines = self.call_lines()
        self.assertEqual(len(lines), 2, lines)  # the script's start and quit only
        self.assertEqual(field(self.rank_env(1), "pipe"), field(lines[0], "pipe"))


if __name__ == "__main__":
    unittest.main(verbosity=2)
