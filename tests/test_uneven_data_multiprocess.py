"""Uneven data per rank at 2 and 4 ranks: Keras fit and the tape loop finish (or fail fast), never hang."""

import pytest

from tests.mpi_harness import run_suite


@pytest.mark.parametrize("np", [2, 4])
def test_uneven_data_suite(np):
    # A regression that hangs fails in about a minute on every rank instead of running into the timeout.
    run_suite("suite_uneven_data.py", np, timeout=420, env={"SMDIST_STALL_SHUTDOWN_TIME": "60"})
