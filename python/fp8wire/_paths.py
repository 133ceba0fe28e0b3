"""Where the installed libraries and tools are.

The wheel puts them inside this package (fp8wire/lib, fp8wire/bin). FP8WIRE_SHIM_LIB and
FP8WIRE_PROF_LIB name other copies (a CMake build tree, say); the tools are then also looked for
around that library, in an install's bin/ or a build tree's own folders."""
from __future__ import annotations

import os
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
SHIM_NAME = "libfp8wire.so"
PROF_NAME = "libfp8wire_prof.so"
TOOLS = ("fp8wire-config", "fp8wire-bench", "fp8wire-prof")


class NotInstalled(RuntimeError):
    """A library or tool of fp8wire is missing from this installation."""


def _override(variable: str) -> Path | None:
    value = os.environ.get(variable, "")
    if not value:
        return None
    path = Path(value).expanduser()
    if not path.is_file():
        raise NotInstalled(f"{variable}={value}: no such file")
    return path.resolve()


def shim_library() -> Path:
    """libfp8wire.so: $FP8WIRE_SHIM_LIB, else the package's own copy."""
    path = _override("FP8WIRE_SHIM_LIB") or PACKAGE_DIR / "lib" / SHIM_NAME
    if not path.is_file():
        raise NotInstalled(f"{path} is missing: this fp8wire package was installed without its libraries "
                           "(install the wheel, or set FP8WIRE_SHIM_LIB to a built libfp8wire.so)")
    return path


def profiler_library() -> Path:
    """libfp8wire_prof.so: $FP8WIRE_PROF_LIB, else beside libfp8wire.so, else the package's copy."""
    path = _override("FP8WIRE_PROF_LIB")
    if path:
        return path
    candidates = [PACKAGE_DIR / "lib" / PROF_NAME]
    shim = _override("FP8WIRE_SHIM_LIB")
    if shim:  # an install's lib/ or a build tree's shim/ beside profiler/
        candidates[:0] = [shim.parent / PROF_NAME, shim.parent.parent / "profiler" / PROF_NAME]
    for c in candidates:
        if c.is_file():
            return c
    raise NotInstalled(f"{PROF_NAME} not found (looked at {', '.join(map(str, candidates))}; "
                       "set FP8WIRE_PROF_LIB to its path)")


def tool(name: str) -> Path:
    """One of fp8wire-config, fp8wire-bench, fp8wire-prof."""
    if name not in TOOLS:
        raise ValueError(f"unknown tool {name!r} (expected one of {', '.join(TOOLS)})")
    candidates = [PACKAGE_DIR / "bin" / name]
    shim = _override("FP8WIRE_SHIM_LIB")
    if shim:
        # An install (lib/ beside bin/) or a build tree (shim/, bench/, profiler/ side by side).
        root = shim.parent.parent
        candidates += [root / "bin" / name, root / "shim" / name, root / "bench" / name, root / "profiler" / name]
    for c in candidates:
        if c.is_file() and os.access(c, os.X_OK):
            return c
    raise NotInstalled(f"{name} not found (looked at {', '.join(map(str, candidates))})")
