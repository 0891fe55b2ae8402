"""Uneven data per rank never hangs: Keras fit (DistributedOptimizer, DataParallelStrategy) and the tape loop.

tests/mp/suite_uneven_data.py on 2 and 4 real MPI ranks. SMDIST_STALL_SHUTDOWN_TIME=60 makes a
regression that hangs fail in about a minute on every rank.
"""

import pytest

from tests.mpi_harness import run_suite

pytestmark = pytest.mark.optional_packages  # the suite loads scikit-learn's digits


@pytest.mark.parametrize("np", [2, 4])
def test_uneven_data_suite(np):
    run_suite("suite_uneven_data.py", np, timeout=600, env={"SMDIST_STALL_SHUTDOWN_TIME": "60"})
