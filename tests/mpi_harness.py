"""Starts a test suite under mpirun, one process per rank, and reports its outcome.

Each suite in tests/mp/ is an ordinary pytest module that every rank runs in
full: one mpirun (and one TensorFlow import per rank) covers many tests.
"""

from __future__ import annotations

import os
import re
import sys
import threading
import time
from pathlib import Path
from typing import Callable, Sequence

import pytest

import smdist_tf
from tests import file_times
from tests.optional_packages import OPTIONAL_PACKAGES
from tests.process_group import run_process_group  # noqa: F401 - the suites' entry point too
from smdist_tf.run.session_dir import BASE_VARIABLE, private_session_base

ROOT = Path(__file__).resolve().parent.parent
MP_DIR = Path(__file__).resolve().parent / "mp"


def mpirun_path() -> str:
    """The mpirun of the MPI smdist_tf was built with."""
    mpicxx = Path(smdist_tf.get_build_info()["mpicxx"])
    return str(mpicxx.parent / "mpirun")


def mpi_env(extra: dict | None = None) -> dict:
    env = dict(os.environ)
    env.update(
        OMPI_ALLOW_RUN_AS_ROOT="1",
        OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
        TF_CPP_MIN_LOG_LEVEL="2",
        PYTHONUNBUFFERED="1",
    )
    env.update(extra or {})
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def run_under_mpi(np: int, argv: list[str], timeout: float, env: dict | None = None,
                  on_start: Callable[[int], None] | None = None) -> tuple[int, str]:
    """Runs ``python argv...`` on ``np`` ranks; returns (exit code, combined output).

    ``on_start`` gets the job's process-group id when it starts (see ``run_process_group``).
    """
    cmd = [mpirun_path(), "-np", str(np), "--oversubscribe", "--bind-to", "none", sys.executable, *argv]
    with private_session_base(BASE_VARIABLE, mpi_env(env)) as job_env:
        return run_process_group(cmd, ROOT, job_env, timeout, on_start)


def run_suite(suites: str | Sequence[str], np: int, timeout: float, env: dict | None = None) -> str:
    """Runs tests/mp/<suite> (or several suites, in one job) with pytest on every rank.

    Fails with the ranks' output unless every rank passed: ``timeout`` bounds the whole job, and
    ``env`` is set in each rank's environment before Python starts (before TensorFlow is imported).
    """
    suites = [suites] if isinstance(suites, str) else list(suites)
    paths = [str(MP_DIR / suite) for suite in suites]
    code, out = run_under_mpi(np, ["-m", "pytest", *paths, "-q", "-p", "no:cacheprovider", "--color=no", "-W",
                                   "ignore::DeprecationWarning"], timeout, env)
    name = " + ".join(suites)
    if code != 0:
        raise AssertionError(f"{name} with {np} ranks failed (exit {code}):\n{out[-20000:]}")
    # Each rank prints its own pytest summary; all of them must have run tests.
    summaries = re.findall(r"^=*\s*(\d+) passed", out, re.M)
    if len(summaries) != np or not all(int(n) > 0 for n in summaries):
        raise AssertionError(f"{name}: expected {np} rank summaries with passing tests:\n{out[-5000:]}")
    return out


