"""`fp8wire run`: start a job with libfp8wire.so preloaded in every process it starts.

Launchers that start their ranks on this host (torchrun, deepspeed on one node, mpirun -np N,
python) pass their own environment down, so LD_PRELOAD and the FP8WIRE_* settings exported to the
launcher reach every rank. DeepSpeed's runner across several nodes is different: it starts remote
ranks over pdsh/ssh/MPI with only the variables named NCCL*, PYTHON*, UCX*, MV2*, MLFLOW* and the
lines of .deepspeed_env (read from ~ and then from the current folder; the file name can be changed
with DS_ENV_FILE), so for a deepspeed command fp8wire also writes, or checks, ./.deepspeed_env."""
from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from . import __version__
from ._paths import NotInstalled, profiler_library, shim_library, tool

# The variables fp8wire-prof gives the job besides LD_PRELOAD (profiler/fp8wire_prof_main.cpp,
# run_job); the package's tests compare the two.
PROFILER_VARIABLES = ("NVTX_INJECTION64_PATH", "FP8WIRE_PROFILER_ENABLE", "FP8WIRE_PROFILER_OUTPUT")


class UsageError(Exception):
    """Bad input from the user: printed as one line, exit status 2."""


def prepend_paths(front: Sequence[str], existing: Optional[str]) -> str:
    """`front` then the entries of a colon-separated list that are not already in `front`."""
    rest = [p for p in (existing or "").replace(" ", ":").split(":") if p and p not in front]
    return ":".join(list(front) + rest)


def job_environment(base: Mapping[str, str], *, config: Optional[Path] = None,
                    profile_dir: Optional[Path] = None) -> Dict[str, str]:
    """The environment every rank must see: LD_PRELOAD with libfp8wire.so first (and the profiler's
    library and variables with profile_dir), FP8WIRE_CONFIG when a file is given, the rest of `base`."""
    env = dict(base)
    libs = [str(shim_library())]
    if config is not None:
        env["FP8WIRE_CONFIG"] = str(config)
    if profile_dir is not None:
        prof = str(profiler_library())
        libs.append(prof)
        env["NVTX_INJECTION64_PATH"] = prof
        env["FP8WIRE_PROFILER_ENABLE"] = "1"
        env["FP8WIRE_PROFILER_OUTPUT"] = str(profile_dir) + "/"
    env["LD_PRELOAD"] = prepend_paths(libs, env.get("LD_PRELOAD"))
    return env


def check_configuration(env: Mapping[str, str]) -> Optional[str]:
    """Validates FP8WIRE_CONFIG plus the FP8WIRE_* variables with fp8wire-config, as the library will
    read them. Returns the errors as text, or None when valid. A bad configuration would otherwise
    only be logged by each rank while the job trains without FP8."""
    try:
        config_tool = tool("fp8wire-config")
    except NotInstalled:
        return None  # the library still reports errors itself at start-up
    clean = {k: v for k, v in env.items() if k != "LD_PRELOAD"}
    r = subprocess.run([str(config_tool)], env=clean, capture_output=True, text=True)
    if r.returncode == 0:
        return None
    return (r.stderr or r.stdout).strip() or f"fp8wire-config exited with status {r.returncode}"


# --- DeepSpeed across nodes ---------------------------------------------------------------------

def is_deepspeed(command: Sequence[str]) -> bool:
    """deepspeed / ds, or python -m deepspeed.launcher.runner."""
    name = os.path.basename(command[0]) if command else ""
    if name in ("deepspeed", "ds"):
        return True
    return (name.startswith("python") and len(command) >= 3 and command[1] == "-m"
            and command[2].startswith("deepspeed.launcher"))


def deepspeed_env_name(env: Mapping[str, str]) -> str:
    return env.get("DS_ENV_FILE", ".deepspeed_env")


