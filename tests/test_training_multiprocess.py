"""Real Keras training across 2 and 4 ranks, and the README's main job end to end."""

import re

import pytest

from tests.mpi_harness import PLAIN_JOB, run_under_mpi

pytestmark = pytest.mark.optional_packages  # the examples load scikit-learn's digits

TRAINING = PLAIN_JOB.add("suite_training.py", timeout=600)  # one job with the other plain suites


@PLAIN_JOB.driver()
def test_training_suite(np):
    PLAIN_JOB.run(TRAINING, np)


def test_main_job_digits_two_ranks():
    code, out = run_under_mpi(2, ["examples/tf2_digits.py"], timeout=600)
    assert code == 0, out[-5000:]
    epochs = re.findall(r"epoch +\d+: loss ([\d.]+)  accuracy ([\d.]+)", out)
    assert len(epochs) == 12, out[-3000:]
    assert float(epochs[-1][0]) < float(epochs[0][0]), "the global loss did not fall"
    test_accuracy = float(re.search(r"test accuracy: ([\d.]+)", out).group(1))
    assert test_accuracy >= 0.9, out[-3000:]
    assert "weights identical on all ranks: True" in out
