"""XLA: collectives inside ``jit_compile`` functions equal the same calls without XLA, on 2 and 4 real MPI ranks."""

import pytest

from tests.mpi_harness import run_suite


@pytest.mark.parametrize("np", [2, 4])
def test_xla_suite(np):
    run_suite("suite_xla.py", np, timeout=600, env={"SMDIST_STALL_SHUTDOWN_TIME": "60", "SMDIST_DYNAMIC_PROCESS_SETS": "1"})
