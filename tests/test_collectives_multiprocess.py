"""Every collective x dtype x op and gradients; errors, fusion and the intra-host paths: at 2 and 4 real MPI ranks."""

import pytest

from tests.mpi_harness import run_suite


@pytest.mark.parametrize("np", [2, 4])
def test_collectives_suite(np):
    run_suite("suite_collectives.py", np, timeout=600)


@pytest.mark.parametrize("np", [2, 4])
def test_errors_suite(np):
    run_suite(["suite_errors.py", "suite_fusion.py", "suite_intra_host.py"], np, timeout=600)