class SharedJob:
    """Suites that share one MPI job per rank count: one TensorFlow start-up per rank for all of them.

    Drivers add their suites when pytest imports them (``JOB.add(...)`` at module level), so a job
    holds the suites of the drivers this pytest session collected. Each driver test is written with
    ``@JOB.driver()``; once collection ends, tests/background_jobs.py runs the jobs those tests want
    (tests/conftest.py), one after another, while the other tests run: the jobs fill the CPU that
    single-process tests and waiting ranks leave idle. The driver tests run last and wait for their
    job; without a background run (a driver called outside pytest's session) ``run`` starts the job
    itself. Each driver then judges only its own suites, by the ``suite-outcome`` line every rank
    prints when a suite file ends (tests/mp/conftest.py): a failure elsewhere in the job fails the
    suites it failed or kept from running. The suites must want the same environment, and none may
    leave state behind that a later suite sees.
    """

    def __init__(self, name: str, env: dict | None = None) -> None:
        self.name = name
        self.env = env
        self.suites: list[str] = []
        self.timeout = 0.0
        self.results: dict[int, tuple[int, str]] = {}
        self._finished: dict[int, threading.Event] = {}  # rank counts scheduled in the background

    def add(self, suites: str | Sequence[str], timeout: float) -> list[str]:
        """Adds ``suites`` (files in tests/mp) to the job, ``timeout`` seconds to its time limit; returns them."""
        suites = [suites] if isinstance(suites, str) else list(suites)
        self.suites += [suite for suite in suites if suite not in self.suites]
        self.timeout += timeout
        return suites

    def driver(self, rank_counts: Sequence[int] = (2, 4)) -> Callable:
        """Decorates a driver test ``test_x(np)``: parametrized over ``rank_counts``, marked as this job's."""
        def decorate(test: Callable) -> Callable:
            return pytest.mark.shared_job(self)(pytest.mark.parametrize("np", list(rank_counts))(test))
        return decorate

    def wants(self, np: int) -> None:
        """Says the job at ``np`` ranks runs in the background: ``run`` waits for ``finished(np, ...)``."""
        self._finished[np] = threading.Event()

    def finished(self, np: int, result: tuple[int, str]) -> None:
        self.results[np] = result
        self._finished[np].set()

    def start(self, np: int, on_start: Callable[[int], None] | None = None) -> tuple[int, str]:
        """Runs the job at ``np`` ranks now; returns (exit code, combined output)."""
        paths = [str(MP_DIR / suite) for suite in self.suites]
        # Some suites load scikit-learn's digits, whichever driver starts the job.
        env = {**(self.env or {}), "PYTHONPATH": OPTIONAL_PACKAGES + os.pathsep + os.environ.get("PYTHONPATH", "")}
        started = time.monotonic()
        result = run_under_mpi(np, ["-m", "pytest", *paths, "-q", "-p", "no:cacheprovider", "--color=no",
                                    "-W", "ignore::DeprecationWarning"], self.timeout, env, on_start)
        ended = time.monotonic()
        file_times.record_suite(f"{self.name} job, np {np}: the whole job", ended - started)
        file_times.record_job(f"{self.name}, np {np}", started, ended)
        return result

    def run(self, suites: Sequence[str], np: int) -> str:
        """Fails unless every rank ran ``suites`` in this job at ``np`` ranks with tests passing and none failing."""
        if np in self._finished:
            self._finished[np].wait()
        elif np not in self.results:
            self.results[np] = self.start(np)
        code, out = self.results[np]
        problems = []
        for suite in suites:
            for rank in range(np):
                found = re.search(rf"^suite-outcome: rank {rank} {re.escape(suite)} passed=(\d+) failed=(\d+)", out, re.M)
                if found is None:
                    problems.append(f"{suite} did not finish on rank {rank}")
                elif int(found.group(2)) or not int(found.group(1)):
                    problems.append(f"{suite} on rank {rank}: {found.group(1)} passed, {found.group(2)} failed")
            seconds = re.search(rf"^suite-outcome: rank 0 {re.escape(suite)} .* seconds=([\d.]+)", out, re.M)
            if seconds:
                file_times.record_suite(f"{self.name} job, np {np}: {suite}", float(seconds.group(1)))
        if problems:
            failures = [m.group(0) for suite in suites
                        for m in re.finditer(rf"^FAILED \[rank \d+/\d+\] \S*{re.escape(suite)}::[\s\S]{{0,6000}}", out, re.M)]
            detail = "\n".join(failures) if failures else out[-20000:]
            raise AssertionError(f"{' + '.join(suites)} with {np} ranks in the shared job '{self.name}' "
                                 f"(exit {code}): {'; '.join(problems)}\n{detail[-30000:]}")
        return out


# Suites without an environment of their own, and no process sets registered at import: one job per rank count.
PLAIN_JOB = SharedJob("plain")
# Suites that want a hang to end every rank within a minute (the engine shuts down after 60 s of stall) and
# dynamic process sets (a test adds a set and removes it): one job per rank count.
STALL_SHUTDOWN_JOB = SharedJob("stall shutdown", env={"SMDIST_STALL_SHUTDOWN_TIME": "60",
                                                      "SMDIST_DYNAMIC_PROCESS_SETS": "1"})
