"""Runs a batch of tests on every rank of one job and gathers what happened, for both front ends.

The launching process calls :func:`run_on_ranks`; each rank of the ``smdistrun``
job (started through ``smdist_tf.run``) calls ``rank_fn``, which records its
tests with :func:`rank_results.record`. A C-level watchdog
(``faulthandler.dump_traceback_later``) ends a rank whose current phase - start-up,
or one test - outlasts the timeout, printing every thread's stack first, so no
test can hang the job; the launcher then stops the other ranks.
"""

from __future__ import annotations

import contextlib
import faulthandler
import io
import os
import shutil
import sys
import tempfile
from typing import Any, Callable, NamedTuple, Sequence

from smdist_tf.testing import rank_results

# Set on the ranks: test code runs for real there instead of launching a job.
ON_RANK_ENV = "SMDIST_TESTING_ON_RANK"


def on_rank() -> bool:
    """Whether this process is a rank of a test job (not the process that launched it)."""
    return os.environ.get(ON_RANK_ENV) == "1"


def arm_watchdog(timeout: float) -> None:
    """Ends this process, with every thread's stack on stderr, unless re-armed within ``timeout`` s."""
    faulthandler.dump_traceback_later(timeout, exit=True)


def disarm_watchdog() -> None:
    faulthandler.cancel_dump_traceback_later()


class JobResult(NamedTuple):
    """What one job of tests left: each test's outcome, the job's error, and the ranks' output."""

    outcomes: dict[str, rank_results.TestOutcome]
    error: str
    output: str


class _Tee(io.TextIOBase):
    """Writes to a stream and keeps a copy."""

    def __init__(self, stream: Any, copy: io.StringIO) -> None:
        super().__init__()
        self.stream, self.copy = stream, copy

    def write(self, text: str) -> int:
        self.copy.write(text)
        return self.stream.write(text)

    def flush(self) -> None:
        self.stream.flush()


def run_on_ranks(rank_fn: Callable[..., Any], args: Sequence[Any], tests: list[str], np: int, timeout: float,
                 env: dict[str, str] | None = None) -> JobResult:
    """Runs ``rank_fn(results_dir, *args)`` on ``np`` ranks; returns what happened.

    The ranks' output, tagged with the rank, goes to this process's stdout/stderr as it
    comes, and is kept: a test that timed out shows its ranks' stacks in its own failure,
    not in the output of whichever test started the job.
    """
    from smdist_tf.run import RunError, run  # noqa: PLC0415 - the launcher only when a job starts

    results_dir = tempfile.mkdtemp(prefix="smdist_testing_")
    job_error = ""
    output = io.StringIO()
    try:
        try:
            sys.stdout.flush()
            with contextlib.redirect_stdout(_Tee(sys.stdout, output)), \
                    contextlib.redirect_stderr(_Tee(sys.stderr, output)):
                run(rank_fn, args=(results_dir, *args), np=np, env={**(env or {}), ON_RANK_ENV: "1"})
        except RunError as e:
            job_error = str(e)
        return JobResult(rank_results.read_outcomes(results_dir, np, tests), job_error, output.getvalue())
    finally:
        shutil.rmtree(results_dir, ignore_errors=True)
