"""The engine and its Python binding work without TensorFlow: the GPU test machine has none.

Collectives on NumPy buffers through the runtime module, at 2 and 4 ranks, with
TensorFlow made impossible to import; and a build configured with
``-DSMDIST_WITH_TENSORFLOW=OFF`` (engine and bindings only) doing the same, and its XLA
handler library (built against jaxlib's FFI headers) running under JAX's XLA. The build starts with
the session, niced, in the CPU time the other tests leave idle (tests/background_builds.py).
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

from tests import background_builds
from tests.gpu.test_xla_collectives import HAS_JAX, run_ranks
from tests.mpi_harness import ROOT, mpi_env, run_under_mpi
from tests.optional_packages import JAX_PACKAGES

pytestmark = pytest.mark.jax_packages  # jaxlib's FFI headers build the handlers, JAX runs them

SCRIPT = "tests/mp/engine_buffers.py"


@pytest.mark.parametrize("np", [2, 4])
def test_buffer_collectives_without_tensorflow(np):
    code, out = run_under_mpi(np, [SCRIPT], timeout=240)
    assert code == 0, out[-8000:]
    for rank in range(np):
        assert f"ENGINE-BUFFERS OK {rank}" in out, out[-8000:]


def test_the_runtime_loads_by_its_file_and_leaves_sys_path_alone():
    """The package folder never joins ``sys.path``: its modules would stand in for top-level packages."""
    check = ("import importlib.util, sys\n"
             "before = list(sys.path)\n"
             "from tests.runtime_module import load_runtime_module\n"
             "rt = load_runtime_module()\n"
             "assert sys.path == before, sys.path\n"
             "assert importlib.util.find_spec('compression') is None\n"
             "assert 'tensorflow' not in sys.modules\n"
             "print('loaded', rt.__name__, rt.__file__)\n")
    result = subprocess.run([sys.executable, "-c", check], cwd=ROOT, env=mpi_env(), capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"loaded _runtime {ROOT / 'smdist_tf'}" in result.stdout, result.stdout


@dataclasses.dataclass
class BuildWithoutTensorflow:
    output: str
    out_dir: str


def build_without_tensorflow(commands: background_builds.Commands) -> BuildWithoutTensorflow:
    """Engine, bindings and XLA handlers configured without TensorFlow: CPU work no test times."""
    # The build tree is kept between runs (only the output directory is new), as scripts/run_gpu_checks.sh keeps it.
    build_dir = ROOT / "build" / "without-tensorflow"
    out_dir = commands.temporary_directory("smdist_no_tf_")
    env = mpi_env({"PYTHONPATH": JAX_PACKAGES})  # jaxlib's FFI headers
    output = commands.run(["cmake", "-S", str(ROOT), "-B", str(build_dir), "-G", "Ninja",
                           f"-DPython_EXECUTABLE={sys.executable}", "-DSMDIST_WITH_TENSORFLOW=OFF",
                           f"-DSMDIST_OUTPUT_DIR={out_dir}"], ROOT, env)
    output += commands.run(["cmake", "--build", str(build_dir)], ROOT, env)
    return BuildWithoutTensorflow(output, str(out_dir))


BUILD = background_builds.register("engine without tensorflow", build_without_tensorflow)


@pytest.mark.background_build("engine without tensorflow")
def test_a_build_without_tensorflow_runs_the_engine():
    built = BUILD.result()
    output, out_dir = built.output, built.out_dir
    assert "TensorFlow (none: engine and bindings only)" in output
    libraries = sorted(p.name for p in Path(out_dir).glob("*.so"))
    assert "libsmdist_core.so" in libraries and "smdist_tf_ops.so" not in libraries, libraries
    assert any(name.startswith("_runtime.") for name in libraries), libraries
    code, out = run_under_mpi(2, [SCRIPT, out_dir], timeout=240)
    assert code == 0, out[-8000:]
    for rank in range(2):
        assert f"ENGINE-BUFFERS OK {rank}" in out, out[-8000:]
    if HAS_JAX:  # the framework-free handlers, from jaxlib's headers, run by JAX's XLA
        assert "XLA handlers (FFI headers in" in output and "jaxlib" in output, output[-3000:]
        assert "libsmdist_xla.so" in libraries, libraries
        run_ranks(2, "cpu", {"SMDIST_RUNTIME_DIR": out_dir})
