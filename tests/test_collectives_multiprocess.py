"""Every collective x dtype x op, gradients, fusion and ordering, with 2 and 4 real MPI ranks."""

import pytest

from tests.mpi_harness import run_suite


@pytest.mark.parametrize("np", [2, 4])
def test_collectives_suite(np):
    run_suite("suite_collectives.py", np, timeout=600)


@pytest.mark.parametrize("np", [2, 4])
def test_errors_suite(np):
    run_suite("suite_errors.py", np, timeout=600)
