"""XLA: collectives inside ``jit_compile`` functions equal the same calls without XLA, on 2 and 4 real MPI ranks."""

import pytest

from tests.mpi_harness import run_suite, run_under_mpi


@pytest.mark.parametrize("np", [2, 4])
def test_xla_suite(np):
    run_suite("suite_xla.py", np, timeout=600, env={"SMDIST_STALL_SHUTDOWN_TIME": "60", "SMDIST_DYNAMIC_PROCESS_SETS": "1"})


def test_lowerings_compile_when_tensorflow_ran_before_the_import():
    # An eager op and a Keras model before `import smdist_tf` (tests/mp/late_import_xla_ranks.py): TensorFlow
    # made its XLA compilation kernels before our op library loaded.
    code, out = run_under_mpi(2, ["tests/mp/late_import_xla_ranks.py"], timeout=240)
    assert code == 0, out[-5000:]
    for rank in range(2):
        assert f"rank {rank}: late import XLA ok" in out, out[-5000:]
