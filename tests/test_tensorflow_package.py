"""The GPU setup a user runs, ``SMDIST_GPU=1 bash scripts/bootstrap.sh``, on the ``tensorflow`` package.

The suite itself runs on ``tensorflow-cpu``. Here a copy of the source tree is set up the way
docs/installation.md tells a GPU user: ``SMDIST_GPU=1 bash scripts/bootstrap.sh`` makes the copy's
``.venv`` hold ``tensorflow`` (the CUDA build; without the gigabytes of CUDA libraries of
``tensorflow[and-cuda]``, which importing and listing kernels do not need and no GPU here could
use) and the GPU variant of the ops as the installed smdist_tf. Checked: TensorFlow's kernel
registry lists a GPU and a CPU kernel for every op in cc_ops/tf/collective_ops.cc (compiled only:
there is no GPU here); that environment's ``smdistrun --check-build`` reports the GPU kernels and
the XLA_GPU_JIT lowering; the wheel built there pins ``tensorflow``; and a smoke subset of the suite
(the single-process tests, the collectives' suite at 2 ranks) passes with that build.

The setup (venv, packages, build, wheel) is CPU work no test times: it starts with the session,
niced, in the CPU time the other tests leave idle (tests/background_builds.py). So does the smoke
subset, once the suite's last tests (the wall-clock ones, which mostly wait) have started; the test
judges what it printed.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
import sys
import zipfile
from pathlib import Path

import pytest
import tensorflow as tf

from tests import background_builds
from tests.mpi_harness import ROOT, mpi_env

# The op library is what differs between the two packages' builds; Keras and the error paths are the same Python
# code on both, and run in the main suite. Every op in one process, then every collective at 2 ranks (the suite
# alone, without the other suites of its shared job).
SMOKE = ["tests/test_single_process.py"]
SMOKE_AT_TWO_RANKS = "from tests.mpi_harness import run_suite; run_suite('suite_collectives.py', 2, timeout=600)"


@dataclasses.dataclass
class LaneBuild:
    tmp: Path
    tree: Path
    python: str
    bootstrap: str
    probe: str
    check_build: str
    smoke: str


def build_the_lane(commands: background_builds.Commands) -> LaneBuild:
    """A copy of the tree set up by ``SMDIST_GPU=1 bash scripts/bootstrap.sh``, its wheel, and the smoke subset's
    run there: CPU work no test times."""
    tmp = commands.temporary_directory("tensorflow_package_lane_")
    env = mpi_env()
    env.pop("PYTHONPATH")  # the source tree must stay out of sight until the copy is built
    tree = tmp / "source"
    shutil.copytree(ROOT, tree, ignore=shutil.ignore_patterns(".git", ".venv", "build", "dist", "__pycache__",
                                                              "*.so", "build_info.json", "*.egg-info"))
    bootstrap = commands.run(["bash", "scripts/bootstrap.sh"], tree,
                             {**env, "PYTHON": sys.executable, "SMDIST_GPU": "1",
                              "SMDIST_GPU_TENSORFLOW": f"tensorflow=={tf.__version__}"})
    python = str(tree / ".venv" / "bin" / "python")
    probe = commands.run([python, "-c", "import json, tensorflow as tf; print(json.dumps([tf.__version__, "
                                        "tf.__file__, tf.sysconfig.get_build_info()['is_cuda_build']]))"], tree, env)
    # The same configuration as the installed build: nothing compiles again, and the in-tree libraries stay.
    commands.run([python, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "-q", "-w", str(tmp / "dist"),
                  "-C", "cmake.define.SMDIST_GPU_KERNELS=ON", "."], tree, env)
    check_build = commands.run([str(tree / ".venv" / "bin" / "smdistrun"), "--check-build"], tree, env)
    background_builds.wait_for_the_last_tests()  # its ranks' time limits need a core, which these tests leave
    smoke_env = {**env, "PYTHONPATH": str(tree)}
    smoke = commands.run([python, "-m", "pytest", "-q", "-p", "no:cacheprovider", *SMOKE], tree, smoke_env)
    # Raises with the ranks' output unless every rank passed.
    commands.run([python, "-c", SMOKE_AT_TWO_RANKS], tree, smoke_env)
    return LaneBuild(tmp, tree, python, bootstrap, probe, check_build, smoke)


LANE = background_builds.register("tensorflow package lane", build_the_lane)


class TensorflowPackageTest(tf.test.TestCase):
    @pytest.mark.background_build("tensorflow package lane")
    def test_the_gpu_setup_of_the_docs_builds_and_a_smoke_subset_runs(self):
        lane = LANE.result()
        version, location, cuda_build = json.loads(lane.probe.strip().splitlines()[-1])
        self.assertEqual(version, tf.__version__)
        self.assertTrue(location.startswith(str(lane.tree / ".venv")), location)  # the new package, not tensorflow-cpu
        self.assertTrue(cuda_build)

        tree = lane.tree
        info = json.loads((tree / "smdist_tf" / "build_info.json").read_text())
        self.assertEqual(info["tensorflow_version"], tf.__version__)
        self.assertTrue(info["gpu_kernels"])
        self.assertEqual((tree / ".venv" / ".smdist_gpu").read_text().strip(), "1")  # a later bootstrap keeps it
        (wheel,) = (lane.tmp / "dist").glob("smdist_tf-*.whl")
        with zipfile.ZipFile(wheel) as z:
            meta = z.read(next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))).decode()
        self.assertIn(f"Requires-Dist: tensorflow=={tf.__version__}\n", meta)

        listing = lane.bootstrap
        ops = re.findall(r'REGISTER_OP\("(\w+)"\)', (tree / "cc_ops" / "tf" / "collective_ops.cc").read_text())
        self.assertIn("SmdistAllreduce", ops)
        for op in ops:
            self.assertRegex(listing, f'op: "{op}"\ndevice_type: "GPU"')
            self.assertRegex(listing, f'op: "{op}"\ndevice_type: "CPU"')
        self.assertRegex(listing, r'op: "SmdistAlltoall"\ndevice_type: "GPU"\nhost_memory_arg: "splits"\n'
                                  r'host_memory_arg: "tensor_name"\nhost_memory_arg: "received_splits"')
        self.assertIn(f"OK: a GPU and a CPU kernel for each of the {len(ops)} collective ops", listing)
        # What the environment's own smdistrun says: the installed ops are the GPU variant.
        self.assertIn(f"({tree / 'smdist_tf'})", lane.check_build)
        self.assertRegex(lane.check_build, r"CUDA build of TensorFlow: True")
        self.assertRegex(lane.check_build, r"\[X\] GPU\b")
        self.assertRegex(lane.check_build, r"\[X\] XLA_GPU_JIT")

        self.assertRegex(lane.smoke, r"\d+ passed")
        self.assertNotRegex(lane.smoke, r"\d+ (failed|error)")
