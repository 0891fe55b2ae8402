"""smdist_tf builds and runs against the ``tensorflow`` package, the CUDA-capable one users install by default.

The suite itself runs on ``tensorflow-cpu``. Here a fresh virtual environment gets
``tensorflow`` of the same version alone (``--no-deps``); everything else (Keras,
NumPy, Open MPI, pytest, the build tools) comes from this environment's site-packages
through a ``.pth`` line, which Python appends after the new environment's own
packages, so ``import tensorflow`` finds the ``tensorflow`` distribution. A copy of
the source tree is built against it by ``pip wheel`` (whose wheel must pin
``tensorflow``), and a smoke subset of the suite runs in that copy: the
single-process tests and the collectives' suite at 2 ranks.

The same copy then builds the GPU variant (``scripts/build_gpu.sh``, reusing this
environment as its side venv): compiled only, since there is no GPU here, and
checked through TensorFlow's kernel registry, which must list a ``GPU`` kernel for
every op in cc_ops/tf/collective_ops.cc. It builds in the wheel's build tree, so only the
op kernels compile again.

The builds (the venv, the wheel, the GPU variant) are CPU work no test times: they start with
the session, niced, in the CPU time the other tests leave idle (tests/background_builds.py).
"""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest
import tensorflow as tf

from tests import background_builds
from tests.mpi_harness import ROOT, mpi_env, run_process_group

# The op library is what differs between the two packages' builds; Keras and the error paths are the same Python
# code on both, and run in the main suite. Every op in one process, then every collective at 2 ranks (the suite
# alone, without the other suites of its shared job).
SMOKE = ["tests/test_single_process.py"]
SMOKE_AT_TWO_RANKS = "from tests.mpi_harness import run_suite; run_suite('suite_collectives.py', 2, timeout=600)"


def run(argv: list[str], cwd: Path, timeout: float, env: dict) -> str:
    """Runs ``argv`` in a process group of its own (killed whole on timeout); returns its output."""
    code, out = run_process_group(argv, cwd, env, timeout)
    assert code == 0, f"{argv} failed (exit {code}):\n{out[-8000:]}"
    return out


@dataclasses.dataclass
class LaneBuild:
    tmp: Path
    python: str
    site: Path
    probe: str
    tree: Path
    cpu_ops_mtime: int
    gpu_out: Path
    listing: str


def build_the_lane(commands: background_builds.Commands) -> LaneBuild:
    """The venv with ``tensorflow``, the wheel built against it, and the GPU variant: CPU work no test times."""
    tmp = commands.temporary_directory("tensorflow_package_lane_")
    env = mpi_env()
    env.pop("PYTHONPATH")  # the source tree must stay out of sight until the copy is built

    venv = tmp / "venv"
    commands.run([sys.executable, "-m", "venv", str(venv)], tmp, env)
    python = str(venv / "bin" / "python")
    site = next((venv / "lib").glob("python3.*/site-packages"))
    (site / "borrowed_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    commands.run([python, "-m", "pip", "install", "--no-deps", "-q", f"tensorflow=={tf.__version__}"], tmp, env)
    probe = commands.run([python, "-c", "import json, tensorflow as tf; print(json.dumps([tf.__version__, "
                                        "tf.__file__, tf.sysconfig.get_build_info()['is_cuda_build']]))"], tmp, env)

    tree = tmp / "source"
    shutil.copytree(ROOT, tree, ignore=shutil.ignore_patterns(".git", ".venv", "build", "dist", "__pycache__",
                                                              "*.so", "build_info.json", "*.egg-info",
                                                              ".venv-gpu"))
    # The wheel pins the TensorFlow it was built beside; the build leaves the libraries in the tree too.
    commands.run([python, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "-q", "-w", str(tmp / "dist"),
                  "."], tree, env)
    # The GPU variant, into a folder of its own: the CPU build in the copy stays as it is.
    cpu_ops_mtime = (tree / "smdist_tf" / "smdist_tf_ops.so").stat().st_mtime_ns
    gpu_out = tmp / "gpu" / "smdist_tf"
    # In the wheel's build tree (build/cmake), so the engine and bindings are not compiled again.
    listing = commands.run(["bash", "scripts/build_gpu.sh"], tree,
                           {**env, "SMDIST_BASE_PYTHON": sys.executable, "SMDIST_GPU_VENV": str(venv),
                            "SMDIST_GPU_OUT": str(gpu_out), "SMDIST_GPU_BUILD_DIR": str(tree / "build" / "cmake")})
    return LaneBuild(tmp, python, site, probe, tree, cpu_ops_mtime, gpu_out, listing)


LANE = background_builds.register("tensorflow package lane", build_the_lane)


class TensorflowPackageTest(tf.test.TestCase):
    @pytest.mark.background_build("tensorflow package lane")
    def test_the_build_and_a_smoke_subset_run_against_the_tensorflow_package(self):
        lane = LANE.result()
        version, location, cuda_build = json.loads(lane.probe.strip().splitlines()[-1])
        self.assertEqual(version, tf.__version__)
        self.assertTrue(location.startswith(str(lane.site)), location)  # the new package, not tensorflow-cpu
        self.assertTrue(cuda_build)

        (wheel,) = (lane.tmp / "dist").glob("smdist_tf-*.whl")
        with zipfile.ZipFile(wheel) as z:
            meta = z.read(next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))).decode()
        self.assertIn(f"Requires-Dist: tensorflow=={tf.__version__}\n", meta)
        tree = lane.tree
        info = json.loads((tree / "smdist_tf" / "build_info.json").read_text())
        self.assertEqual(info["tensorflow_version"], tf.__version__)
        self.assertFalse(info["gpu_kernels"])  # the CUDA-capable package alone does not make a GPU build

        listing = lane.listing
        self.assertNotRegex(listing, r"Building CXX object \S*smdist_core\.dir")  # only what the variant changes
        self.assertNotIn("installing tensorflow", listing)  # the lane's environment was reused
        self.assertTrue(json.loads((lane.gpu_out / "build_info.json").read_text())["gpu_kernels"])
        ops = re.findall(r'REGISTER_OP\("(\w+)"\)', (tree / "cc_ops" / "tf" / "collective_ops.cc").read_text())
        self.assertIn("SmdistAllreduce", ops)
        for op in ops:
            self.assertRegex(listing, f'op: "{op}"\ndevice_type: "GPU"')
            self.assertRegex(listing, f'op: "{op}"\ndevice_type: "CPU"')
        self.assertRegex(listing, r'op: "SmdistAlltoall"\ndevice_type: "GPU"\nhost_memory_arg: "splits"\n'
                                  r'host_memory_arg: "tensor_name"\nhost_memory_arg: "received_splits"')
        self.assertIn(f"OK: a GPU and a CPU kernel for each of the {len(ops)} collective ops", listing)
        self.assertEqual((tree / "smdist_tf" / "smdist_tf_ops.so").stat().st_mtime_ns, lane.cpu_ops_mtime)
        env = {**mpi_env(), "PYTHONPATH": str(tree)}
        out = run([lane.python, "-m", "pytest", "-q", "-p", "no:cacheprovider", *SMOKE], tree, 1200, env)
        self.assertRegex(out, r"\d+ passed")
        self.assertNotRegex(out, r"\d+ (failed|error)")
        run([lane.python, "-c", SMOKE_AT_TWO_RANKS], tree, 700, env)  # raises with the ranks' output unless all passed
