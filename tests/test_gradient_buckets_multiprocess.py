"""Gradient buckets overlap the backward pass and change no result, on 2 and 4 real MPI ranks."""

import pytest

from tests.mpi_harness import run_suite


@pytest.mark.parametrize("np", [2, 4])
def test_gradient_buckets_suite(np):
    run_suite("suite_gradient_buckets.py", np, timeout=450, env={"SMDIST_STALL_SHUTDOWN_TIME": "60"})
