"""The self-check's results: one Result per step, the verdict table and the exit code.

A step PASSes, FAILs, or is SKIPped with the reason it could not run here. SKIP is not a
failure: the verdict is OK when nothing FAILed, and says which steps did not run."""

import dataclasses

PASS, FAIL, SKIP = "PASS", "FAIL", "SKIP"


@dataclasses.dataclass
class Result:
    step: str
    status: str
    detail: str  # one line: what was measured, or why it failed / was skipped
    seconds: float = 0.0


def exit_code(results):
    """0 when no step FAILed (SKIPs included), 1 otherwise."""
    return 1 if any(r.status == FAIL for r in results) else 0


def verdict(results):
    """The verdict line under the table."""
    failed = [r.step for r in results if r.status == FAIL]
    skipped = [r.step for r in results if r.status == SKIP]
    passed = len(results) - len(failed) - len(skipped)
    counts = f"{passed} passed, {len(failed)} failed, {len(skipped)} skipped"
    if failed:
        return f"verdict: FAIL ({counts}): {', '.join(failed)}"
    if skipped:
        return f"verdict: OK ({counts}): nothing failed, but these did NOT run here: {', '.join(skipped)}"
    return f"verdict: OK ({counts})"


def table(results):
    """The verdict table: step, status, seconds, detail (one line each), then the verdict."""
    width = max([len("step")] + [len(r.step) for r in results])
    header = f"{'step':<{width}}  status  {'time':>6}  detail"
    lines = [header, "-" * len(header)]
    for r in results:
        lines.append(f"{r.step:<{width}}  {r.status:<6}  {r.seconds:5.1f}s  {r.detail}")
    lines.append("")
    lines.append(verdict(results))
    return "\n".join(lines)


def as_dict(results):
    return {
        "steps": [dataclasses.asdict(r) for r in results],
        "exit_code": exit_code(results),
        "verdict": verdict(results),
    }
