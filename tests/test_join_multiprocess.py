"""join(): collectives complete without the ranks that have joined, at 2 and 4 real MPI ranks."""

from tests.mpi_harness import PLAIN_JOB

JOIN = PLAIN_JOB.add("suite_join.py", timeout=300)  # one job with the other plain suites


@PLAIN_JOB.driver()
def test_join_suite(np):
    PLAIN_JOB.run(JOIN, np)
