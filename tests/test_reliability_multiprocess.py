"""Bounded per-name memory, the response cache's eviction, unsafe timeline paths, malformed settings,
repeated stall warnings, the engine's log level and timeline cycle marks, with 2 and 4 real MPI ranks."""

from tests.mpi_harness import PLAIN_JOB

RELIABILITY = PLAIN_JOB.add("suite_reliability.py", timeout=600)  # one job with the other plain suites


@PLAIN_JOB.driver()
def test_reliability_suite(np):
    PLAIN_JOB.run(RELIABILITY, np)
