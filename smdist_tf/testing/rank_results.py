"""What each rank of a distributed test job did, written as it happens and read by the launching process.

A rank appends one JSON line per event to ``<dir>/rank.<r>.jsonl``: ``start`` before a
test, then ``end`` with its outcome. A test that started on a rank but never ended
there timed out or crashed that rank, and the job ended with it.
"""

from __future__ import annotations

import json
import os
import re
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


# faulthandler's first line when the watchdog ends a rank (job.arm_watchdog).
_WATCHDOG = re.compile(r"^Timeout \(\d+:\d\d:\d\d(\.\d+)?\)!")
_STACK_LINES = 60


def rank_stacks(output: str, rank: int) -> str:
    """The stacks rank ``rank`` printed when its watchdog ended it (its tagged stderr from there), or ""."""
    tag = f"[{rank}]<stderr>:"
    lines = [line[len(tag):] for line in output.splitlines() if line.startswith(tag)]
    starts = [i for i, line in enumerate(lines) if _WATCHDOG.match(line)]
    if not starts:
        return ""
    stack = lines[starts[-1]:]
    if len(stack) > _STACK_LINES:
        stack = stack[:_STACK_LINES] + [f"... ({len(stack) - _STACK_LINES} more lines in the ranks' output)"]
    return "\n".join(stack)


def failure_message(test: str, outcome: TestOutcome, np: int, timeout: float, job_error: str,
                    output: str = "") -> str | None:
    """Why ``test`` failed on the ranks, or None when it passed (or was skipped) on all of them.

    ``output``: the job's tagged output, where the stacks of ranks that did not finish are.
    """
    parts = [f"rank {r} of {np}:\n{tb.rstrip()}" for r, tb in sorted(outcome.failures.items())]
    if outcome.unfinished:
        parts.append(f"did not finish on rank(s) {', '.join(map(str, outcome.unfinished))} of {np} "
                     f"within {timeout:g} s (timed out or crashed)")
        for r in outcome.unfinished:
            stack = rank_stacks(output, r)
            parts.append(f"rank {r}'s stacks when it was stopped:\n{stack}" if stack else
                         f"rank {r} printed no stacks (it crashed, or was killed before its watchdog fired)")
    if outcome.missing and not outcome.unfinished and not outcome.failures:
        parts.append(f"never ran on rank(s) {', '.join(map(str, outcome.missing))} of {np}: "
                     f"{job_error or 'the job ended first'}")
    if not parts:
        return None
    return f"{test} failed:\n" + "\n".join(parts)
