"""A command run in a process group of its own, killed whole on timeout.

Imports nothing heavy, so the GPU tests (tests/gpu/, on a machine without TensorFlow) use it as the
suites do through tests/mpi_harness.py.
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path
from typing import Callable, Optional


def run_process_group(argv: list[str], cwd: Path, env: dict, timeout: float,
                      on_start: Optional[Callable[[int], None]] = None) -> tuple[int, str]:
    """Runs ``argv`` in its own process group; returns (exit code, combined output).

    The whole group is killed on timeout so a hung job cannot outlive the test: the exit code is
    then 124 and the output starts with ``TIMED OUT``. ``on_start`` is given the group's id as soon as
    it exists (a caller in another thread kills the group with it).
    """
    proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    if on_start is not None:
        on_start(proc.pid)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        return 124, f"TIMED OUT after {timeout} s\n{out}"
    return proc.returncode, out