def deepspeed_exports(job_env: Mapping[str, str]) -> Dict[str, str]:
    """What remote ranks need from .deepspeed_env: LD_PRELOAD, every FP8WIRE_* setting and, when
    profiling, the profiler's injection path."""
    wanted = {"LD_PRELOAD": job_env["LD_PRELOAD"]}
    for key in sorted(job_env):
        if key.startswith("FP8WIRE_"):
            wanted[key] = job_env[key]
    if "NVTX_INJECTION64_PATH" in job_env and job_env.get("FP8WIRE_PROFILER_ENABLE") == "1":
        wanted["NVTX_INJECTION64_PATH"] = job_env["NVTX_INJECTION64_PATH"]
    for key, value in wanted.items():
        if "\n" in value:
            raise UsageError(f"{key} holds a line break, which .deepspeed_env cannot carry")
    return wanted


def _managed(key: str, value: str) -> bool:
    """Lines of .deepspeed_env that fp8wire owns (rewritten to match the launch)."""
    if key == "LD_PRELOAD" or key.startswith("FP8WIRE_"):
        return True
    return key == "NVTX_INJECTION64_PATH" and value.strip().endswith("libfp8wire_prof.so")


def parse_deepspeed_env(text: str, where: str, skip_blank: bool = False) -> List[Tuple[str, str]]:
    """KEY=VALUE lines, the way DeepSpeed's runner splits them. A line without '=' (a blank line
    too, unless skip_blank) makes the runner fail, so it is an error here as well."""
    pairs = []
    for n, line in enumerate(text.splitlines(), 1):
        if skip_blank and not line.strip():
            continue
        if "=" not in line:
            raise UsageError(f"{where}:{n}: {line!r} is not KEY=VALUE (deepspeed's runner fails on it, and "
                             "comments too; remove the line)")
        key, value = line.split("=", 1)
        pairs.append((key.strip(), value))
    return pairs


def sync_deepspeed_env(path: Path, wanted: Mapping[str, str], home_file: Optional[Path] = None) -> List[str]:
    """Makes `path` carry exactly `wanted` for the keys fp8wire owns, keeping every other line but
    blank ones, which DeepSpeed's runner cannot read and which carry nothing. Returns the lines to
    print (what was written or checked, and warnings)."""
    notes = []
    old_text = path.read_text() if path.exists() else None
    kept = []
    blank = 0
    if old_text is not None:
        blank = sum(1 for line in old_text.splitlines() if not line.strip())
        for key, value in parse_deepspeed_env(old_text, str(path), skip_blank=True):
            if not _managed(key, value):
                kept.append(f"{key}={value}")
    new_text = "".join(line + "\n" for line in kept + [f"{k}={v}" for k, v in wanted.items()])
    shown = f"./{path.name}" if path.parent.resolve() == Path.cwd().resolve() else str(path)
    keys = ", ".join(wanted)
    if old_text == new_text:
        notes.append(f"fp8wire: {shown} already carries {keys} for ranks on other nodes")
    else:
        tmp = path.with_name(path.name + ".fp8wire-tmp")
        tmp.write_text(new_text)
        os.replace(tmp, path)
        verb = "updated" if old_text is not None else "wrote"
        removed = (f"; removed {blank} blank line{'s' if blank > 1 else ''}, which deepspeed's runner cannot read"
                   if blank else "")
        notes.append(f"fp8wire: {verb} {shown} ({keys}) for ranks deepspeed starts on other nodes{removed}")
    if home_file is not None and home_file.exists() and home_file.resolve() != path.resolve():
        try:
            stale = [k for k, v in parse_deepspeed_env(home_file.read_text(), str(home_file))
                     if _managed(k, v) and k not in wanted]
        except UsageError as e:
            stale, notes = [], notes + [f"fp8wire: warning: {e}"]
        if stale:
            notes.append(f"fp8wire: warning: {home_file} also sets {', '.join(stale)}, which every remote rank "
                         "gets too; remove it there or set it here")
    return notes


# --- fp8wire run ----------------------------------------------------------------------------------

