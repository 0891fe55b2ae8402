"""pytest plugin: ``@pytest.mark.distributed(np=2, timeout=120, env=None)`` runs a test function on ``np`` ranks.

Registered with pytest (entry point ``pytest11``) when smdist_tf is installed, or
load it with ``-p smdist_tf.testing.pytest_plugin``. The marked test runs in one
``smdistrun`` job of ``np`` ranks, each running pytest on that test with
``smdist_tf.init()`` done first; fixtures are set up on every rank. The selected
marked tests of one module with the same ``np``, ``env`` and timeouts share that job
(one TensorFlow start-up per rank for all of them), which starts when the first of
them runs. A test fails when it fails on any rank, naming the rank, and fails
instead of hanging when a rank does not finish within ``timeout`` seconds (start-up,
``init()`` and pytest's own collection on the rank, within ``startup_timeout``,
default 120 s); the tests after it in its job then fail as never run. Imports
nothing heavy: pytest loads it in every session.
"""

from __future__ import annotations

import os
from typing import Any, NamedTuple

import pytest

from smdist_tf.testing import job, rank_results

MARKER = "distributed"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", f"{MARKER}(np=2, timeout=120, env=None, startup_timeout=120): run the test on np ranks under smdistrun "
                   "(smdist_tf.testing)")


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    settings = _JobSettings.of(pyfuncitem)
    if settings is None or job.on_rank():
        return None  # pytest calls the function here, as usual
    nodeid = pyfuncitem.nodeid
    jobs = pyfuncitem.config.stash.setdefault(_JOBS, {})
    if nodeid not in jobs:
        # This test and the later selected ones that can share its job: one start-up for all of them.
        batch = [item.nodeid for item in pyfuncitem.session.items
                 if item.nodeid not in jobs and item.path == pyfuncitem.path and _JobSettings.of(item) == settings]
        rootdir = str(pyfuncitem.config.rootpath)
        result = job.run_on_ranks(_run_items_on_rank, (rootdir, batch, settings.timeout, settings.startup_timeout),
                                  batch, settings.np, settings.timeout, dict(settings.env))
        jobs.update((test, result) for test in batch)
    result = jobs[nodeid]
    outcome = result.outcomes[nodeid]
    message = rank_results.failure_message(nodeid, outcome, settings.np, settings.timeout, result.error, result.output)
    if message:
        pytest.fail(message, pytrace=False)
    if outcome.skipped and not outcome.passed:
        pytest.skip(next(iter(outcome.skipped.values())))
    return True


class _JobSettings(NamedTuple):
    """What a marked test asks of its job; tests of one module asking the same share a job."""

    np: int
    timeout: float
    startup_timeout: float
    env: tuple[tuple[str, str], ...]

    @classmethod
    def of(cls, item: pytest.Item) -> _JobSettings | None:
        """The settings of ``item``'s marker, or None when it is not marked."""
        marker = item.get_closest_marker(MARKER)
        if marker is None:
            return None
        return cls(np=int(marker.kwargs.get("np", marker.args[0] if marker.args else 2)),
                   timeout=float(marker.kwargs.get("timeout", 120.0)),
                   startup_timeout=float(marker.kwargs.get("startup_timeout", 120.0)),
                   env=tuple(sorted((str(k), str(v)) for k, v in (marker.kwargs.get("env") or {}).items())))


# config.stash: test node id -> the result of the job that ran it.
_JOBS = pytest.StashKey[dict]()


class _Recorder:
    """Rank side: records the test's start and outcome, and re-arms the watchdog when it starts."""

    def __init__(self, results_dir: str, rank: int, timeout: float):
        self.results_dir, self.rank, self.timeout = results_dir, rank, timeout

    def pytest_runtest_logstart(self, nodeid: str, location: Any) -> None:
        job.arm_watchdog(self.timeout)
        rank_results.record(self.results_dir, self.rank, "start", nodeid)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when == "call" or (report.when == "setup" and not report.passed) or report.failed:
            if report.skipped:
                reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
                outcome, detail = rank_results.SKIPPED, reason
            elif report.failed:
                outcome, detail = rank_results.FAILED, f"({report.when}) {report.longreprtext}"
            else:
                outcome, detail = rank_results.PASSED, ""
            rank_results.record(self.results_dir, self.rank, "end", report.nodeid, outcome, detail)


def _run_items_on_rank(results_dir: str, rootdir: str, nodeids: list[str], timeout: float,
                       startup_timeout: float) -> None:
    """One rank: start the engine and run pytest on the job's tests, recording each."""
    import smdist_tf as sd  # noqa: PLC0415

    job.arm_watchdog(startup_timeout)  # init() and pytest's collection
    sd.init()
    os.chdir(rootdir)
    pytest.main([*nodeids, "-q", "-p", "no:cacheprovider", f"--rootdir={rootdir}"],
                plugins=[_Recorder(results_dir, sd.rank(), timeout)])
    job.disarm_watchdog()
