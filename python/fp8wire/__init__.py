"""fp8wire: FP8 on the wire for the NCCL collectives of PyTorch and DeepSpeed jobs.

Start a job with the library preloaded in every rank:

    fp8wire run -- torchrun --nproc_per_node=8 train.py

and, inside the job (all harmless when the library is not loaded):

    import fp8wire
    fp8wire.active()            # will eligible NCCL calls go FP8?
    with fp8wire.step(n): ...   # a step window for the exposure profiler
    fp8wire.totals().fp8_calls  # calls fp8wire carried itself, by path in .calls
    fp8wire.totals().direct_calls  # of all calls, those a direct transport carried (.transport_calls)
    fp8wire.feedback_key(k)     # error feedback: the next all-reduce on this thread is tensor k

No torch import happens here; the package works in any process of the job.
"""
from __future__ import annotations

import contextlib
import re
from pathlib import Path

from ._native import (UNCARRIED_PATHS, Totals, active, fp8_paths, library_version, loaded,  # noqa: F401
                      path_names, profiler_flush, totals, transport_names)
from ._native import set_feedback_key as _set_feedback_key
from ._native import step_begin as _step_begin
from ._native import step_end as _step_end
from ._paths import NotInstalled, profiler_library, shim_library, tool  # noqa: F401


def _version() -> str:
    try:  # written into the wheel when it is built
        from ._version import __version__ as v
        return v
    except ImportError:
        pass
    # A source checkout (python/fp8wire in the repository): the project() line is the one source.
    cmake = Path(__file__).resolve().parents[2] / "CMakeLists.txt"
    try:
        m = re.search(r"project\(fp8wire VERSION ([0-9][0-9.]*)", cmake.read_text())
        return m.group(1) if m else "unknown"
    except OSError:
        return "unknown"


__version__ = _version()


def lib_path() -> str:
    """Path of libfp8wire.so, for launchers written by hand (LD_PRELOAD=...)."""
    return str(shim_library())


@contextlib.contextmanager
def step(n: int):
    """Marks training step n for the exposure profiler (fp8wire_step_begin/end). Steps must not nest.
    Does nothing when the library or its profiler is not running."""
    _step_begin(n)
    try:
        yield
    finally:
        _step_end(n)


def feedback_key(key: int) -> None:
    """Error feedback (error_feedback.enable): the next all-reduce this thread issues carries `key`,
    the identity of its tensor (e.g. a DDP bucket index, key != 0). Its quantization residual is added
    to the next call with the same key, never to another tensor's. Nothing happens without the library."""
    _set_feedback_key(key)


def ddp_error_feedback_hook(process_group, bucket):
    """A DDP communication hook that all-reduces each bucket with its index as the feedback key:
    model.register_comm_hook(None, fp8wire.ddp_error_feedback_hook)."""
    import torch.distributed as dist  # only when a job registers the hook

    group = process_group if process_group is not None else dist.group.WORLD
    buffer = bucket.buffer()
    buffer.div_(dist.get_world_size(group))
    feedback_key(bucket.index() + 1)  # 0 means "no key"
    return dist.all_reduce(buffer, group=group, async_op=True).get_future().then(lambda f: f.value()[0])
