"""Horovod's documented TensorFlow 2 patterns (examples/horovod_compat/) run with only the import changed."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from tests.mpi_harness import ROOT, mpi_env, run_process_group

pytestmark = pytest.mark.optional_packages  # the examples load scikit-learn's digits

SMDISTRUN = str(Path(sys.executable).parent / "smdistrun")
EXAMPLES = ROOT / "examples" / "horovod_compat"


def run_example(script: str, np: int, tmp_path: Path, *args: str) -> str:
    code, out = run_process_group([SMDISTRUN, "-np", str(np), sys.executable, str(EXAMPLES / script), *args], ROOT,
                                  mpi_env({"CHECKPOINT_DIR": str(tmp_path)}), timeout=300)
    assert code == 0, out[-5000:]
    return out


def test_tensorflow2_training_loop(tmp_path):
    # At 2 ranks: the loop does at any rank count what it does at 2; the join example below runs at 4.
    out = run_example("tensorflow2_digits.py", 2, tmp_path)
    losses = [float(v) for v in re.findall(r"Step #\d+\tLoss: ([\d.]+)", out)]
    assert losses and float(re.search(r"final loss: ([\d.]+)", out).group(1)) < losses[0] / 2, out[-3000:]
    assert "weights identical on all ranks: True" in out
    assert any(p.name.startswith("ckpt") for p in tmp_path.iterdir()), "rank 0 saved no checkpoint"


def test_horovods_keras_synthetic_benchmark(tmp_path):
    out = run_example("tensorflow2_keras_synthetic_benchmark.py", 2, tmp_path)
    assert re.search(r"Img/sec per CPU: [\d.]+", out), out[-3000:]


def test_horovods_tensorflow2_synthetic_benchmark_with_adasum(tmp_path):
    # Horovod's --use-adasum flag; the Keras benchmark above and the digits loop cover op=Average.
    out = run_example("tensorflow2_synthetic_benchmark.py", 2, tmp_path, "--use-adasum")
    assert re.search(r"Img/sec per CPU: [\d.]+", out), out[-3000:]
    assert "weights identical on all ranks: True" in out, out[-3000:]


def test_tensorflow2_uneven_shards_with_join(tmp_path):
    # At 4 ranks, where more ranks join at different times than at 2.
    out = run_example("tensorflow2_uneven_join.py", 4, tmp_path)
    epochs = re.findall(r"epoch \d: batches per rank \[([\d, ]+)\], last to join: rank (\d)", out)
    assert len(epochs) == 3, out[-3000:]
    counts = [int(c) for c in epochs[0][0].split(",")]
    assert len(set(counts)) > 1, f"the shards were meant to be uneven: {counts}"
    # The last to join ran the most batches.
    assert all(counts[int(last)] == max(counts) for _, last in epochs), epochs
    assert "weights identical on all ranks: True" in out
