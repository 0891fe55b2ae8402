"""Compression.int8 against the exact sums and its error bound, and training with it: at 2 and 4 real MPI ranks."""

from tests.mpi_harness import PLAIN_JOB

INT8 = PLAIN_JOB.add("suite_int8_compression.py", timeout=420)  # one job with the other plain suites


@PLAIN_JOB.driver()
def test_int8_compression_suite(np):
    PLAIN_JOB.run(INT8, np)
