"""Builds that tests need, started when the session starts and run at the lowest CPU priority.

A build is CPU work that no test times. The CI machine has 2 cores and the suite leaves about a quarter
of them idle (single-process tests, ranks waiting on each other), so a build started at collection time
under ``nice -n 19`` runs in those idle cycles: the kernel gives the tests' own processes their share
first, and the test that needs the build finds it done, or waits for what is left. A build is
registered by the test module that needs it (``register`` at import, before collection ends), starts
only if one of that module's tests was selected (``@pytest.mark.background_build(NAME)``), and its
processes are killed when the session ends.

Each build is a function taking a ``Commands`` (which runs its steps niced, in process groups of their
own) and returning what its test checks; an exception is raised again in the test that waits. A step
that runs tests with time limits of their own (a smoke subset) first calls ``wait_for_the_last_tests``:
until the suite's last groups start, its own tests keep both cores busy and would starve a niced job
past its limits; the wall-clock tests then leave a core idle.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import threading
from pathlib import Path
from typing import Any, Callable

# Generous: while the tests keep both cores busy, a niced step gets almost no CPU.
STEP_TIMEOUT_S = 3000

_LAST_TESTS_STARTED = threading.Event()


def last_tests_started() -> None:
    """Tells the builds that the suite's last groups (wall-clock tests, then the builds' own) have started."""
    _LAST_TESTS_STARTED.set()


def wait_for_the_last_tests() -> None:
    """Returns once ``last_tests_started`` was called (tests/conftest.py calls it, as does a test that waits)."""
    _LAST_TESTS_STARTED.wait()


def _lowest_autogroup_priority(pid: int) -> None:
    """Gives the step's new session the lowest weight against the tests' sessions.

    Where the kernel groups processes by session (``/proc/sys/kernel/sched_autogroup_enabled``),
    CPU time is shared between sessions first and ``nice`` only orders the processes within
    one: a build in a session of its own would take half the cores from a test's MPI job.
    Without autogroups the file is absent and ``nice`` alone does it.
    """
    autogroup = Path(f"/proc/{pid}/autogroup")
    if autogroup.exists():
        autogroup.write_text("19")


class Commands:
    """Runs a build's steps under ``nice -n 19``, each in a process group; ``kill`` ends them and removes the
    build's temporary directories."""

    def __init__(self) -> None:
        self._running: set[subprocess.Popen] = set()
        self._directories: list[Path] = []
        self._lock = threading.Lock()
        self._killed = False

    def temporary_directory(self, prefix: str) -> Path:
        """A new directory, removed when the session ends."""
        path = Path(tempfile.mkdtemp(prefix=prefix))
        self._directories.append(path)
        return path

    def run(self, argv: list[str], cwd: Path, env: dict) -> str:
        """Runs ``argv``; returns its combined output, or raises with it unless it exits 0."""
        with self._lock:
            if self._killed:
                raise RuntimeError("the session ended before this build step")
            proc = subprocess.Popen(["nice", "-n", "19", *argv], cwd=cwd, env=env, stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, text=True, start_new_session=True)
            _lowest_autogroup_priority(proc.pid)
            self._running.add(proc)
        try:
            out, _ = proc.communicate(timeout=STEP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
            raise RuntimeError(f"{argv} timed out after {STEP_TIMEOUT_S} s:\n{out[-8000:]}") from None
        finally:
            with self._lock:
                self._running.discard(proc)
        if proc.returncode != 0:
            raise RuntimeError(f"{argv} failed (exit {proc.returncode}):\n{out[-8000:]}")
        return out

    def kill(self) -> None:
        with self._lock:
            self._killed = True
            for proc in self._running:
                os.killpg(proc.pid, signal.SIGKILL)
        for path in self._directories:
            shutil.rmtree(path, ignore_errors=True)


class BackgroundBuild:
    """One registered build: ``start`` it once; ``result`` waits for it and returns or raises what it did."""

    def __init__(self, name: str, build: Callable[[Commands], Any]) -> None:
        self.name = name
        self._build = build
        self._commands = Commands()
        self._thread: threading.Thread | None = None
        self._result: Any = None
        self._error: BaseException | None = None

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=f"build: {self.name}", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        try:
            self._result = self._build(self._commands)
        except BaseException as error:  # handed to the test that waits
            self._error = error

    def result(self) -> Any:
        self.start()  # a test run without the session hook (the build then runs now)
        last_tests_started()  # nothing else is left to wait for
        self._thread.join()
        if self._error is not None:
            raise AssertionError(f"the background build '{self.name}' failed") from self._error
        return self._result

    def stop(self) -> None:
        self._commands.kill()


_BUILDS: dict[str, BackgroundBuild] = {}


def register(name: str, build: Callable[[Commands], Any]) -> BackgroundBuild:
    """Registers ``build`` under ``name`` (at a test module's import); the tests that need it carry the marker."""
    if name in _BUILDS:
        raise ValueError(f"a background build named '{name}' is registered already")
    _BUILDS[name] = BackgroundBuild(name, build)
    return _BUILDS[name]


def start_for(items: list) -> None:
    """Starts the builds that the selected ``items`` (pytest items) need."""
    for name in sorted({marker.args[0] for item in items for marker in item.iter_markers("background_build")}):
        if name not in _BUILDS:
            raise ValueError(f"no background build named '{name}' is registered")
        _BUILDS[name].start()


def stop_all() -> None:
    """Kills what is still running (the session is ending)."""
    for build in _BUILDS.values():
        build.stop()
