"""The C API of libfp8wire.so (shim/fp8wire.h), reached in this process through ctypes.

The library is not loaded by this module: `fp8wire run` (or LD_PRELOAD) preloads it, and its
symbols are then visible from the process's global scope. Without it every function here answers
"not loaded" and does nothing, so a training script can call them unconditionally."""
from __future__ import annotations

import ctypes
import threading
import warnings
from dataclasses import dataclass, field
from typing import Callable, Dict, Optional

# Fixed by the C API (FP8WIRE_MAX_PATHS in shim/fp8wire.h): the number of path slots in the totals.
MAX_PATHS = 16
# Likewise FP8WIRE_MAX_TRANSPORTS: transport slots of the transport totals.
MAX_TRANSPORTS = 8
# The two paths on which a call reached NCCL unchanged: not eligible, or eligible but the FP8 path
# could not run. Only for a library without fp8wire_path_is_fp8, which says it itself.
UNCARRIED_PATHS = ("passthrough", "fallback")


class _Totals(ctypes.Structure):
    _fields_ = [("calls", ctypes.c_uint64 * MAX_PATHS), ("app_bytes", ctypes.c_uint64 * MAX_PATHS),
                ("wire_bytes", ctypes.c_uint64 * MAX_PATHS), ("dropped_records", ctypes.c_uint64)]


class _TransportTotals(ctypes.Structure):
    _fields_ = [("calls", ctypes.c_uint64 * MAX_TRANSPORTS), ("app_bytes", ctypes.c_uint64 * MAX_TRANSPORTS),
                ("wire_bytes", ctypes.c_uint64 * MAX_TRANSPORTS)]


# FP8WIRE_MAX_COLLECTIVES in shim/fp8wire.h.
MAX_COLLECTIVES = 8
# FP8WIRE_MAX_CALL_KINDS: slots of the totals by the NCCL function called.
MAX_CALL_KINDS = 16


class _KindTotals(ctypes.Structure):
    # Versioned by `size` (fp8wire_kind_totals): the library fills what both layouts hold.
    _fields_ = [("size", ctypes.c_uint64), ("calls", (ctypes.c_uint64 * MAX_PATHS) * MAX_CALL_KINDS),
                ("app_bytes", ctypes.c_uint64 * MAX_CALL_KINDS), ("wire_bytes", ctypes.c_uint64 * MAX_CALL_KINDS),
                ("plain_wire_bytes", ctypes.c_uint64 * MAX_CALL_KINDS)]


class _ErrorStats(ctypes.Structure):
    _fields_ = [("sq_error", ctypes.c_double), ("sq_input", ctypes.c_double), ("elements", ctypes.c_uint64),
                ("saturated", ctypes.c_uint64), ("flushed", ctypes.c_uint64), ("nonfinite", ctypes.c_uint64)]


class _ErrorTotals(ctypes.Structure):
    _fields_ = [("measured_calls", (ctypes.c_uint64 * MAX_PATHS) * MAX_COLLECTIVES),
                ("input", (_ErrorStats * MAX_PATHS) * MAX_COLLECTIVES),
                ("requant", (_ErrorStats * MAX_PATHS) * MAX_COLLECTIVES),
                ("guard_trips", ctypes.c_uint64 * MAX_COLLECTIVES),
                ("guard_full_calls", ctypes.c_uint64 * MAX_COLLECTIVES),
                ("guard_resumed", ctypes.c_uint64 * MAX_COLLECTIVES),
                ("audited_calls", (ctypes.c_uint64 * MAX_PATHS) * MAX_COLLECTIVES),
                ("audit_sq_error", (ctypes.c_double * MAX_PATHS) * MAX_COLLECTIVES),
                ("audit_sq_exact", (ctypes.c_double * MAX_PATHS) * MAX_COLLECTIVES),
                ("audit_nonfinite", (ctypes.c_uint64 * MAX_PATHS) * MAX_COLLECTIVES)]


_lock = threading.Lock()
_cache: Dict[str, Optional[Callable]] = {}
_warned = set()


