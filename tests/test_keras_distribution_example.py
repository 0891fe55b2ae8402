"""examples/keras_distribution.py on JAX: the script that tests/mp/suite_keras_distribution.py runs on TensorFlow.

The suite itself (Keras 3's ``keras.distribution`` on TensorFlow at 2 and 4 ranks) runs in
the jobs of tests/test_keras_multiprocess.py, beside suite_keras.py.
"""

import os
import re
import socket
import subprocess
import sys

import pytest

from tests.mpi_harness import ROOT

pytestmark = [pytest.mark.optional_packages, pytest.mark.jax_packages]  # the example loads scikit-learn's digits and runs on JAX


def test_the_same_example_runs_on_jax():
    """examples/keras_distribution.py, unmodified, in one JAX process (Keras' env variables for initialize)."""
    with socket.socket() as probe:  # a free port for JAX's coordinator service
        probe.bind(("localhost", 0))
        port = probe.getsockname()[1]
    env = dict(os.environ, KERAS_BACKEND="jax", JAX_PLATFORMS="cpu", KERAS_DISTRIBUTION_JOB_ADDRESSES=f"localhost:{port}",
               KERAS_DISTRIBUTION_NUM_PROCESSES="1", KERAS_DISTRIBUTION_PROCESS_ID="0", TF_CPP_MIN_LOG_LEVEL="2")
    done = subprocess.run([sys.executable, "examples/keras_distribution.py", "--epochs", "2"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-5000:]
    assert "backend jax, 1 process(es), devices ['cpu:0']" in out, out[-3000:]
    losses = [float(v) for v in re.findall(r"epoch \d: loss ([\d.]+)", out)]
    assert len(losses) == 2 and losses[-1] < losses[0], out[-3000:]
    assert float(re.search(r"accuracy ([\d.]+)", out).group(1)) > 0.5, out[-3000:]
