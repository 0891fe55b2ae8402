"""Gradient buckets overlap the backward pass and change no result, on 2 and 4 real MPI ranks."""

from tests.mpi_harness import STALL_SHUTDOWN_JOB

BUCKETS = STALL_SHUTDOWN_JOB.add("suite_gradient_buckets.py", timeout=450)  # one job with the other such suites


@STALL_SHUTDOWN_JOB.driver()
def test_gradient_buckets_suite(np):
    STALL_SHUTDOWN_JOB.run(BUCKETS, np)
