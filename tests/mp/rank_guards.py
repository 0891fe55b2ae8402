"""Guards for every suite (tests/mp/conftest.py installs them): a failure is printed at once, a hang ends the job.

A rank whose check fails leaves the test while its peers may still wait for it; the job then ends on a
hang, and pytest's summary, printed at the end, would never come. So each failure is written to stderr as
soon as its test ends, and a test still running after ``hang_seconds`` prints the test, the rank and
every thread's stack (the main thread's first), and exits the rank, which ends the job.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import traceback
from typing import Iterator

import pytest


def report_at_once(report: pytest.TestReport) -> None:
    """Writes a failed test's report to stderr now (tests/mp/conftest.py calls it for every report)."""
    if report.failed:
        sys.stderr.write(f"\nFAILED {report.nodeid} ({report.when}):\n{report.longreprtext[-6000:]}\n")
        sys.stderr.flush()


class SuiteOutcomes:
    """Counts each suite file's test outcomes on this rank and prints them when the file's last test ends.

    Several suites can share one job (tests/mpi_harness.py, ``SharedJob``); the host reads these lines
    to judge each suite on its own, even when a later suite ends the job before pytest's summary, and
    to report each suite's wall time (``seconds=``, from its first report to its last test's end).
    """

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.counts: dict[str, dict[str, int]] = {}
        self.started: dict[str, float] = {}

    def record(self, report: pytest.TestReport) -> None:
        self.started.setdefault(os.path.basename(report.location[0]), time.monotonic() - report.duration)
        counts = self.counts.setdefault(os.path.basename(report.location[0]), {"passed": 0, "failed": 0, "skipped": 0})
        if report.failed:
            counts["failed"] += 1
        elif report.skipped:
            counts["skipped"] += 1
        elif report.when == "call":
            counts["passed"] += 1

    def print_when_done(self, item: pytest.Item, nextitem: pytest.Item | None) -> None:
        if nextitem is not None and nextitem.path == item.path:
            return
        counts = self.counts.get(item.path.name, {"passed": 0, "failed": 0, "skipped": 0})
        seconds = time.monotonic() - self.started.get(item.path.name, time.monotonic())
        line = (f"\nsuite-outcome: rank {self.rank} {item.path.name} " + " ".join(f"{k}={v}" for k, v in counts.items())
                + f" seconds={seconds:.1f}")
        with item.config.pluginmanager.getplugin("capturemanager").global_and_fixture_disabled():
            sys.stdout.write(line + "\n")
            sys.stdout.flush()


def hang_guard(request: pytest.FixtureRequest, rank: int, size: int, hang_seconds: float) -> Iterator[None]:
    """Body of an autouse fixture: exits this rank with every thread's stack if the test outlives ``hang_seconds``."""
    capture = request.config.pluginmanager.getplugin("capturemanager")
    main = threading.main_thread().ident

    def expire() -> None:
        if capture is not None:
            capture.suspend_global_capture(in_=True)  # pytest's capture would lose what follows
        sys.stderr.write(f"\n[rank {rank}/{size}] HUNG: {request.node.nodeid} still running after "
                         f"{hang_seconds} s\n{thread_stacks(main)}\n")
        sys.stderr.flush()
        os._exit(3)

    timer = threading.Timer(hang_seconds, expire)
    timer.daemon = True
    timer.start()
    yield
    timer.cancel()


def thread_stacks(main: int) -> str:
    """Every Python thread's innermost frames, the main thread's first: a hang may be another thread's doing."""
    names = {t.ident: t.name for t in threading.enumerate()}
    frames = sys._current_frames()
    order = [main] + [ident for ident in frames if ident != main]
    return "\n".join(f"--- thread {names.get(ident, ident)}\n" + "".join(traceback.format_stack(frames[ident])[-12:])
                     for ident in order if ident in frames and ident != threading.get_ident())
