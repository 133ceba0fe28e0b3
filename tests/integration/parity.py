"""Judges a pair of training runs, one with plain NCCL and one with libfp8wire.so, from the ranks'
result dicts (harness.finish writes them). Plain Python, so it is tested on the CPU
(tests/python/test_integration_logic.py) with synthetic curves.

A run's result per rank: {"rank", "losses": [per-step training loss], "eval_loss", "param_sha256",
"totals": fp8wire totals dict or None}. The loss curve of a run is the per-step mean over its ranks
(each rank trains on its own data shard)."""
import math

PEARSON_MIN = 0.999      # loss curves, plain vs fp8wire
FINAL_GAP_MAX = 0.02     # relative difference of the final (held-out) loss
LEARNS_RATIO = 0.5       # the last steps' loss must fall below this fraction of the first steps'


def pearson(a, b):
    if len(a) != len(b) or len(a) < 2:
        raise ValueError(f"curves of different or too short lengths ({len(a)}, {len(b)})")
    ma, mb = sum(a) / len(a), sum(b) / len(b)
    da, db = [x - ma for x in a], [y - mb for y in b]
    va, vb = sum(x * x for x in da), sum(y * y for y in db)
    if va == 0 or vb == 0:
        return float("nan")
    return sum(x * y for x, y in zip(da, db)) / math.sqrt(va * vb)


def mean_curve(results):
    curves = [r["losses"] for r in results]
    n = min(len(c) for c in curves)
    return [sum(c[i] for c in curves) / len(curves) for i in range(n)]


def fp8_calls(results):
    """The smallest count over ranks of calls fp8wire carried itself (every rank must have made them)."""
    counts = [r["totals"]["fp8_calls"] if r.get("totals") else 0 for r in results]
    return min(counts) if counts else 0


def evaluate(name, plain, fp8, nproc, fp8_expectation="required"):
    """Returns (checks, summary). checks: [(label, ok, detail)]; summary: the table row.
    fp8_expectation: "required" (FP8 calls must have been made), "reported" (counted, not required:
    for communicators the library is documented to pass through) or "none" (no library at all: the
    CPU check of the tests' own logic)."""
    checks = [("plain run: every rank reported", len(plain) == nproc, f"{len(plain)}/{nproc}"),
              ("fp8wire run: every rank reported", len(fp8) == nproc, f"{len(fp8)}/{nproc}")]
    summary = {"stack": name, "steps": 0, "pearson": None, "final_gap": None, "fp8_calls": 0, "ok": False}
    if len(plain) != nproc or len(fp8) != nproc:
        return checks, summary
    bad = [r["rank"] for r in plain + fp8 if any(not math.isfinite(x) for x in r["losses"] + [r["eval_loss"]])]
    checks.append(("losses finite", not bad, f"non-finite on ranks {bad}" if bad else ""))
    cp, cf = mean_curve(plain), mean_curve(fp8)
    summary["steps"] = min(len(cp), len(cf))
    cp, cf = cp[:summary["steps"]], cf[:summary["steps"]]
    head = max(1, len(cp) // 10)
    learns = sum(cp[-head:]) < LEARNS_RATIO * sum(cp[:head])
    checks.append(("the model learns (plain run)", learns, f"loss {sum(cp[:head]) / head:.4g} -> {sum(cp[-head:]) / head:.4g}"))
    r = pearson(cp, cf) if not bad else float("nan")
    summary["pearson"] = r
    checks.append((f"loss curves Pearson >= {PEARSON_MIN}", r >= PEARSON_MIN, f"{r:.6f} over {len(cp)} steps"))
    lp, lf = plain[0]["eval_loss"], fp8[0]["eval_loss"]
    gap = abs(lf - lp) / abs(lp) if lp else float("inf")
    summary["final_gap"] = gap
    checks.append((f"final loss within {FINAL_GAP_MAX:.0%}", gap <= FINAL_GAP_MAX,
                   f"plain {lp:.6g} fp8wire {lf:.6g} ({gap * 100:.3f} %)"))
    for label, run in (("plain", plain), ("fp8wire", fp8)):
        digests = {r["param_sha256"] for r in run}
        checks.append((f"{label}: every rank ends with the same full parameters", len(digests) == 1,
                       f"{len(digests)} distinct" if len(digests) > 1 else next(iter(digests))[:16]))
    checks.append(("plain run had no fp8wire loaded", all(not r.get("totals") for r in plain), ""))
    calls = fp8_calls(fp8)
    summary["fp8_calls"] = calls
    if fp8_expectation != "none":
        loaded = all(r.get("totals") for r in fp8)
        checks.append(("fp8wire run had libfp8wire.so loaded in every rank", loaded, ""))
    by_path = fp8[0]["totals"]["calls"] if fp8[0].get("totals") else {}
    detail = f"{calls} (rank 0 by path: {', '.join(f'{k} {v}' for k, v in by_path.items() if v)})"
    if fp8_expectation == "required":
        checks.append(("FP8 calls were made on every rank", calls > 0, detail))
    else:
        checks.append(("FP8 calls counted (not required here)", True, detail))
    summary["ok"] = all(ok for _, ok, _ in checks)
    return checks, summary


def format_row(s):
    """One line of the integration table: stack, steps, Pearson, final gap, FP8 calls, PASS/FAIL."""
    pr = "-" if s.get("pearson") is None else f"{s['pearson']:.5f}"
    gap = "-" if s.get("final_gap") is None else f"{s['final_gap'] * 100:.3f} %"
    verdict = s.get("verdict") or ("PASS" if s.get("ok") else "FAIL")
    return f"{s['stack']:<30} {s.get('steps', 0):>5} {pr:>9} {gap:>10} {s.get('fp8_calls', 0):>9}  {verdict}"


TABLE_HEADER = f"{'stack':<30} {'steps':>5} {'Pearson':>9} {'final gap':>10} {'FP8 calls':>9}  result"
