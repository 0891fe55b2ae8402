"""Rank-side pytest setup: start the engine once per process, tag failures with the rank."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import pytest  # noqa: E402
import smdist_tf as sd  # noqa: E402

sd.init()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.failed:
        report.nodeid = f"[rank {sd.rank()}/{sd.size()}] {report.nodeid}"
