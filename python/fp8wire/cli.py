"""The `fp8wire` command.

  fp8wire run [--config FILE] [--profile DIR] -- <torchrun|deepspeed|python ...>
  fp8wire lib [--profiler]            path of libfp8wire.so (or libfp8wire_prof.so)
  fp8wire config [--check [FILE]] [--defaults]
  fp8wire bench ...                   fp8wire-bench (sweep, model, kernels, report)
  fp8wire prof ...                    fp8wire-prof (report DIR, analyze TRACE, -- cmd)
  fp8wire version
"""
from __future__ import annotations

import argparse
import sys
from typing import List, Optional

from . import __version__, library_version
from ._paths import NotInstalled, profiler_library, shim_library
from .launch import UsageError, exec_tool, run

_PASS_THROUGH = {"bench": "fp8wire-bench", "prof": "fp8wire-prof"}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="fp8wire", description="FP8 on the wire for NCCL collectives: launcher and tools",
                                epilog="bench and prof pass their arguments to fp8wire-bench and fp8wire-prof "
                                       "(fp8wire bench --help, fp8wire prof --help)")
    p.add_argument("--version", action="version", version=f"fp8wire {__version__}")
    sub = p.add_subparsers(dest="command", metavar="{run,lib,config,bench,prof,version}")

    r = sub.add_parser("run", help="start a job with libfp8wire.so preloaded in every rank",
                       description="Starts COMMAND with libfp8wire.so preloaded in every process it starts "
                                   "(torchrun's and deepspeed's ranks on this host included). For deepspeed it "
                                   "also writes or checks ./.deepspeed_env, which deepspeed's runner forwards to "
                                   "ranks on other nodes.")
    r.add_argument("--config", metavar="FILE", help="fp8wire configuration (TOML), passed as FP8WIRE_CONFIG")
    r.add_argument("--profile", metavar="DIR", help="also run the exposure profiler; reports are merged into DIR")
    r.add_argument("--no-deepspeed-env", action="store_true",
                   help="leave .deepspeed_env alone (then ranks on other nodes need LD_PRELOAD some other way)")
    r.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- COMMAND ...")

    lib = sub.add_parser("lib", help="print the path of libfp8wire.so, for launchers written by hand")
    lib.add_argument("--profiler", action="store_true", help="print libfp8wire_prof.so instead")

    c = sub.add_parser("config", help="check a configuration (fp8wire-config)",
                       description="Checks the configuration the library would read: FILE (or FP8WIRE_CONFIG) "
                                   "plus the FP8WIRE_* environment. Exit status 0 when valid.")
    # One or the other: --defaults prints the built-in values whatever a file says.
    which = c.add_mutually_exclusive_group()
    which.add_argument("--check", nargs="?", const="", metavar="FILE",
                       help="validate FILE (default: FP8WIRE_CONFIG, if set) and the environment; print the effective "
                            "configuration")
    which.add_argument("--defaults", action="store_true", help="print every key with its default")

    sub.add_parser("bench", help="the benchmark (fp8wire-bench), arguments passed through", add_help=False)
    sub.add_parser("prof", help="the exposure profiler's CLI (fp8wire-prof), arguments passed through", add_help=False)
    sub.add_parser("version", help="versions of the package and of the library loaded in this process")
    return p


def main(argv: Optional[List[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        # bench/prof take any arguments of their own; hand them over untouched.
        if argv and argv[0] in _PASS_THROUGH:
            return exec_tool(_PASS_THROUGH[argv[0]], argv[1:], shown_as=f"fp8wire {argv[0]}")
        parser = _parser()
        args = parser.parse_args(argv)
        if args.command == "run":
            cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
            return run(cmd, config=args.config, profile=args.profile, deepspeed_env=not args.no_deepspeed_env)
        if args.command == "lib":
            print(profiler_library() if args.profiler else shim_library())
            return 0
        if args.command == "config":
            if args.defaults:
                return exec_tool("fp8wire-config", ["--defaults"], shown_as="fp8wire config")
            return exec_tool("fp8wire-config", ["--check", args.check] if args.check else [], shown_as="fp8wire config")
        if args.command == "version":
            loaded = library_version()
            print(f"fp8wire {__version__} ({shim_library()})")
            print(f"loaded in this process: {loaded or 'no'}")
            return 0
        parser.print_help(sys.stderr)
        return 2
    except (UsageError, NotInstalled, OSError) as e:
        print(f"fp8wire: {e}", file=sys.stderr)
        return 2
