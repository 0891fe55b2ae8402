"""Rank-side pytest setup for every suite: the engine started once per process, failures tagged with
the rank and printed at once, each suite file's outcome printed when it ends, and a hung test ending the
job with the ranks' stacks (tests/mp/rank_guards.py).

A suite sets ``HANG_S`` (seconds) where its longest test needs more or less than the default.
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import pytest  # noqa: E402
import smdist_tf as sd  # noqa: E402
from tests.mp import rank_guards  # noqa: E402

sd.init()

# A test still running after this is hung (the longest take about a minute on a loaded 2-core machine).
DEFAULT_HANG_S = 240


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.failed:
        report.nodeid = f"[rank {sd.rank()}/{sd.size()}] {report.nodeid}"


OUTCOMES = rank_guards.SuiteOutcomes(sd.rank())


def pytest_runtest_logreport(report):
    rank_guards.report_at_once(report)
    OUTCOMES.record(report)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    yield
    OUTCOMES.print_when_done(item, nextitem)


@pytest.fixture(autouse=True)
def fail_instead_of_hanging(request):
    yield from rank_guards.hang_guard(request, sd.rank(), sd.size(), getattr(request.module, "HANG_S", DEFAULT_HANG_S))