def _describe(env: Mapping[str, str], config: Optional[Path], profile_dir: Optional[Path]) -> str:
    settings = [k for k in env if k.startswith("FP8WIRE_") and k not in
                ("FP8WIRE_CONFIG", "FP8WIRE_SHIM_LIB", "FP8WIRE_PROF_LIB") + PROFILER_VARIABLES]
    parts = []
    if env.get("FP8WIRE_CONFIG"):
        parts.append(f"FP8WIRE_CONFIG={env['FP8WIRE_CONFIG']}")
    if settings:
        parts.append(f"{len(settings)} FP8WIRE_* variable{'s' if len(settings) > 1 else ''}")
    configuration = " + ".join(parts) if parts else "built-in defaults"
    profiler = f"reports in {profile_dir}" if profile_dir else "off"
    return f"configuration: {configuration}; profiler: {profiler}"


def config_file(config: str) -> Path:
    """The file given to --config, resolved; a UsageError saying what it is when it is no file."""
    if not config:
        raise UsageError("--config: an empty path was given (expected a TOML file)")
    path = Path(config).expanduser().resolve()
    if path.is_dir():
        # Often the folder a sweep wrote, which holds the profile meant.
        inside = path / "fp8wire-profile.toml"
        hint = f"; did you mean {inside}?" if inside.is_file() else ""
        raise UsageError(f"--config {config}: is a directory (expected a TOML file{hint})")
    if not path.exists():
        raise UsageError(f"--config {config}: no such file")
    if not path.is_file():
        raise UsageError(f"--config {config}: not a regular file (expected a TOML file)")
    return path


def profile_folder(profile: str) -> Path:
    """The folder given to --profile, resolved. An empty path would put the reports wherever the job
    happens to run, so it is refused, as is one that fp8wire-prof could not create: found here, the
    error names --profile and comes before the job is announced."""
    if not profile:
        raise UsageError("--profile: an empty path was given (expected a folder for the reports, e.g. out/prof)")
    path = Path(profile).expanduser().resolve()
    existing = next(p for p in (path, *path.parents) if p.exists())
    if not existing.is_dir():
        where = "exists and is not a directory" if existing == path else f"{existing} is not a directory"
        raise UsageError(f"--profile {profile}: {where} (expected a folder for the reports)")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise UsageError(f"--profile {profile}: {existing} is not writable (expected a folder for the reports)")
    return path


def check_command(name: str, path: Optional[str]) -> None:
    """A UsageError unless `name` can be started: not found, or found but not executable (which is
    what a script without its x bit is, and `command not found` would send the user looking for it)."""
    if shutil.which(name, path=path) is not None:
        return
    if os.sep in name:
        candidates = [name]
    else:
        candidates = [os.path.join(d, name) for d in (path if path is not None else os.defpath).split(os.pathsep) if d]
    for candidate in candidates:
        if os.path.isdir(candidate):
            raise UsageError(f"cannot run {name}: {candidate} is a directory")
        if os.path.isfile(candidate):
            raise UsageError(f"cannot run {name}: {candidate} is not executable (chmod +x {candidate}, or put "
                             f"its interpreter first, e.g. -- python3 {name} or -- sh {name})")
    raise UsageError(f"command not found: {name}")


def run(command: Sequence[str], *, config: Optional[str] = None, profile: Optional[str] = None,
        deepspeed_env: bool = True, base_env: Optional[Mapping[str, str]] = None) -> int:
    """Replaces this process with `command`, libfp8wire.so preloaded. Returns only on failure.
    Every input is checked before the job is announced, so a refused job never looks started."""
    if not command:
        raise UsageError("give the command to run after --, e.g. fp8wire run -- torchrun --nproc_per_node=8 train.py")
    env = dict(os.environ if base_env is None else base_env)
    config_path = None
    if config is not None:
        config_path = config_file(config)
        env["FP8WIRE_CONFIG"] = str(config_path)
    profile_dir = profile_folder(profile) if profile is not None else None

    check_command(command[0], env.get("PATH"))
    errors = check_configuration(env)
    if errors:
        print(errors, file=sys.stderr)
        raise UsageError("the configuration above is invalid; the job was not started "
                         "(with it, every rank would train without FP8)")

    job_env = job_environment(env, config=None, profile_dir=profile_dir)
    notes = []
    if is_deepspeed(command) and deepspeed_env:
        name = deepspeed_env_name(env)
        notes = sync_deepspeed_env(Path(name) if os.path.isabs(name) else Path.cwd() / name,
                                   deepspeed_exports(job_env), Path.home() / name)

    preloaded = job_env["LD_PRELOAD"].split(":")[: 2 if profile_dir else 1]
    print(f"fp8wire {__version__}: preloading {' and '.join(preloaded)} into every process of "
          f"`{shlex.join(command)}` ({_describe(job_env, config_path, profile_dir)})", file=sys.stderr, flush=True)
    for line in notes:
        print(line, file=sys.stderr, flush=True)

    if profile_dir is not None:
        # fp8wire-prof sets the same preload and profiler variables, finds CUPTI, runs the job and
        # merges the ranks' reports when it ends.
        prof_env = dict(env)
        prof_env["FP8WIRE_SHIM_LIB"] = str(shim_library())
        prof_env["FP8WIRE_PROF_LIB"] = str(profiler_library())
        argv = [str(tool("fp8wire-prof")), "--shim", "--out", str(profile_dir), "--", *command]
        return _exec(argv, prof_env)
    return _exec(list(command), job_env)


