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
import traceback
from typing import Iterator

import pytest


def report_at_once(report: pytest.TestReport) -> None:
    """Writes a failed test's report to stderr now (tests/mp/conftest.py calls it for every report)."""
    if report.failed:
        sys.stderr.write(f"\nFAILED {report.nodeid} ({report.when}):\n{report.longreprtext[-6000:]}\n")
        sys.stderr.flush()


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