def _symbol(name: str, restype, argtypes) -> Optional[Callable]:
    """The named function of the preloaded library, or None. Looked up again until found, since a
    library can also be loaded after this module (ctypes.CDLL(path, mode=RTLD_GLOBAL))."""
    with _lock:
        fn = _cache.get(name)
        if fn is None:
            try:
                fn = getattr(ctypes.CDLL(None), name)
            except AttributeError:
                return None
            fn.restype, fn.argtypes = restype, argtypes
            _cache[name] = fn
        return fn


def _warn_once(key: str, message: str) -> None:
    if key not in _warned:
        _warned.add(key)
        warnings.warn(message, RuntimeWarning, stacklevel=3)


def loaded() -> bool:
    """True when libfp8wire.so is loaded in this process."""
    return _symbol("fp8wire_version", ctypes.c_int, []) is not None


def library_version() -> Optional[str]:
    """The loaded library's version ("0.1.0"), or None when it is not loaded."""
    fn = _symbol("fp8wire_version", ctypes.c_int, [])
    if fn is None:
        return None
    v = fn()
    return f"{v // 10000}.{v // 100 % 100}.{v % 100}"


def active() -> bool:
    """True when libfp8wire.so is loaded and able to carry eligible NCCL calls: its configuration is
    valid and enables it, NCCL is in the process (or nccl.library names a file) and the machine has a
    CUDA driver; once the first NCCL call has set it up, the real NCCL was found and the driver sees a
    GPU (shim/fp8wire.h). Asking never sets the library up nor, before that, initialises CUDA, so it
    is safe before torch.distributed is initialised."""
    fn = _symbol("fp8wire_active", ctypes.c_int, [])
    if fn is None:
        if loaded():
            _warn_once("active", "the loaded libfp8wire.so predates fp8wire_active(); reporting inactive")
        return False
    return bool(fn())


def transport_names() -> Dict[int, str]:
    """Slot index -> transport name ("nccl", "peer_memory", "host_memory"), as the loaded library
    names them ({} when not loaded, or when it predates fp8wire_transport_name)."""
    fn = _symbol("fp8wire_transport_name", ctypes.c_char_p, [ctypes.c_int])
    if fn is None:
        return {}
    names = {}
    for i in range(MAX_TRANSPORTS):
        raw = fn(i)
        if raw:
            names[i] = raw.decode()
    return names


def path_names() -> Dict[int, str]:
    """Slot index -> path name, as the loaded library names its paths ({} when not loaded)."""
    fn = _symbol("fp8wire_path_name", ctypes.c_char_p, [ctypes.c_int])
    if fn is None:
        return {}
    names = {}
    for i in range(MAX_PATHS):
        raw = fn(i)
        if raw:
            names[i] = raw.decode()
    return names


def fp8_paths() -> Optional[set]:
    """Names of the paths fp8wire carries itself, as the library says (fp8wire_path_is_fp8); None
    when the library is not loaded or predates that function."""
    fn = _symbol("fp8wire_path_is_fp8", ctypes.c_int, [ctypes.c_int])
    if fn is None:
        return None
    return {name for i, name in path_names().items() if fn(i)}


