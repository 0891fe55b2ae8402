"""Process sets: every collective on subsets of the ranks, static and dynamic sets, errors, at 2 and 4 real MPI ranks."""

import pytest

from tests.mpi_harness import run_suite

pytestmark = pytest.mark.optional_packages  # a suite imports the example, which loads scikit-learn's digits

# One job per rank count: the suites share the static sets tests/mp/process_set_setup.py registers.
SUITES = ["suite_process_sets.py", "suite_process_sets_gradients.py", "suite_process_sets_concurrency.py",
          "suite_process_sets_registration.py"]


@pytest.mark.parametrize("np", [2, 4])
def test_process_sets_suite(np):
    run_suite(SUITES, np, timeout=300)
