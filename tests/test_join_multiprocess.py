"""join(): collectives complete without the ranks that have joined, at 2 and 4 real MPI ranks."""

import pytest

from tests.mpi_harness import run_suite


@pytest.mark.parametrize("np", [2, 4])
def test_join_suite(np):
    run_suite("suite_join.py", np, timeout=300)
