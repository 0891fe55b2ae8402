"""``import smdist_tf.keras as hvd`` as a drop-in for ``horovod.tensorflow.keras``: the names at 2 and 4 ranks,
a TensorFlow-free import, and Horovod's Keras MNIST example under ``smdistrun``."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.mpi_harness import PLAIN_JOB, ROOT, mpi_env, run_process_group

pytestmark = pytest.mark.optional_packages  # the examples load scikit-learn's digits

EXAMPLE = "examples/horovod_compat/keras_mnist.py"
HOROVOD_KERAS_NAMES = (
    "init", "shutdown", "rank", "size", "local_rank", "local_size", "cross_rank", "cross_size", "is_initialized",
    "mpi_built", "nccl_built", "gloo_built", "cuda_built", "mpi_threads_supported", "start_timeline", "stop_timeline",
    "allreduce", "allgather", "broadcast", "reducescatter", "alltoall", "grouped_allreduce",
    "broadcast_global_variables", "DistributedOptimizer", "PartialDistributedOptimizer", "load_model", "Compression",
    "callbacks", "elastic", "PipelineModel",
)

KERAS_COMPAT = PLAIN_JOB.add("suite_keras_compat.py", timeout=300)  # one job with the other plain suites


@PLAIN_JOB.driver()
def test_keras_compat_suite(np):
    PLAIN_JOB.run(KERAS_COMPAT, np)


def test_import_names_without_tensorflow():
    """A script's top-level import costs nothing: TensorFlow loads at the first use of a name."""
    code = (
        "import sys\n"
        "import smdist_tf.keras as hvd\n"
        f"missing = [n for n in {HOROVOD_KERAS_NAMES!r} if n not in dir(hvd) or n not in hvd.__all__]\n"
        "assert not missing, missing\n"
        "assert 'tensorflow' not in sys.modules and 'keras' not in sys.modules\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT,
                         env=mpi_env())
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def smdistrun(np: int, argv: list[str], timeout: float) -> tuple[int, str]:
    """``smdistrun -np N python argv...``; returns (exit code, combined output)."""
    script = shutil.which("smdistrun", path=str(Path(sys.executable).parent)) or shutil.which("smdistrun")
    launcher = [script] if script else [sys.executable, "-m", "smdist_tf.run"]
    env = mpi_env()
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return run_process_group([*launcher, "-np", str(np), sys.executable, *argv], ROOT, env, timeout)


def expected_lr(epoch: int, size: int, base_lr: float = 0.05, warmup: int = 2) -> float:
    """The example's rate at the end of ``epoch`` (from 0): Horovod's warm-up, which counts the last batch as
    done (full rate at the end of the warm-up), then the schedule."""
    scaled = base_lr * size
    if epoch < warmup:
        return scaled / size * (1 + (epoch + 1) / warmup * (size - 1))
    return scaled * (1.0 if epoch < 6 else 0.1 if epoch < 8 else 0.01)


def check_run(out: str, size: int, first_epoch: int, epochs: int) -> None:
    header = re.search(r"\[0\]<stdout>:(\d+) rank\(s\), (\d+) steps per epoch, resuming from epoch (\d+)", out)
    assert header and int(header.group(1)) == size and int(header.group(3)) == first_epoch, out[-3000:]
    steps = int(header.group(2))
    assert steps == int(1797 * 0.8) // size // 32
    lines = re.findall(r"\[0\]<stdout>:epoch +(\d+): lr ([\d.]+)  loss ([\d.]+)", out)
    assert [int(e) for e, _, _ in lines] == list(range(first_epoch + 1, epochs + 1)), out[-3000:]
    for epoch, lr, _ in lines:
        assert float(lr) == pytest.approx(expected_lr(int(epoch) - 1, size), rel=1e-4), (epoch, lr)
    assert int(re.search(r"optimizer iterations: (\d+)", out).group(1)) == epochs * steps
    assert "[0]<stdout>:weights identical on all ranks: True" in out
    assert not re.search(r"\[[1-9]\]<stdout>:", out), "only rank 0 prints"


def test_horovod_keras_mnist_example_trains_and_resumes_at_two_ranks(tmp_path):
    checkpoints = tmp_path / "checkpoints"
    code, out = smdistrun(2, [EXAMPLE, "--epochs", "4", "--checkpoint-dir", str(checkpoints)], timeout=300)
    assert code == 0, out[-5000:]
    check_run(out, 2, 0, 4)
    assert sorted(p.name for p in checkpoints.iterdir()) == sorted(
        ["best.keras"] + [f"checkpoint-{e}.keras" for e in range(1, 5)])
    # Again with more epochs: rank 0 resumes from checkpoint-4 through hvd.load_model (through every LR phase).
    code, out = smdistrun(2, [EXAMPLE, "--epochs", "9", "--checkpoint-dir", str(checkpoints)], timeout=300)
    assert code == 0, out[-5000:]
    check_run(out, 2, 4, 9)
    assert float(re.search(r"Test accuracy: ([\d.]+)", out).group(1)) >= 0.9, out[-3000:]


def test_horovod_keras_mnist_example_at_four_ranks(tmp_path):
    code, out = smdistrun(4, [EXAMPLE, "--epochs", "3", "--checkpoint-dir", str(tmp_path)], timeout=300)
    assert code == 0, out[-5000:]
    check_run(out, 4, 0, 3)
    assert (tmp_path / "best.keras").exists()
