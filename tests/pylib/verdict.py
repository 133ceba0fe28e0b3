"""A test program's verdict from its checks: one PASS or FAIL line per check, the exit status last."""


def report(prefix, checks):
    """Prints "PASS|FAIL <prefix>: <name> <detail>" for each (name, ok, detail) of `checks`; returns
    the program's exit status: 0 when every check passed, else 1."""
    failed = 0
    for name, ok, detail in checks:
        print(f"{'PASS' if ok else 'FAIL'} {prefix}: {name} {detail}", flush=True)
        failed += not ok
    return 1 if failed else 0
