"""A pytest plugin (``-p tests.file_times``) that ends the run with each test file's wall time.

scripts/run_tests.sh loads it, so every CI log shows where the suite's time goes. The shared MPI jobs
(tests/mpi_harness.py) run in the background (tests/background_jobs.py), so a driver file's time is how
long its tests waited for them; each job's wall time, and the rank 0 wall time of each of its suites,
are listed in a second table.
"""

from __future__ import annotations

import time
from collections import defaultdict

_seconds: dict[str, float] = defaultdict(float)
_started: dict[str, float] = {}
_suite_seconds: dict[str, float] = {}


def record_suite(name: str, seconds: float) -> None:
    """Notes a shared job's suite ``name`` took ``seconds`` on rank 0 (tests/mpi_harness.py calls it)."""
    _suite_seconds[name] = seconds


def pytest_runtest_logstart(nodeid: str, location: tuple) -> None:
    _started[nodeid] = time.monotonic()


def pytest_runtest_logfinish(nodeid: str, location: tuple) -> None:
    start = _started.pop(nodeid, None)
    if start is not None:
        _seconds[nodeid.split("::", 1)[0]] += time.monotonic() - start


def pytest_terminal_summary(terminalreporter) -> None:
    if not _seconds:
        return
    total = sum(_seconds.values())
    terminalreporter.section("wall time per test file")
    for path, seconds in sorted(_seconds.items(), key=lambda item: -item[1]):
        terminalreporter.write_line(f"{seconds:8.1f} s {100 * seconds / total:5.1f} %  {path}")
    terminalreporter.write_line(f"{total:8.1f} s in all")
    if _suite_seconds:
        terminalreporter.section("wall time per suite of the shared MPI jobs (rank 0)")
        for name, seconds in sorted(_suite_seconds.items(), key=lambda item: -item[1]):
            terminalreporter.write_line(f"{seconds:8.1f} s  {name}")
