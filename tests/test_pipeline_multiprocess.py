"""Pipeline parallelism (PipelineModel, send/recv) across 2 and 4 ranks, a rank dying mid-step, and the example."""

import re

import pytest

from tests.mpi_harness import PLAIN_JOB, run_under_mpi

pytestmark = pytest.mark.optional_packages  # the examples load scikit-learn's digits

PIPELINE = PLAIN_JOB.add("suite_pipeline.py", timeout=480)  # one job with the other plain suites


@PLAIN_JOB.driver()
def test_pipeline_suite(np):
    PLAIN_JOB.run(PIPELINE, np)


@pytest.mark.parametrize("np,mode", [(2, "exit"), (4, "raise")])
def test_rank_dying_mid_step_stops_every_rank(np, mode):
    # Rank 1 ends inside its third step while stage 0 waits for its gradient (tests/mp/pipeline_rank_death.py).
    code, out = run_under_mpi(np, ["tests/mp/pipeline_rank_death.py", mode], timeout=180)
    assert code != 124, f"a rank hung after rank 1 died:\n{out[-5000:]}"
    assert f"rank 1: dying ({mode})" in out, out[-5000:]
    assert "finished" not in out, out[-5000:]
    if mode == "exit":
        # A hard death (no MPI finalize): the launcher stops the others, the job fails with its code.
        assert code == 3, out[-5000:]
    else:
        # Rank 1 tells the others as it exits: every other rank's pending receive or
        # collective fails at once, naming it, whether or not it talks to rank 1 directly.
        assert code != 0, out[-5000:]
        for r in range(np):
            if r != 1:
                assert re.search(rf"^rank {r}: AbortedError: .*rank 1 is exiting with code 1", out, re.M), out[-5000:]


def test_pipeline_digits_example_two_ranks():
    code, out = run_under_mpi(2, ["examples/keras_pipeline_digits.py", "--epochs", "4"], timeout=200)
    assert code == 0, out[-5000:]
    losses = [float(v) for v in re.findall(r"epoch +\d+: loss ([\d.]+)", out)]
    assert len(losses) == 4 and losses[-1] < losses[0], out[-3000:]
    assert float(re.search(r"test accuracy: ([\d.]+)", out).group(1)) >= 0.85, out[-3000:]
