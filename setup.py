"""Build and install smdist_tf.

``pip install --no-build-isolation -e .`` (or ``.``) compiles the engine, the
TensorFlow ops and the runtime bindings against the TensorFlow already in the
environment and the MPI found by ``cc_ops/build.py`` (see its docstring).
Build isolation must be off so the build sees that TensorFlow.
"""

import sys
from pathlib import Path

from setuptools import Extension, find_packages, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))


class BuildNative(build_ext):
    """Delegates to cc_ops/build.py, which builds all three shared objects at once."""

    def run(self) -> None:
        from cc_ops.build import build_all

        in_tree = self.inplace or getattr(self, "editable_mode", False)
        out_dir = ROOT / "smdist_tf" if in_tree else Path(self.build_lib) / "smdist_tf"
        build_all(out_dir)
        if not in_tree:
            # Keep the in-tree copy in step so running from the checkout works too.
            build_all(ROOT / "smdist_tf")

    def get_outputs(self) -> list:
        return []


setup(
    name="smdist_tf",
    version="0.1.0",
    description="Fast, Horovod-compatible distributed training for TensorFlow 2 and Keras 3 over MPI",
    python_requires=">=3.11",
    packages=find_packages(include=["smdist_tf", "smdist_tf.*"]),
    package_data={"smdist_tf": ["*.so", "build_info.json"]},
    ext_modules=[Extension("smdist_tf._runtime", sources=[])],
    cmdclass={"build_ext": BuildNative},
    # TensorFlow is not listed: the build needs the one already installed
    # (tensorflow-cpu or tensorflow), and pip must not swap it underneath.
    install_requires=["numpy"],
    entry_points={
        "console_scripts": ["smdistrun=smdist_tf.run.launcher:main"],
        # @pytest.mark.distributed (smdist_tf.testing) in every pytest session.
        "pytest11": ["smdist_tf = smdist_tf.testing.pytest_plugin"],
    },
    zip_safe=False,
)
