"""Pipeline parallelism (PipelineModel, send/recv) across 2 and 4 ranks, and its example end to end."""

import re

import pytest

from tests.mpi_harness import run_suite, run_under_mpi


@pytest.mark.parametrize("np", [2, 4])
def test_pipeline_suite(np):
    run_suite("suite_pipeline.py", np, timeout=300)


def test_pipeline_digits_example_two_ranks():
    code, out = run_under_mpi(2, ["examples/keras_pipeline_digits.py", "--epochs", "4"], timeout=200)
    assert code == 0, out[-5000:]
    losses = [float(v) for v in re.findall(r"epoch +\d+: loss ([\d.]+)", out)]
    assert len(losses) == 4 and losses[-1] < losses[0], out[-3000:]
    assert float(re.search(r"test accuracy: ([\d.]+)", out).group(1)) >= 0.85, out[-3000:]