@dataclass
class Totals:
    """Calls, caller bytes and wire bytes by path name, since the process started (or the library's
    last reset). `loaded` is False, and every figure zero, when the library is not in the process."""

    loaded: bool = False
    calls: Dict[str, int] = field(default_factory=dict)
    app_bytes: Dict[str, int] = field(default_factory=dict)
    wire_bytes: Dict[str, int] = field(default_factory=dict)
    dropped_records: int = 0
    fp8_paths: Optional[set] = None  # from the library; None: every path but UNCARRIED_PATHS
    # Every call by the transport that carried its bytes: "nccl" (pass-through calls included),
    # "peer_memory" / "host_memory" (fp8wire's direct transports). Empty for a library without them.
    transport_calls: Dict[str, int] = field(default_factory=dict)
    transport_app_bytes: Dict[str, int] = field(default_factory=dict)
    transport_wire_bytes: Dict[str, int] = field(default_factory=dict)

    # Telemetry of the measured FP8 calls (fp8wire_get_error_totals), keyed "collective/path": calls
    # measured, and for the quantization of the inputs and the requantization inside the all-reduce
    # the relative error sqrt(sum err^2 / sum x^2) and the element counts; "audit" when audit.every
    # ran some of them in full precision too (the FP8 result's true relative error). Empty when not
    # available.
    errors: Dict[str, dict] = field(default_factory=dict)
    # What the guard did, per collective: trips (switches to full precision), full-precision calls,
    # returns to FP8.
    guard: Dict[str, Dict[str, int]] = field(default_factory=dict)
    # By the NCCL function the application called ("all_reduce", "send", "recv", "all_to_all", ...),
    # the kinds with calls only: "calls" by path name, "fp8_calls", "app_bytes", "wire_bytes" and
    # "plain_wire_bytes" (what NCCL's own algorithm sends for the same calls). Empty for a library
    # without fp8wire_get_kind_totals.
    by_kind: Dict[str, dict] = field(default_factory=dict)

    @property
    def direct_calls(self) -> int:
        """Calls a direct transport carried (every transport but NCCL's)."""
        return sum(n for name, n in self.transport_calls.items() if name != "nccl")

    def is_fp8_path(self, path: str) -> bool:
        """Whether `path` is one fp8wire carries itself (FP8 on the wire), as the library says."""
        return path in self.fp8_paths if self.fp8_paths is not None else path not in UNCARRIED_PATHS

    @property
    def fp8_calls(self) -> int:
        """Calls fp8wire carried itself (FP8 on the wire)."""
        return sum(n for path, n in self.calls.items() if self.is_fp8_path(path))

    @property
    def total_calls(self) -> int:
        return sum(self.calls.values())

    def to_dict(self) -> dict:
        return {"loaded": self.loaded, "calls": dict(self.calls), "app_bytes": dict(self.app_bytes),
                "wire_bytes": dict(self.wire_bytes), "dropped_records": self.dropped_records,
                "fp8_paths": sorted(self.fp8_paths or []), "fp8_calls": self.fp8_calls,
                "transport_calls": dict(self.transport_calls), "transport_app_bytes": dict(self.transport_app_bytes),
                "transport_wire_bytes": dict(self.transport_wire_bytes), "direct_calls": self.direct_calls,
                "errors": {k: dict(v) for k, v in self.errors.items()},
                "guard": {k: dict(v) for k, v in self.guard.items()},
                "by_kind": {k: dict(v, calls=dict(v["calls"])) for k, v in self.by_kind.items()}}


def _stats_dict(s: "_ErrorStats") -> dict:
    rel = (s.sq_error / s.sq_input) ** 0.5 if s.sq_input > 0 else 0.0
    return {"rel_error": rel, "sq_error": s.sq_error, "sq_input": s.sq_input, "elements": int(s.elements),
            "saturated": int(s.saturated), "flushed": int(s.flushed), "nonfinite": int(s.nonfinite)}


def _error_totals(names: Dict[int, str]):
    """(errors, guard) from fp8wire_get_error_totals, or empty dicts for a library without it."""
    get = _symbol("fp8wire_get_error_totals", None, [ctypes.POINTER(_ErrorTotals)])
    cname = _symbol("fp8wire_collective_name", ctypes.c_char_p, [ctypes.c_int])
    if get is None or cname is None:
        return {}, {}
    raw = _ErrorTotals()
    get(ctypes.byref(raw))
    errors, guard = {}, {}
    for c in range(MAX_COLLECTIVES):
        cn = cname(c)
        if not cn:
            continue
        cn = cn.decode()
        for i, pn in names.items():
            if raw.measured_calls[c][i] or raw.audited_calls[c][i]:
                e = errors[f"{cn}/{pn}"] = {"measured_calls": int(raw.measured_calls[c][i]),
                                            "input": _stats_dict(raw.input[c][i]),
                                            "requant": _stats_dict(raw.requant[c][i])}
                if raw.audited_calls[c][i]:
                    err, exact = raw.audit_sq_error[c][i], raw.audit_sq_exact[c][i]
                    e["audit"] = {"calls": int(raw.audited_calls[c][i]),
                                  "rel_error": (err / exact) ** 0.5 if exact > 0 else 0.0,
                                  "nonfinite_mismatch": int(raw.audit_nonfinite[c][i])}
        if raw.guard_trips[c] or raw.guard_full_calls[c] or raw.guard_resumed[c]:
            guard[cn] = {"trips": int(raw.guard_trips[c]), "full_precision_calls": int(raw.guard_full_calls[c]),
                         "resumed": int(raw.guard_resumed[c])}
    return errors, guard


