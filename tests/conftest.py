"""Fixtures for every test under tests/ (the ranks' pytest loads this file too: it imports no TensorFlow).

``deadline``: a test that runs a job in its own process (the launcher's ``main``, the Ray executor)
interrupts it after a time limit. SIGINT is what a user's Ctrl-C sends: the job's MPI processes are
stopped on it, so a hung job ends the test instead of hanging it.
"""

from __future__ import annotations

import os
import signal
import threading

import pytest


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