def _exec(argv: List[str], env: Mapping[str, str], shown_as: Optional[str] = None) -> int:
    """Replaces this process with argv. shown_as: the program's argv[0] instead of its path (the
    command the user typed, which the tools' --help and messages then show)."""
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execvpe(argv[0], [shown_as or argv[0], *argv[1:]], dict(env))
    except FileNotFoundError:
        raise UsageError(f"command not found: {argv[0]}") from None
    except PermissionError:
        raise UsageError(f"cannot execute {argv[0]}: permission denied") from None
    return 127  # not reached


# --- pass-through to the tools --------------------------------------------------------------------

def nccl_library_dir() -> Optional[str]:
    """The lib folder of the NCCL pip package (nvidia-nccl-cu12/cu13) visible to this Python, the one
    PyTorch loads, found without importing torch."""
    import importlib.util

    try:
        spec = importlib.util.find_spec("nvidia.nccl")
    except (ImportError, ValueError):
        return None
    for location in (spec.submodule_search_locations or []) if spec else []:
        lib = os.path.join(location, "lib")
        if os.path.isfile(os.path.join(lib, "libnccl.so.2")):
            return lib
    return None


def check_loadable(program: Path, env: Mapping[str, str]) -> None:
    """Raises NotInstalled, naming the missing library, when `program` cannot start because the
    dynamic loader does not find a library it links (status 127); after an exec that would be the
    loader's own message, and no way to say more."""
    r = subprocess.run([str(program), "--help"], env=dict(env), capture_output=True, text=True)
    if r.returncode != 127 or "error while loading shared libraries" not in r.stderr:
        return
    missing = r.stderr.split("error while loading shared libraries:", 1)[1].split(":", 1)[0].strip()
    hint = (" (NCCL: install PyTorch built for CUDA, whose nvidia-nccl package holds it, or put the folder "
            "of libnccl.so.2 on LD_LIBRARY_PATH)") if missing.startswith("libnccl") else ""
    raise NotInstalled(f"{program.name} cannot start: {missing} not found{hint}")


def exec_tool(name: str, args: Sequence[str], shown_as: Optional[str] = None) -> int:
    """Runs one of the packaged tools in place of this process; shown_as is the command the user
    typed for it ("fp8wire bench")."""
    env = dict(os.environ)
    if name == "fp8wire-bench":
        # The benchmark links libnccl.so.2; use the NCCL of this Python's PyTorch when there is one,
        # so the benchmark measures what the job will run.
        lib = nccl_library_dir()
        if lib:
            env["LD_LIBRARY_PATH"] = prepend_paths([lib], env.get("LD_LIBRARY_PATH"))
        else:
            check_loadable(tool(name), env)
    if name == "fp8wire-prof":
        env.setdefault("FP8WIRE_SHIM_LIB", str(shim_library()))
        env.setdefault("FP8WIRE_PROF_LIB", str(profiler_library()))
    return _exec([str(tool(name)), *args], env, shown_as)