def _kind_totals(names: Dict[int, str], fp8: Callable[[str], bool]) -> Dict[str, dict]:
    """Totals.by_kind from fp8wire_get_kind_totals, or {} for a library without it."""
    get = _symbol("fp8wire_get_kind_totals", None, [ctypes.POINTER(_KindTotals)])
    kname = _symbol("fp8wire_call_kind_name", ctypes.c_char_p, [ctypes.c_int])
    if get is None or kname is None:
        return {}
    raw = _KindTotals()
    raw.size = ctypes.sizeof(_KindTotals)
    get(ctypes.byref(raw))
    out = {}
    for k in range(MAX_CALL_KINDS):
        kn = kname(k)
        calls = {pn: int(raw.calls[k][i]) for i, pn in names.items() if raw.calls[k][i]}
        if not kn or not calls:
            continue
        out[kn.decode()] = {"calls": calls, "fp8_calls": sum(n for pn, n in calls.items() if fp8(pn)),
                            "app_bytes": int(raw.app_bytes[k]), "wire_bytes": int(raw.wire_bytes[k]),
                            "plain_wire_bytes": int(raw.plain_wire_bytes[k])}
    return out


def totals() -> Totals:
    """fp8wire_get_totals(), keyed by the library's own path names."""
    get = _symbol("fp8wire_get_totals", None, [ctypes.POINTER(_Totals)])
    if get is None:
        return Totals()
    names = path_names()
    if not names:
        # A library older than the 16-slot layout: its struct is smaller, so do not call it.
        _warn_once("totals", "the loaded libfp8wire.so predates fp8wire_path_name(); totals unavailable")
        return Totals(loaded=True)
    raw = _Totals()
    get(ctypes.byref(raw))
    t = Totals(loaded=True, dropped_records=int(raw.dropped_records), fp8_paths=fp8_paths())
    for i, name in names.items():
        t.calls[name] = int(raw.calls[i])
        t.app_bytes[name] = int(raw.app_bytes[i])
        t.wire_bytes[name] = int(raw.wire_bytes[i])
    transports = transport_names()
    get_by_transport = _symbol("fp8wire_get_transport_totals", None, [ctypes.POINTER(_TransportTotals)])
    if transports and get_by_transport is not None:
        raw_t = _TransportTotals()
        get_by_transport(ctypes.byref(raw_t))
        for i, name in transports.items():
            t.transport_calls[name] = int(raw_t.calls[i])
            t.transport_app_bytes[name] = int(raw_t.app_bytes[i])
            t.transport_wire_bytes[name] = int(raw_t.wire_bytes[i])
    t.errors, t.guard = _error_totals(names)
    t.by_kind = _kind_totals(names, t.is_fp8_path)
    return t


def step_begin(n: int) -> None:
    fn = _symbol("fp8wire_step_begin", None, [ctypes.c_int64])
    if fn is not None:
        fn(int(n))


def step_end(n: int) -> None:
    fn = _symbol("fp8wire_step_end", None, [ctypes.c_int64])
    if fn is not None:
        fn(int(n))


def profiler_flush() -> None:
    fn = _symbol("fp8wire_profiler_flush", None, [])
    if fn is not None:
        fn()


def set_feedback_key(key: int) -> None:
    fn = _symbol("fp8wire_set_feedback_key", None, [ctypes.c_uint64])
    if fn is not None:
        fn(int(key) & 0xFFFFFFFFFFFFFFFF)
