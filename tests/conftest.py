"""Fixtures for every test under tests/ (the ranks' pytest loads this file too: it imports no TensorFlow).

``deadline``: a test that runs a job in its own process (the launcher's ``main``, the Ray executor)
interrupts it after a time limit. SIGINT is what a user's Ctrl-C sends: the job's MPI processes are
stopped on it, so a hung job ends the test instead of hanging it.

``@pytest.mark.background_build(NAME)``: the test waits for a build that tests/background_builds.py
started, niced, when collection ended (in the CPU time the other tests leave idle).

``@JOB.driver()`` (``tests/mpi_harness.py``, marker ``shared_job``): a test that judges a shared MPI job's
suites. The jobs its tests want start in the background when collection ends, and those tests run after
the others, each waiting for its job's run. Then ``@pytest.mark.wall_clock`` (a whole file, as
``pytestmark``): tests that assert how much wall time passed, on a machine the background jobs have left.
They mostly wait (for timeouts, stopped ranks, Ray's nodes) and leave a core idle, which a niced build
still running takes (it yields to their processes). Last, the tests that wait for a background build.

``@pytest.mark.optional_packages``: only the processes a test marked so starts see .venv/optional
(scikit-learn, requirements-optional.txt) on ``PYTHONPATH``; ``@pytest.mark.jax_packages``, the same for
.venv/optional-jax (JAX, requirements-jax.txt). Keras imports scikit-learn and TensorFlow JAX whenever they
can, about 1 s of CPU per process each, and the library needs neither: the other tests' ranks start
without them, as in a user's environment with TensorFlow and smdist_tf alone.
"""

from __future__ import annotations

import os
import signal
import threading

import pytest

from tests import background_builds
from tests.background_jobs import BACKGROUND_JOBS
from tests.optional_packages import JAX_PACKAGES, OPTIONAL_PACKAGES

# The directory each marker puts on PYTHONPATH for the test's processes.
_PACKAGES_OF_MARKER = {"optional_packages": OPTIONAL_PACKAGES, "jax_packages": JAX_PACKAGES}
_INHERITED_PATH = [entry for entry in os.environ.get("PYTHONPATH", "").split(os.pathsep)
                   if entry and entry not in _PACKAGES_OF_MARKER.values()]

# tests/mp holds the ranks' suites and their conftest.py, which starts the engine: the host session leaves it.
collect_ignore = ["mp"]


def pytest_configure(config):
    config.addinivalue_line("markers", "optional_packages: the processes this test starts may import "
                                       "scikit-learn (.venv/optional): it runs examples or docs")
    config.addinivalue_line("markers", "jax_packages: the processes this test starts may import JAX "
                                       "(.venv/optional-jax)")
    config.addinivalue_line("markers", "background_build(name): the test uses the build of that name "
                                       "(tests/background_builds.py), started niced when collection ends")
    config.addinivalue_line("markers", "shared_job(job): judges the suites of a shared MPI job, which runs in "
                                       "the background (SharedJob.driver in tests/mpi_harness.py)")
    config.addinivalue_line("markers", "wall_clock: asserts on elapsed wall time; runs after the background "
                                       "shared jobs have ended")


# The markers the tests run grouped by, in this order after the unmarked tests (tests/file_times.py reports each
# group's span by the same function).
RUN_ORDER = ("shared_job", "wall_clock", "background_build")


def run_group(item: pytest.Item) -> int:
    """0 for an unmarked test, else 1 + the index in RUN_ORDER of its last-running marker."""
    return max((RUN_ORDER.index(m.name) + 1 for m in item.iter_markers() if m.name in RUN_ORDER), default=0)


def pytest_collection_modifyitems(session, config, items):
    # The background jobs leave a niced build little CPU until they end: a test that waits for one
    # runs last, after the wall-clock tests whose idle core the build takes, not in the middle of the
    # other tests. Stable: within each group, the files and tests keep their order.
    items.sort(key=run_group)


def pytest_collection_finish(session):
    if not session.config.option.collectonly:
        background_builds.start_for(session.items)
        BACKGROUND_JOBS.start(session.items)


def pytest_sessionfinish(session, exitstatus):
    background_builds.stop_all()
    BACKGROUND_JOBS.stop()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    if run_group(item) >= 1 + RUN_ORDER.index("wall_clock"):
        background_builds.last_tests_started()  # the wall-clock tests leave a core idle for the builds' tests
    # Before the test's fixtures start anything (a module's Ray cluster is started by its first test).
    path = [directory for marker, directory in _PACKAGES_OF_MARKER.items()
            if item.get_closest_marker(marker) is not None] + _INHERITED_PATH
    os.environ["PYTHONPATH"] = os.pathsep.join(path)


@pytest.fixture
def deadline():
    """``deadline(seconds)`` sends this process SIGINT after ``seconds``, unless the test has ended."""
    timers = []

    def arm(seconds: float) -> None:
        timer = threading.Timer(seconds, os.kill, (os.getpid(), signal.SIGINT))
        timer.daemon = True
        timer.start()
        timers.append(timer)

    yield arm
    for timer in timers:
        timer.cancel()
