"""Process sets: every collective on subsets of the ranks, static and dynamic sets, errors, at 2 and 4 real MPI ranks."""

import pytest

from tests.mpi_harness import run_suite


@pytest.mark.parametrize("np", [2, 4])
def test_process_sets_suite(np):
    run_suite("suite_process_sets.py", np, timeout=300)
