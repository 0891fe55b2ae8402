"""Every collective x dtype x op and gradients; errors, fusion and the intra-host paths: at 2 and 4 real MPI ranks."""

from tests.mpi_harness import PLAIN_JOB

COLLECTIVES = PLAIN_JOB.add("suite_collectives.py", timeout=600)  # one job with the other plain suites
ERRORS = PLAIN_JOB.add(["suite_errors.py", "suite_fusion.py", "suite_intra_host.py"], timeout=600)


@PLAIN_JOB.driver()
def test_collectives_suite(np):
    PLAIN_JOB.run(COLLECTIVES, np)


@PLAIN_JOB.driver()
def test_errors_suite(np):
    PLAIN_JOB.run(ERRORS, np)
