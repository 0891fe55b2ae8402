"""`pip wheel .` builds a wheel that holds the compiled ops, tied to its TensorFlow, and runs from another venv.

The fresh virtual environment gets the wheel alone (``--no-deps``); TensorFlow,
NumPy and Open MPI come from this environment's site-packages through a ``.pth``
line, which adds the directory without running its ``.pth`` files, so the source
tree's editable smdist_tf stays out of sight. The job runs from a directory
outside the tree, under the new environment's own ``smdistrun``.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import zipfile
from importlib import metadata
from pathlib import Path

import tensorflow as tf

from tests.mpi_harness import ROOT, mpi_env

def tensorflow_distribution() -> str:
    for dist in ("tensorflow-cpu", "tensorflow"):
        try:
            metadata.version(dist)
            return dist
        except metadata.PackageNotFoundError:
            continue
    raise AssertionError("no TensorFlow distribution installed")


def run(argv: list[str], cwd: Path, timeout: float) -> subprocess.CompletedProcess:
    env = mpi_env()
    env.pop("PYTHONPATH")  # the source tree must stay out of sight
    result = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, f"{argv} failed:\n{result.stdout[-3000:]}\n{result.stderr[-5000:]}"
    return result


class WheelTest(tf.test.TestCase):
    def test_the_wheel_installs_into_a_fresh_venv_and_runs_a_two_rank_job(self):
        tmp = Path(tempfile.mkdtemp(prefix="smdist_wheel_"))
        self.addCleanup(shutil.rmtree, tmp, ignore_errors=True)
        run([sys.executable, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "-q", "-w", str(tmp / "dist"),
             str(ROOT)], ROOT, 900)
        (wheel,) = (tmp / "dist").glob("smdist_tf-*.whl")
        # Tagged with the TensorFlow it was built for, and for this Python and platform.
        self.assertRegex(wheel.name, rf"^smdist_tf-0\.1\.0\+tf{re.escape(tf.__version__)}-cp311-cp311-linux_x86_64\.whl$")
        with zipfile.ZipFile(wheel) as z:
            names = set(z.namelist())
            for lib in ("libsmdist_core.so", "libsmdist_xla.so", "smdist_tf_ops.so", "build_info.json",
                        "testing/pytest_plugin.py"):
                self.assertIn(f"smdist_tf/{lib}", names)
            self.assertTrue(any(re.fullmatch(r"smdist_tf/_runtime\..*\.so", n) for n in names), names)
            meta = z.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
            entry_points = z.read(next(n for n in names if n.endswith(".dist-info/entry_points.txt"))).decode()
        self.assertIn(f"Requires-Dist: {tensorflow_distribution()}=={tf.__version__}", meta)
        self.assertIn("smdistrun = smdist_tf.run.launcher:main", entry_points)
        self.assertIn("smdist_tf = smdist_tf.testing.pytest_plugin", entry_points)

        venv = tmp / "venv"
        run([sys.executable, "-m", "venv", str(venv)], tmp, 120)
        site = next((venv / "lib").glob("python3.*/site-packages"))
        (site / "borrowed_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
        run([str(venv / "bin" / "python"), "-m", "pip", "install", "--no-deps", "-q", str(wheel)], tmp, 300)

        outside = tmp / "elsewhere"
        outside.mkdir()
        program = ("import smdist_tf as sd, tensorflow as tf\n"
                   "sd.init()\n"
                   "assert sd.__file__.startswith(%r), sd.__file__\n"
                   "out = sd.allreduce(tf.constant([float(sd.rank() + 1)]), op=sd.Sum, name='wheel')\n"
                   "print('WHEEL', sd.rank(), out.numpy().tolist())\n") % str(site)
        result = run([str(venv / "bin" / "smdistrun"), "-np", "2", str(venv / "bin" / "python"), "-c", program],
                     outside, 240)
        for rank in range(2):
            self.assertIn(f"[{rank}]<stdout>:WHEEL {rank} [3.0]", result.stdout)


if __name__ == "__main__":
    tf.test.main()
