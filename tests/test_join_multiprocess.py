"""join(): collectives complete without the ranks that have joined, at 2 and 4 real MPI ranks."""

import pytest

from tests.mpi_harness import PLAIN_JOB

JOIN = PLAIN_JOB.add("suite_join.py", timeout=300)  # one job with the other plain suites


@pytest.mark.parametrize("np", [2, 4])
def test_join_suite(np):
    PLAIN_JOB.run(JOIN, np)
