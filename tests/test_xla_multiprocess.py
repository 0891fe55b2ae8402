"""XLA: collectives inside ``jit_compile`` functions equal the same calls without XLA, on 2 and 4 real MPI ranks."""

from tests.mpi_harness import STALL_SHUTDOWN_JOB, run_under_mpi


XLA = STALL_SHUTDOWN_JOB.add("suite_xla.py", timeout=600)  # one job with the other such suites


@STALL_SHUTDOWN_JOB.driver()
def test_xla_suite(np):
    STALL_SHUTDOWN_JOB.run(XLA, np)


def test_lowerings_compile_when_tensorflow_ran_before_the_import():
    # An eager op and a Keras model before `import smdist_tf` (tests/mp/late_import_xla_ranks.py): TensorFlow
    # made its XLA compilation kernels before our op library loaded.
    code, out = run_under_mpi(2, ["tests/mp/late_import_xla_ranks.py"], timeout=240)
    assert code == 0, out[-5000:]
    for rank in range(2):
        assert f"rank {rank}: late import XLA ok" in out, out[-5000:]
