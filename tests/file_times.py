"""A pytest plugin (``-p tests.file_times``) that ends the run with each test file's wall time.

scripts/run_tests.sh loads it, so every CI log shows where the suite's time goes. The shared MPI jobs
(tests/mpi_harness.py) run in the background (tests/background_jobs.py), so a driver file's time is how
long its tests waited for them; each job's wall time, and the rank 0 wall time of each of its suites,
are listed in a second table. A third shows when each group of tests (in the order tests/conftest.py
runs them) and each shared job ran, in seconds since collection ended: the groups after the shared jobs
have the machine to themselves, so their span is where an idle core shows.
"""

from __future__ import annotations

import time
from collections import defaultdict

_seconds: dict[str, float] = defaultdict(float)
_started: dict[str, float] = {}
_suite_seconds: dict[str, float] = {}
_session_start: list[float] = []
_group_of: dict[str, str] = {}
_group_span: dict[str, list[float]] = {}
_job_span: dict[str, tuple[float, float]] = {}


def record_suite(name: str, seconds: float) -> None:
    """Notes a shared job's suite ``name`` took ``seconds`` on rank 0 (tests/mpi_harness.py calls it)."""
    _suite_seconds[name] = seconds


def record_job(name: str, started: float, ended: float) -> None:
    """Notes when a shared job ran, as ``time.monotonic()`` values (tests/mpi_harness.py calls it)."""
    _job_span[name] = (started, ended)


def pytest_collection_finish(session) -> None:
    from tests.conftest import RUN_ORDER, run_group  # loaded by now; the groups are the ones it runs by

    _session_start.append(time.monotonic())
    names = ("tests", *RUN_ORDER)
    for item in session.items:
        _group_of[item.nodeid] = names[run_group(item)]


def pytest_runtest_logstart(nodeid: str, location: tuple) -> None:
    _started[nodeid] = now = time.monotonic()
    span = _group_span.setdefault(_group_of.get(nodeid, "tests"), [now, now])
    span[1] = max(span[1], now)


def pytest_runtest_logfinish(nodeid: str, location: tuple) -> None:
    start = _started.pop(nodeid, None)
    if start is not None:
        now = time.monotonic()
        _seconds[nodeid.split("::", 1)[0]] += now - start
        span = _group_span.get(_group_of.get(nodeid, "tests"))
        if span is not None:
            span[1] = max(span[1], now)


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
    if _session_start and _group_span:
        terminalreporter.section("when each group of tests and each shared job ran (s since collection)")
        zero = _session_start[0]
        spans = [(f"tests marked {g}" if g != "tests" else "unmarked tests", span) for g, span in _group_span.items()]
        spans += [(f"{name} job (background)", span) for name, span in _job_span.items()]
        for name, (begin, end) in sorted(spans, key=lambda item: item[1][0]):
            terminalreporter.write_line(f"{begin - zero:8.1f} - {end - zero:8.1f} s  {end - begin:7.1f} s  {name}")
