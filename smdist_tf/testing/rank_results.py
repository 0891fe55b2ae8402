"""What each rank of a distributed test job did, written as it happens and read by the launching process.

A rank appends one JSON line per event to ``<dir>/rank.<r>.jsonl``: ``start`` before a
test, then ``end`` with its outcome. A test that started on a rank but never ended
there timed out or crashed that rank, and the job ended with it.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

PASSED, FAILED, SKIPPED = "passed", "failed", "skipped"


def record(results_dir: str, rank: int, event: str, test: str, outcome: str = "", detail: str = "") -> None:
    """Appends one event of ``rank`` (flushed at once: the rank may be killed next)."""
    line = json.dumps({"event": event, "test": test, "outcome": outcome, "detail": detail})
    with open(os.path.join(results_dir, f"rank.{rank}.jsonl"), "a") as f:
        f.write(line + "\n")
        f.flush()
        os.fsync(f.fileno())


@dataclass
class TestOutcome:
    """One test over all ranks."""

    failures: dict[int, str] = field(default_factory=dict)  # rank -> traceback
    skipped: dict[int, str] = field(default_factory=dict)   # rank -> reason
    passed: list[int] = field(default_factory=list)
    unfinished: list[int] = field(default_factory=list)     # started, never ended
    missing: list[int] = field(default_factory=list)        # never started


def read_outcomes(results_dir: str, np: int, tests: list[str]) -> dict[str, TestOutcome]:
    """Each test's outcome over ranks 0..np-1."""
    outcomes = {t: TestOutcome() for t in tests}
    for rank in range(np):
        started, ended = set(), set()
        path = Path(results_dir, f"rank.{rank}.jsonl")
        lines = path.read_text().splitlines() if path.exists() else []
        for line in lines:
            try:
                event = json.loads(line)
            except ValueError:
                continue  # a line cut short by a kill
            test = event["test"]
            if test not in outcomes:
                continue
            if event["event"] == "start":
                started.add(test)
                continue
            ended.add(test)
            o = outcomes[test]
            if event["outcome"] == FAILED:  # several for failed subtests
                o.failures[rank] = o.failures.get(rank, "") + event["detail"]
            elif event["outcome"] == SKIPPED:
                o.skipped[rank] = event["detail"]
            else:
                o.passed.append(rank)
        for test in tests:
            if test in started and test not in ended:
                outcomes[test].unfinished.append(rank)
            elif test not in started and test not in ended:
                outcomes[test].missing.append(rank)
    return outcomes


def failure_message(test: str, outcome: TestOutcome, np: int, timeout: float, job_error: str) -> str | None:
    """Why ``test`` failed on the ranks, or None when it passed (or was skipped) on all of them."""
    parts = [f"rank {r} of {np}:\n{tb.rstrip()}" for r, tb in sorted(outcome.failures.items())]
    if outcome.unfinished:
        parts.append(f"did not finish on rank(s) {', '.join(map(str, outcome.unfinished))} of {np} "
                     f"within {timeout:g} s (timed out or crashed; the ranks' output above shows where)")
    if outcome.missing and not outcome.unfinished and not outcome.failures:
        parts.append(f"never ran on rank(s) {', '.join(map(str, outcome.missing))} of {np}: "
                     f"{job_error or 'the job ended first'}")
    if not parts:
        return None
    return f"{test} failed:\n" + "\n".join(parts)
