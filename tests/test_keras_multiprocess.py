"""Keras 3 / tf.distribute integration across 2 and 4 ranks (with Keras' own keras.distribution API on TensorFlow,
in the same jobs), and the Keras digits example end to end."""

import re
import tempfile
from pathlib import Path

import pytest

from tests.mpi_harness import PLAIN_JOB, run_under_mpi

pytestmark = pytest.mark.optional_packages  # the examples load scikit-learn's digits

KERAS = PLAIN_JOB.add(["suite_keras.py", "suite_keras_distribution.py"], timeout=600)  # one job with the other plain suites


@PLAIN_JOB.driver()
def test_keras_suite(np):
    PLAIN_JOB.run(KERAS, np)


# At 2 ranks the example runs compiled by XLA, below; at 4 with Adasum, where its pairs form a tree.
@pytest.mark.parametrize("np,flags", [(1, []), (4, ["--adasum"])])
def test_keras_digits_example(np, flags):
    code, out = run_under_mpi(np, ["examples/keras_digits.py", "--epochs", "8", *flags], timeout=400)
    assert code == 0, out[-5000:]
    epochs = re.findall(r"epoch +\d+: loss ([\d.]+)  accuracy ([\d.]+)", out)
    assert len(epochs) == 8, out[-3000:]
    assert float(epochs[-1][0]) < float(epochs[0][0]), "the global loss did not fall"
    assert float(re.search(r"test accuracy: ([\d.]+)", out).group(1)) >= 0.95, out[-3000:]
    assert "weights identical on all ranks: True" in out


def test_keras_digits_example_compiled_by_xla():
    code, out = run_under_mpi(2, ["examples/keras_digits.py", "--epochs", "8", "--jit-compile"], timeout=400)
    assert code == 0, out[-5000:]
    losses = [float(v) for v in re.findall(r"epoch +\d+: loss ([\d.]+)  accuracy", out)]
    assert len(losses) == 8 and losses[-1] < losses[0], out[-3000:]
    assert float(re.search(r"test accuracy: ([\d.]+)", out).group(1)) >= 0.95, out[-3000:]
    assert "weights identical on all ranks: True" in out


def test_tf2_custom_loop_example_two_ranks(tmp_path):
    code, out = run_under_mpi(2, ["examples/tf2_custom_loop.py", "--epochs", "6", "--checkpoint-dir", str(tmp_path)], timeout=400)
    assert code == 0, out[-5000:]
    losses = [float(v) for v in re.findall(r"epoch +\d+: loss ([\d.]+)", out)]
    assert len(losses) == 6 and losses[-1] < losses[0], out[-3000:]
    assert float(re.search(r"test accuracy: ([\d.]+)", out).group(1)) >= 0.85, out[-3000:]
    assert len(re.findall(r"checkpoint written by rank 0", out)) == 1
    assert any(p.name.startswith("ckpt-1") for p in tmp_path.iterdir())


def test_tf2_custom_loop_example_leaves_nothing_behind_without_a_checkpoint_dir():
    scratch = Path(tempfile.gettempdir())
    before = set(scratch.glob("tf2_custom_loop_*"))
    code, out = run_under_mpi(2, ["examples/tf2_custom_loop.py", "--epochs", "1"], timeout=400)
    assert code == 0, out[-5000:]
    assert "checkpoint written by rank 0" in out
    assert set(scratch.glob("tf2_custom_loop_*")) == before
