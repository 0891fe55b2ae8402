"""Uneven data per rank never hangs: Keras fit (DistributedOptimizer, DataParallelStrategy) and the tape loop.

tests/mp/suite_uneven_data.py on 2 and 4 real MPI ranks. SMDIST_STALL_SHUTDOWN_TIME=60 makes a
regression that hangs fail in about a minute on every rank.
"""

from tests.mpi_harness import STALL_SHUTDOWN_JOB

UNEVEN = STALL_SHUTDOWN_JOB.add("suite_uneven_data.py", timeout=600)  # one job with the other such suites


@STALL_SHUTDOWN_JOB.driver()
def test_uneven_data_suite(np):
    STALL_SHUTDOWN_JOB.run(UNEVEN, np)
