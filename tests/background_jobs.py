"""The shared MPI jobs (tests/mpi_harness.py ``SharedJob``), run in the background while the other tests run.

The CI machine has 2 cores and the tests in the pytest process leave about a quarter of them idle
(single-process tests, TensorFlow imports on one core, ranks waiting on each other). The shared jobs
are the suite's largest CPU work that no other test waits on, so when collection ends a thread starts
the jobs the selected driver tests (``@JOB.driver()``, marker ``shared_job``) want, one after another,
at the tests' own priority: the kernel shares the cores between them and the foreground tests. The
driver tests run after the others (tests/conftest.py orders them) and each waits for its job's result;
the tests marked ``wall_clock`` run after the drivers, so no time limit of theirs is judged while a
background job shares the machine. When the session ends, a running job's process group is killed.

Imports nothing heavy: the ranks' pytest loads tests/conftest.py, which imports this module.
"""

from __future__ import annotations

import os
import signal
import threading
import traceback
from typing import Any, Sequence


class _BackgroundJobs:
    """Runs the shared jobs the selected driver tests want, one after another, in a thread of the pytest process."""

    def __init__(self) -> None:
        self._group: int | None = None  # the running job's process group
        self._stopped = False
        self._lock = threading.Lock()

    def start(self, items: Sequence[Any]) -> None:
        wanted: list[tuple[Any, int]] = []
        for item in items:
            marker = item.get_closest_marker("shared_job")
            if marker is not None and (marker.args[0], item.callspec.params["np"]) not in wanted:
                wanted.append((marker.args[0], item.callspec.params["np"]))
        for job, np in wanted:
            job.wants(np)
        if wanted:
            threading.Thread(target=self._run_all, args=(wanted,), name="shared MPI jobs", daemon=True).start()

    def _run_all(self, wanted: list[tuple[Any, int]]) -> None:
        for job, np in wanted:
            result = (-1, "the pytest session ended before this job started")
            try:
                if not self._stopped:
                    result = job.start(np, self._started)
            except BaseException:  # noqa: BLE001 - the driver test that waits reports it
                result = (-1, f"the background run of this job failed:\n{traceback.format_exc()}")
            finally:
                with self._lock:
                    self._group = None
                job.finished(np, result)

    def _started(self, group: int) -> None:
        with self._lock:
            self._group = group
            if self._stopped:
                os.killpg(group, signal.SIGKILL)

    def stop(self) -> None:
        """Kills the running job (the session is ending) and starts no other."""
        with self._lock:
            self._stopped = True
            if self._group is not None:
                try:
                    os.killpg(self._group, signal.SIGKILL)
                except ProcessLookupError:
                    pass


BACKGROUND_JOBS = _BackgroundJobs()


