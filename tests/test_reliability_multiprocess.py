"""Bounded per-name memory, the response cache's eviction, unsafe timeline paths, malformed settings,
repeated stall warnings, the engine's log level and timeline cycle marks, with 2 and 4 real MPI ranks."""

import pytest

from tests.mpi_harness import PLAIN_JOB

RELIABILITY = PLAIN_JOB.add("suite_reliability.py", timeout=600)  # one job with the other plain suites


@pytest.mark.parametrize("np", [2, 4])
def test_reliability_suite(np):
    PLAIN_JOB.run(RELIABILITY, np)
