#!/usr/bin/env python3
"""CPU tests of the fp8wire Python package (python/fp8wire): finding the libraries and tools, the
environment `fp8wire run` gives a job, .deepspeed_env handling, the in-process helpers with and
without the library, the CLI. Runs from the source tree with FP8WIRE_SHIM_LIB naming a built
libfp8wire.so (ctest sets it), or against an installed package with --installed (the wheel test,
scripts/test-package.sh), where the package's own lib/ and bin/ are used."""
import os
import re
import subprocess
import sys
import tempfile
import textwrap
import unittest
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
INSTALLED = "--installed" in sys.argv
if INSTALLED:
    sys.argv.remove("--installed")
else:
    sys.path.insert(0, str(REPO / "python"))

import fp8wire  # noqa: E402
from fp8wire import launch  # noqa: E402


def env_without_library(**extra):
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD" and not k.startswith("FP8WIRE_")}
    if not INSTALLED:
        env["PYTHONPATH"] = os.pathsep.join([str(REPO / "python"), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        if os.environ.get("FP8WIRE_SHIM_LIB"):
            env["FP8WIRE_SHIM_LIB"] = os.environ["FP8WIRE_SHIM_LIB"]
    env.update(extra)
    return env


def fp8wire_cli(*args, env=None, cwd=None):
    return subprocess.run([sys.executable, "-m", "fp8wire", *args], env=env or env_without_library(), cwd=cwd,
                          capture_output=True, text=True, timeout=120)


class Paths(unittest.TestCase):
    def test_library_and_tools_are_found(self):
        self.assertTrue(Path(fp8wire.lib_path()).is_file())
        self.assertTrue(fp8wire.lib_path().endswith("libfp8wire.so"))
        self.assertTrue(fp8wire.profiler_library().is_file())
        for name in ("fp8wire-config", "fp8wire-bench", "fp8wire-prof"):
            self.assertTrue(os.access(fp8wire.tool(name), os.X_OK), name)

    def test_bad_override_is_a_clear_error(self):
        old = os.environ.get("FP8WIRE_SHIM_LIB")
        os.environ["FP8WIRE_SHIM_LIB"] = "/nonexistent/libfp8wire.so"
        try:
            with self.assertRaisesRegex(fp8wire.NotInstalled, "FP8WIRE_SHIM_LIB=/nonexistent/libfp8wire.so: no such file"):
                fp8wire.lib_path()
        finally:
            if old is None:
                del os.environ["FP8WIRE_SHIM_LIB"]
            else:
                os.environ["FP8WIRE_SHIM_LIB"] = old
        with self.assertRaisesRegex(ValueError, "unknown tool"):
            fp8wire.tool("rm")

    def test_version_has_one_source(self):
        cmake = (REPO / "CMakeLists.txt").read_text()
        self.assertEqual(fp8wire.__version__, re.search(r"project\(fp8wire VERSION ([0-9.]+)", cmake).group(1))
        r = fp8wire_cli("run", "--", sys.executable, "-c", "import fp8wire; print(fp8wire.library_version())")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout.strip(), fp8wire.__version__)


class Environment(unittest.TestCase):
    def test_preload_first_and_once(self):
        shim = fp8wire.lib_path()
        env = launch.job_environment({"LD_PRELOAD": f"/x/libother.so {shim}"})
        self.assertEqual(env["LD_PRELOAD"], f"{shim}:/x/libother.so")
        self.assertNotIn("NVTX_INJECTION64_PATH", env)

    def test_profiler_variables(self):
        env = launch.job_environment({}, profile_dir=Path("/tmp/p"))
        prof = str(fp8wire.profiler_library())
        self.assertEqual(env["LD_PRELOAD"], f"{fp8wire.lib_path()}:{prof}")
        self.assertEqual(env["NVTX_INJECTION64_PATH"], prof)
        self.assertEqual(env["FP8WIRE_PROFILER_ENABLE"], "1")
        self.assertEqual(env["FP8WIRE_PROFILER_OUTPUT"], "/tmp/p/")

    def test_profiler_variables_match_fp8wire_prof(self):
        """What .deepspeed_env carries for a profiled job is what fp8wire-prof gives local ranks."""
        with tempfile.TemporaryDirectory() as d:
            out = Path(d) / "prof"
            r = fp8wire_cli("run", "--profile", str(out), "--", "sh", "-c", f"env > {d}/env.txt")
            self.assertIn("preloading", r.stderr)
            seen = dict(line.split("=", 1) for line in Path(d, "env.txt").read_text().splitlines() if "=" in line)
        mine = launch.job_environment({}, profile_dir=out.resolve())
        for key in launch.PROFILER_VARIABLES:
            self.assertEqual(seen.get(key), mine[key], key)
        self.assertTrue(seen["LD_PRELOAD"].startswith(mine["LD_PRELOAD"]), seen["LD_PRELOAD"])


class DeepSpeedEnv(unittest.TestCase):
    def setUp(self):
        self.dir = Path(tempfile.mkdtemp())
        self.path = self.dir / ".deepspeed_env"

    def test_detects_deepspeed_commands(self):
        self.assertTrue(launch.is_deepspeed(["deepspeed", "--num_gpus", "8", "train.py"]))
        self.assertTrue(launch.is_deepspeed(["/venv/bin/deepspeed", "train.py"]))
        self.assertTrue(launch.is_deepspeed(["python3", "-m", "deepspeed.launcher.runner", "train.py"]))
        self.assertFalse(launch.is_deepspeed(["torchrun", "train.py"]))
        self.assertFalse(launch.is_deepspeed(["python", "deepspeed_train.py"]))

    def test_writes_then_checks_then_updates(self):
        wanted = {"LD_PRELOAD": "/a/libfp8wire.so", "FP8WIRE_LOG_LEVEL": "info"}
        notes = launch.sync_deepspeed_env(self.path, wanted)
        self.assertIn("wrote", notes[0])
        self.assertEqual(self.path.read_text(), "LD_PRELOAD=/a/libfp8wire.so\nFP8WIRE_LOG_LEVEL=info\n")
        notes = launch.sync_deepspeed_env(self.path, wanted)
        self.assertIn("already carries", notes[0])
        # The user's own lines stay; a stale FP8WIRE_* line goes; a changed value is rewritten.
        self.path.write_text("NCCL_IB_HCA=mlx5\nFP8WIRE_FORMAT=e5m2\nLD_PRELOAD=/old/libfp8wire.so\n")
        notes = launch.sync_deepspeed_env(self.path, wanted)
        self.assertIn("updated", notes[0])
        self.assertEqual(self.path.read_text(),
                         "NCCL_IB_HCA=mlx5\nLD_PRELOAD=/a/libfp8wire.so\nFP8WIRE_LOG_LEVEL=info\n")

    def test_lines_deepspeed_cannot_read_are_errors(self):
        self.path.write_text("A=1\n# a comment\nB=2\n")
        with self.assertRaisesRegex(launch.UsageError, r":2: '# a comment' is not KEY=VALUE"):
            launch.sync_deepspeed_env(self.path, {"LD_PRELOAD": "/a.so"})

    def test_blank_lines_are_removed_from_the_file_fp8wire_writes(self):
        # DeepSpeed's runner splits every line at '=' and stops on a blank one; they carry nothing.
        self.path.write_text("A=1\n\n   \nB=2\n")
        notes = launch.sync_deepspeed_env(self.path, {"LD_PRELOAD": "/a.so"})
        self.assertEqual(self.path.read_text(), "A=1\nB=2\nLD_PRELOAD=/a.so\n")
        self.assertIn("removed 2 blank lines, which deepspeed's runner cannot read", notes[0])
        # In ~/.deepspeed_env, which fp8wire does not rewrite, a blank line is still reported.
        home = self.dir / "home_env"
        home.write_text("A=1\n\n")
        notes = launch.sync_deepspeed_env(self.path, {"LD_PRELOAD": "/a.so"}, home)
        self.assertTrue(any("home_env:2: '' is not KEY=VALUE" in n for n in notes), notes)

    def test_a_line_deepspeed_cannot_read_stops_the_job_before_it_is_announced(self):
        fake = self.dir / "deepspeed"
        fake.write_text("#!/bin/sh\ntouch ran\n")
        fake.chmod(0o755)
        env = env_without_library()
        env["PATH"] = f"{self.dir}:{env['PATH']}"
        self.path.write_text("# settings for the remote ranks\nNCCL_IB_HCA=mlx5\n")
        r = fp8wire_cli("run", "--", "deepspeed", "train.py", env=env, cwd=self.dir)
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn(".deepspeed_env:1: '# settings for the remote ranks' is not KEY=VALUE", r.stderr)
        self.assertNotIn("preloading", r.stderr)
        self.assertFalse((self.dir / "ran").exists())

    def test_home_file_with_other_settings_is_reported(self):
        home = self.dir / "home_env"
        home.write_text("FP8WIRE_ENABLE=0\nOTHER=1\n")
        notes = launch.sync_deepspeed_env(self.path, {"LD_PRELOAD": "/a.so"}, home)
        self.assertTrue(any("also sets FP8WIRE_ENABLE" in n for n in notes), notes)

    def test_run_writes_the_file_for_deepspeed(self):
        fake = self.dir / "deepspeed"  # stands in for deepspeed's runner: prints what it was given
        fake.write_text("#!/bin/sh\necho \"LD_PRELOAD=$LD_PRELOAD\"\n")
        fake.chmod(0o755)
        env = env_without_library(FP8WIRE_LOG_LEVEL="warn")
        env["PATH"] = f"{self.dir}:{env['PATH']}"
        r = fp8wire_cli("run", "--", "deepspeed", "train.py", env=env, cwd=self.dir)
        self.assertEqual(r.returncode, 0, r.stderr)
        lines = self.path.read_text().splitlines()
        self.assertIn(f"LD_PRELOAD={fp8wire.lib_path()}", lines)
        self.assertIn("FP8WIRE_LOG_LEVEL=warn", lines)
        self.assertIn(f"LD_PRELOAD={fp8wire.lib_path()}", r.stdout)
        r = fp8wire_cli("run", "--no-deepspeed-env", "--", "deepspeed", env=env, cwd=self.dir)
        self.assertNotIn(".deepspeed_env", r.stderr)


class InProcess(unittest.TestCase):
    def test_harmless_without_the_library(self):
        self.assertFalse(fp8wire.loaded())
        self.assertFalse(fp8wire.active())
        t = fp8wire.totals()
        self.assertFalse(t.loaded)
        self.assertEqual((t.fp8_calls, t.total_calls, t.calls), (0, 0, {}))
        self.assertEqual((t.direct_calls, t.transport_calls, fp8wire.transport_names()), (0, {}, {}))
        self.assertEqual((t.errors, t.guard, t.by_kind), ({}, {}, {}))
        with fp8wire.step(3):
            pass
        fp8wire.profiler_flush()

    def test_with_the_library_preloaded(self):
        code = textwrap.dedent("""
            import json, fp8wire
            with fp8wire.step(1):
                pass
            t = fp8wire.totals()
            print(json.dumps({"loaded": fp8wire.loaded(), "active": fp8wire.active(),
                              "paths": sorted(t.calls), "fp8": t.fp8_calls, "names": fp8wire.path_names(),
                              "fp8_paths": sorted(fp8wire.fp8_paths()),
                              "transports": fp8wire.transport_names(), "by_transport": t.transport_calls,
                              "direct": t.direct_calls, "errors": t.errors, "guard": t.guard,
                              "by_kind": t.by_kind, "dict": sorted(t.to_dict())}))
        """)
        r = fp8wire_cli("run", "--", sys.executable, "-c", code)
        self.assertEqual(r.returncode, 0, r.stderr)
        import json
        got = json.loads(r.stdout)
        # Loaded, but not able to act: no NCCL in this process (nor, in CI, a GPU).
        self.assertTrue(got["loaded"])
        self.assertFalse(got["active"])
        # Names come from the library (fp8wire_path_name), slot by slot, none invented here.
        self.assertEqual(sorted(got["names"].values()), got["paths"])
        self.assertIn("passthrough", got["paths"])
        self.assertIn("two_shot", got["fp8_paths"])
        self.assertNotIn("passthrough", got["fp8_paths"])
        self.assertNotIn("fallback", got["fp8_paths"])
        self.assertEqual(got["fp8"], 0)
        # Transports by the library's names; nothing carried, so no direct calls.
        self.assertEqual(sorted(got["transports"].values()), ["host_memory", "nccl", "peer_memory"])
        self.assertEqual(sorted(got["by_transport"]), sorted(got["transports"].values()))
        self.assertEqual(got["direct"], 0)
        # Telemetry through fp8wire_get_error_totals: nothing measured in a job without collectives.
        self.assertEqual((got["errors"], got["guard"], got["by_kind"]), ({}, {}, {}))
        self.assertIn("errors", got["dict"])
        self.assertIn("by_kind", got["dict"])
        r = fp8wire_cli("run", "--", sys.executable, "-c", "import fp8wire; print(fp8wire.active())",
                        env=env_without_library(FP8WIRE_ENABLE="0"))
        self.assertEqual(r.stdout.strip(), "False", r.stderr)


def fake_nccl():
    """The build tree's fake NCCL (tests/shim), or None when this is not run from a build tree."""
    shim = os.environ.get("FP8WIRE_SHIM_LIB")
    fake = Path(shim).resolve().parents[1] / "tests" / "shim" / "fake_nccl" / "libnccl.so.2" if shim else None
    return fake if fake is not None and fake.is_file() else None


class TotalsByKind(unittest.TestCase):
    """fp8wire.totals().by_kind: every call by the NCCL function the job called, through the library
    preloaded over the build tree's fake NCCL."""

    def test_calls_bytes_and_plain_nccl_bytes_per_function(self):
        fake = fake_nccl()
        if fake is None:
            self.skipTest("the build tree's fake NCCL (tests/shim) is not here")
        code = textwrap.dedent(f"""
            import ctypes, json, fp8wire
            ctypes.CDLL({str(fake)!r}, mode=ctypes.RTLD_GLOBAL)
            nccl = ctypes.CDLL(None)  # the preloaded library's entry points first

            class UniqueId(ctypes.Structure):
                _fields_ = [("internal", ctypes.c_char * 128)]

            comm, p = ctypes.c_void_p(), ctypes.c_void_p
            nccl.ncclCommInitRank.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_int, UniqueId, ctypes.c_int]
            nccl.ncclAllReduce.argtypes = [p, p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, p, p]
            nccl.ncclSend.argtypes = [p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, p, p]
            rc = [nccl.ncclCommInitRank(ctypes.byref(comm), 2, UniqueId(), 0)]
            float32, bf16 = 7, 9
            for _ in range(2):
                rc.append(nccl.ncclAllReduce(0x1000, 0x100000, 1000, float32, 0, comm, None))
            rc.append(nccl.ncclSend(0x1000, 500, bf16, 1, comm, None))
            print(json.dumps({{"rc": rc, "by_kind": fp8wire.totals().by_kind}}))
        """)
        r = fp8wire_cli("run", "--", sys.executable, "-c", code, env=env_without_library())
        self.assertEqual(r.returncode, 0, r.stderr)
        import json
        got = json.loads(r.stdout.strip().splitlines()[-1])
        self.assertEqual(got["rc"], [0, 0, 0, 0], r.stderr)
        by_kind = got["by_kind"]
        # Below every threshold, so plain NCCL's calls: counted by function, nothing in FP8.
        self.assertEqual(sorted(by_kind), ["all_reduce", "send"])
        ar, send = by_kind["all_reduce"], by_kind["send"]
        self.assertEqual((sum(ar["calls"].values()), ar["fp8_calls"], ar["app_bytes"]), (2, 0, 8000))
        # NCCL's ring moves 2(n-1)/n of the buffer at 2 ranks; a message its own bytes.
        self.assertEqual(ar["plain_wire_bytes"], 8000)
        self.assertEqual((sum(send["calls"].values()), send["app_bytes"], send["plain_wire_bytes"]), (1, 1000, 1000))


def cuda_driver_present() -> bool:
    import ctypes
    try:
        ctypes.CDLL("libcuda.so.1")
        return True
    except OSError:
        return False


class Active(unittest.TestCase):
    """fp8wire.active() is True only where the loaded library is able to act: NCCL in the process and
    a CUDA driver on the machine (before the first NCCL call; after it, a GPU the driver sees)."""

    def active_in_job(self, code, **env):
        r = fp8wire_cli("run", "--", sys.executable, "-c", "import fp8wire\n" + code + "\nprint(fp8wire.active())",
                        env=env_without_library(**env))
        self.assertEqual(r.returncode, 0, r.stderr)
        return r.stdout.strip().splitlines()[-1]

    def test_no_nccl_in_the_process(self):
        self.assertEqual(self.active_in_job(""), "False")

    def test_nccl_loaded_needs_a_gpu_driver(self):
        fake = fake_nccl()
        if fake is None:
            self.skipTest("the build tree's fake NCCL (tests/shim) is not here")
        got = self.active_in_job(f"import ctypes; ctypes.CDLL({str(fake)!r}, mode=ctypes.RTLD_GLOBAL)")
        self.assertEqual(got, str(cuda_driver_present()))
        # The configuration still decides first.
        self.assertEqual(self.active_in_job(f"import ctypes; ctypes.CDLL({str(fake)!r}, mode=ctypes.RTLD_GLOBAL)",
                                            FP8WIRE_ENABLE="0"), "False")


class Cli(unittest.TestCase):
    def test_run_profile_without_a_gpu_gives_the_jobs_status(self):
        # CUDA_VISIBLE_DEVICES= hides any GPU: the profiler records nothing, says so once, and the
        # job's own status comes back (not a missing report's).
        with tempfile.TemporaryDirectory() as d:
            for status in (0, 3):
                r = fp8wire_cli("run", "--profile", d, "--", sys.executable, "-c",
                                f"import sys; print(1); sys.exit({status})",
                                env=env_without_library(CUDA_VISIBLE_DEVICES=""))
                self.assertEqual(r.returncode, status, r.stderr)
                self.assertEqual(r.stdout.strip(), "1")
                self.assertEqual(r.stderr.count("fp8wire-prof: no GPU: the profiler recorded nothing"), 1, r.stderr)
                self.assertNotIn("no per-rank reports", r.stderr)
                if not cuda_driver_present():
                    self.assertNotIn("CUPTI", r.stderr)

    def test_run_refuses_a_bad_configuration(self):
        with tempfile.TemporaryDirectory() as d:
            bad = Path(d) / "bad.toml"
            bad.write_text("block_size = 7\n")
            marker = Path(d) / "ran"
            r = fp8wire_cli("run", "--config", str(bad), "--", "touch", str(marker))
            self.assertEqual(r.returncode, 2)
            self.assertIn("block_size", r.stderr)
            self.assertIn("the job was not started", r.stderr)
            self.assertFalse(marker.exists())
        r = fp8wire_cli("run", "--config", "/nonexistent.toml", "--", "true")
        self.assertEqual((r.returncode, r.stderr.strip()), (2, "fp8wire: --config /nonexistent.toml: no such file"))
        r = fp8wire_cli("run", "--", "no-such-command-here")
        self.assertEqual((r.returncode, r.stderr.strip()), (2, "fp8wire: command not found: no-such-command-here"))
        r = fp8wire_cli("run")
        self.assertEqual(r.returncode, 2)
        self.assertIn("give the command to run after --", r.stderr)

    def test_run_says_what_is_wrong_with_each_path(self):
        with tempfile.TemporaryDirectory() as d:
            # A folder given as the configuration (fp8wire bench sweep's --out, say), not "no such file".
            r = fp8wire_cli("run", "--config", d, "--", "true")
            self.assertEqual(r.returncode, 2)
            self.assertEqual((r.returncode, r.stderr.strip()), (2, f"fp8wire: --config {d}: is a directory (expected a TOML file)"))
            (Path(d) / "fp8wire-profile.toml").write_text("")
            r = fp8wire_cli("run", "--config", d, "--", "true")
            self.assertIn(f"is a directory (expected a TOML file; did you mean {Path(d).resolve()}/fp8wire-profile.toml?)",
                          r.stderr)
            r = fp8wire_cli("run", "--config", "", "--", "true")
            self.assertEqual((r.returncode, r.stderr.strip()),
                             (2, "fp8wire: --config: an empty path was given (expected a TOML file)"))
            # A script without its x bit exists: "command not found" would send the user looking for it.
            script = Path(d) / "train.sh"
            script.write_text("#!/bin/sh\ntrue\n")
            r = fp8wire_cli("run", "--", str(script))
            self.assertEqual(r.returncode, 2)
            self.assertIn(f"fp8wire: cannot run {script}: {script} is not executable (chmod +x", r.stderr)
            env = env_without_library()
            env["PATH"] = f"{d}:{env['PATH']}"
            r = fp8wire_cli("run", "--", "train.sh", env=env)
            self.assertIn(f"cannot run train.sh: {script} is not executable", r.stderr)
            r = fp8wire_cli("run", "--", d)
            self.assertIn(f"cannot run {d}: {d} is a directory", r.stderr)
            # An empty --profile would profile into whatever folder the job runs in.
            marker = Path(d) / "ran"
            r = fp8wire_cli("run", "--profile", "", "--", "touch", str(marker))
            self.assertEqual(r.returncode, 2)
            self.assertIn("fp8wire: --profile: an empty path was given (expected a folder for the reports", r.stderr)
            self.assertFalse(marker.exists())
            r = fp8wire_cli("run", "--profile", str(script), "--", "true")
            self.assertEqual(r.returncode, 2)
            self.assertIn(f"--profile {script}: exists and is not a directory", r.stderr)

    def test_run_profile_messages_name_only_the_options_given(self):
        # The reports go through fp8wire-prof --out; the user gave --profile, so that is what an error
        # names, before the job is announced.
        with tempfile.TemporaryDirectory() as d:
            blocker = Path(d) / "file"
            blocker.write_text("")
            r = fp8wire_cli("run", "--profile", str(blocker / "prof"), "--", "true")
            self.assertEqual((r.returncode, r.stderr.strip()),
                             (2, f"fp8wire: --profile {blocker / 'prof'}: {blocker} is not a directory (expected a "
                                 "folder for the reports)"))
            # fp8wire-prof's own messages about the folder name no option at all.
            r = fp8wire_cli("prof", "--out", str(blocker / "prof"), "--", "true")
            self.assertEqual(r.returncode, 2)
            self.assertIn(f"fp8wire-prof: reports: cannot create the folder '{blocker / 'prof'}'", r.stderr)
            self.assertNotIn("--out", r.stderr)

    def test_run_passes_the_configuration_and_status(self):
        with tempfile.TemporaryDirectory() as d:
            good = Path(d) / "good.toml"
            good.write_text("block_size = 64\n")
            r = fp8wire_cli("run", "--config", str(good), "--", "sh", "-c", 'echo "$FP8WIRE_CONFIG"; exit 5')
            self.assertEqual(r.returncode, 5)
            self.assertEqual(r.stdout.strip(), str(good.resolve()))
            self.assertIn(f"FP8WIRE_CONFIG={good.resolve()}", r.stderr)

    def test_lib_config_version(self):
        r = fp8wire_cli("lib")
        self.assertEqual((r.returncode, r.stdout.strip()), (0, fp8wire.lib_path()))
        r = fp8wire_cli("lib", "--profiler")
        self.assertEqual(r.stdout.strip(), str(fp8wire.profiler_library()))
        r = fp8wire_cli("config", "--check")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("block_size = 128", r.stdout)
        r = fp8wire_cli("config", "--check", env=env_without_library(FP8WIRE_FORMT="e4m3"))
        self.assertEqual(r.returncode, 1)
        self.assertIn("FP8WIRE_FORMT", r.stderr)
        self.assertEqual(fp8wire_cli("config", "--defaults").returncode, 0)
        r = fp8wire_cli("version")
        self.assertIn(f"fp8wire {fp8wire.__version__}", r.stdout)

    def test_each_tool_without_a_gpu_one_line_and_a_status(self):
        env = env_without_library(CUDA_VISIBLE_DEVICES="")
        r = fp8wire_cli("bench", "sweep", "--emulate-ranks", "2", "--out", tempfile.gettempdir(), env=env)
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertEqual(r.stderr.strip().splitlines()[-1][:44], "fp8wire-bench sweep: no CUDA device visible;")
        self.assertEqual(fp8wire_cli("bench", "model", "--hierarchy", env=env).returncode, 0)
        with tempfile.TemporaryDirectory() as d:
            trace = Path(d) / "empty.json"
            trace.write_text('{"traceEvents": []}')
            r = fp8wire_cli("prof", "analyze", str(trace), env=env)
            self.assertEqual(r.returncode, 1)
            self.assertIn("no step windows", r.stderr)
        # A configuration error names the command a pip install has.
        r = fp8wire_cli("config", "--check", env=env_without_library(FP8WIRE_BLOK_SIZE="64"))
        self.assertEqual(r.returncode, 1)
        self.assertIn("`fp8wire config --defaults`", r.stderr)

    def test_a_tool_the_loader_cannot_start_is_named_with_its_library(self):
        with tempfile.TemporaryDirectory() as d:
            fake = Path(d) / "fp8wire-bench"
            fake.write_text("#!/bin/sh\necho \"$0: error while loading shared libraries: libnccl.so.2: cannot open "
                            "shared object file: No such file or directory\" >&2\nexit 127\n")
            fake.chmod(0o755)
            with self.assertRaisesRegex(fp8wire.NotInstalled, r"fp8wire-bench cannot start: libnccl.so.2 not found "
                                                              r"\(NCCL: install PyTorch built for CUDA"):
                launch.check_loadable(fake, os.environ)
            fake.write_text("#!/bin/sh\nexit 0\n")
            launch.check_loadable(fake, os.environ)  # starts: nothing to say

    def test_a_failed_run_leaves_no_folder_it_created(self):
        env = env_without_library(CUDA_VISIBLE_DEVICES="")
        with tempfile.TemporaryDirectory() as d:
            out = Path(d) / "new" / "prof"
            r = fp8wire_cli("run", "--profile", str(out), "--", "sh", "-c", "exit 3", env=env)
            self.assertEqual(r.returncode, 3, r.stderr)
            self.assertFalse((Path(d) / "new").exists(), "fp8wire run --profile left its empty folder")
            r = fp8wire_cli("prof", "--out", str(out), "--", "no-such-command-here", env=env)
            self.assertEqual(r.returncode, 127, r.stderr)
            self.assertIn("cannot run 'no-such-command-here'", r.stderr)
            self.assertFalse((Path(d) / "new").exists(), "fp8wire prof left its empty folder")
            # What the job wrote there stays, and so does the folder holding it.
            r = fp8wire_cli("prof", "--out", str(out), "--", "sh", "-c", f"touch {out}/mine", env=env)
            self.assertTrue((out / "mine").is_file(), r.stderr)
            # A folder that existed before stays too, empty or not.
            existing = Path(d) / "existing"
            existing.mkdir()
            fp8wire_cli("prof", "--out", str(existing), "--", "true", env=env)
            self.assertTrue(existing.is_dir())
            # A sweep that cannot start (no GPU) makes no folder for its results.
            r = fp8wire_cli("bench", "sweep", "--emulate-ranks", "2", "--out", str(Path(d) / "sweep" / "out"), env=env)
            self.assertEqual(r.returncode, 2, r.stderr)
            self.assertFalse((Path(d) / "sweep").exists(), "fp8wire bench sweep left its empty folder")

    def test_prof_shim_refuses_an_invalid_configuration(self):
        # As fp8wire run does: with it, every rank would run libfp8wire.so in pass-through.
        with tempfile.TemporaryDirectory() as d:
            marker, out = Path(d) / "ran", Path(d) / "prof"
            r = fp8wire_cli("prof", "--shim", "--out", str(out), "--", "touch", str(marker),
                            env=env_without_library(FP8WIRE_BLOCK_SIZE="7"))
            self.assertEqual(r.returncode, 2, r.stderr)
            self.assertIn("FP8WIRE_BLOCK_SIZE", r.stderr)
            self.assertIn("fp8wire-prof: the configuration above is invalid; the job was not started", r.stderr)
            self.assertFalse(marker.exists())
            self.assertFalse(out.exists())
            bad = Path(d) / "bad.toml"
            bad.write_text("[cost_model.net]\nhosts = 1.5\n")
            r = fp8wire_cli("prof", "--shim", "--out", str(out), "--", "touch", str(marker),
                            env=env_without_library(FP8WIRE_CONFIG=str(bad)))
            self.assertEqual(r.returncode, 2, r.stderr)
            self.assertIn("cost_model.net.hosts", r.stderr)
            self.assertFalse(marker.exists())
            # Without --shim the job is not fp8wire's to refuse: it runs under the profiler alone.
            r = fp8wire_cli("prof", "--out", str(out), "--", "touch", str(marker),
                            env=env_without_library(FP8WIRE_BLOCK_SIZE="7", CUDA_VISIBLE_DEVICES=""))
            self.assertTrue(marker.exists(), r.stderr)

    def test_config_check_and_defaults_are_one_or_the_other(self):
        with tempfile.TemporaryDirectory() as d:
            bad = Path(d) / "bad.toml"
            bad.write_text("block_size = 7\n")
            r = fp8wire_cli("config", "--defaults", "--check", str(bad))
            self.assertEqual(r.returncode, 2)
            self.assertIn("not allowed with argument", r.stderr)
            self.assertEqual(r.stdout, "")
            # The program itself, as a build tree has it.
            r = subprocess.run([str(fp8wire.tool("fp8wire-config")), "--defaults", "--check", str(bad)],
                               capture_output=True, text=True)
            self.assertEqual((r.returncode, r.stdout), (2, ""))
            self.assertIn("fp8wire-config: --check excludes --defaults", r.stderr)
            # A file that cannot be read is a failed check (1) with its reason, like any other.
            r = fp8wire_cli("config", "--check", d)
            self.assertEqual(r.returncode, 1)
            self.assertIn("it is a directory", r.stderr)
            r = fp8wire_cli("config", "--check", str(Path(d) / "missing.toml"))
            self.assertEqual(r.returncode, 1)
            self.assertIn("No such file or directory", r.stderr)

    def test_usage_errors_name_the_tool_and_exit_2(self):
        # The tools' command-line errors read like every other refusal: the tool's name, status 2.
        cases = [(("bench",), "fp8wire-bench: A subcommand is required"),
                 (("bench", "report", "/nonexistent.json"), "fp8wire-bench report: sweeps: File does not exist: /nonexistent.json"),
                 (("bench", "sweep", "--ranks", "0"), "fp8wire-bench sweep: The following arguments were not expected"),
                 (("prof", "analyze", "/nonexistent.json"), "fp8wire-prof analyze: trace: File does not exist: /nonexistent.json"),
                 (("prof", "--top", "0", "--", "true"), "fp8wire-prof: --top: Value 0 not in range 1 to 100000")]
        for args, expected in cases:
            with self.subTest(args=args):
                r = fp8wire_cli(*args, env=env_without_library(CUDA_VISIBLE_DEVICES=""))
                self.assertEqual(r.returncode, 2, r.stderr)
                self.assertIn(expected, r.stderr)
                self.assertIn(f"Run `fp8wire {args[0]}", r.stderr)

    def test_help_shows_the_command_the_user_typed(self):
        for args, usage in ((("bench", "--help"), "Usage: fp8wire bench "),
                            (("bench", "sweep", "--help"), "Usage: fp8wire bench sweep "),
                            (("prof", "--help"), "Usage: fp8wire prof "),
                            (("prof", "report", "--help"), "Usage: fp8wire prof report ")):
            with self.subTest(args=args):
                r = fp8wire_cli(*args)
                self.assertEqual(r.returncode, 0, r.stderr)
                self.assertIn(usage, r.stdout)
                self.assertNotIn(str(fp8wire.tool("fp8wire-bench").parent), r.stdout)

    def test_tools_pass_through(self):
        self.assertIn("fp8wire-bench", fp8wire_cli("bench", "--help").stdout)
        r = fp8wire_cli("prof", "report", "/nonexistent-dir")
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("no per-rank reports", r.stderr)


if __name__ == "__main__":
    unittest.main(verbosity=2)
