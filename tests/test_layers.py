"""The layers stay apart: what each part of the native code may include.

cc_ops/core is the framework-free engine, by folder: common/ (types, kernels,
settings), control/ (negotiation), transports/ (the interfaces, the choice
among them, and one folder per concrete transport, known only to
transports/registry.cc), and the engine itself (engine, streams, executor) at
the top. TensorFlow kernels reach the engine's facade (engine.h) and common/
only. cc_ops/xla holds the XLA FFI handlers: XLA's FFI headers and the engine,
no framework.
"""

from __future__ import annotations

import re
from pathlib import Path

import tensorflow as tf

ROOT = Path(__file__).resolve().parent.parent
CORE = ROOT / "cc_ops" / "core"
CONCRETE_TRANSPORTS = ("mpi", "shm", "cma", "nccl")
INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]([^>"]+)[>"]', re.M)
PROJECT_INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"', re.M)


def sources(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.suffix in (".h", ".cc"))


def includes(path: Path) -> list[str]:
    return INCLUDE.findall(path.read_text())


def project_includes(path: Path) -> list[str]:
    return PROJECT_INCLUDE.findall(path.read_text())


def without_comments(path: Path) -> str:
    text = re.sub(r"/\*.*?\*/", "", path.read_text(), flags=re.S)
    return re.sub(r"//[^\n]*", "", text)


class LayersTest(tf.test.TestCase):
    def test_the_engine_has_the_folders_that_show_its_architecture(self):
        for folder in ["common", "control", "transports", *(f"transports/{t}" for t in CONCRETE_TRANSPORTS)]:
            self.assertTrue(sources(CORE / folder), f"cc_ops/core/{folder} holds no sources")

    def test_the_engine_includes_no_tensorflow(self):
        for path in sources(CORE):
            for name in includes(path):
                self.assertFalse(name.startswith(("tensorflow/", "third_party/", "absl/")), f"{path}: {name}")

    def test_only_the_registry_knows_the_concrete_transports(self):
        concrete = tuple(f"transports/{t}/" for t in CONCRETE_TRANSPORTS)
        for path in sources(CORE):
            rel = path.relative_to(CORE).as_posix()
            if rel.startswith(concrete) or rel == "transports/registry.cc":
                continue
            for name in includes(path):
                self.assertFalse(name.startswith(concrete), f"{rel} includes the concrete transport {name}")
                self.assertNotIn(name, ("mpi.h", "nccl.h"), f"{rel} includes {name}")

    def test_the_engine_and_control_plane_never_name_mpi(self):
        for path in [*sources(CORE / "control"), *sorted(CORE.glob("*.cc")), *sorted(CORE.glob("*.h"))]:
            code = without_comments(path)
            self.assertIsNone(re.search(r"\bMPI_\w+|\bMpi\w+", code), f"{path} names MPI in code")

    def test_concrete_transports_do_not_reach_each_other_except_through_mpi(self):
        # Shared memory and cross-memory attach are set up over MPI communicators;
        # MPI itself needs neither.
        for path in sources(CORE / "transports" / "mpi"):
            for name in includes(path):
                self.assertFalse(name.startswith(("transports/shm/", "transports/cma/")), f"{path}: {name}")

    def test_common_depends_on_nothing_else(self):
        for path in sources(CORE / "common"):
            for name in project_includes(path):
                self.assertTrue(name.startswith("common/"), f"{path} includes {name}")

    def test_tensorflow_kernels_include_only_the_engine_common_and_their_own_headers(self):
        # Negotiation, transports and the executor stay behind engine.h; the
        # XLA lowerings also name the custom call's attributes (cc_ops/xla).
        tf_dir = ROOT / "cc_ops" / "tf"
        own = {p.relative_to(tf_dir).as_posix() for p in sources(tf_dir)}
        xla_headers = {p.name for p in (ROOT / "cc_ops" / "xla").glob("*.h")}
        framework = ("tensorflow/", "xla/")
        for path in sources(tf_dir):
            for name in project_includes(path):
                allowed = (name == "engine.h" or name.startswith(("common/", *framework))
                           or name in own or name in xla_headers)
                self.assertTrue(allowed, f"{path.relative_to(ROOT)} includes {name}")
            for name in includes(path):
                self.assertNotIn(name, ("mpi.h", "nccl.h"), f"{path}: {name}")

    def test_the_xla_handlers_include_only_the_ffi_api_the_engine_and_their_own_headers(self):
        xla = ROOT / "cc_ops" / "xla"
        own = {p.name for p in sources(xla)}
        self.assertTrue(own, "cc_ops/xla holds no sources")
        for path in sources(xla):
            for name in project_includes(path):
                allowed = name.startswith(("xla/ffi/api/", "common/")) or name in own or name == "engine.h"
                self.assertTrue(allowed, f"{path.relative_to(ROOT)} includes {name}")
            for name in includes(path):
                self.assertFalse(name.startswith(("tensorflow/", "jax", "pybind11")), f"{path}: {name}")


if __name__ == "__main__":
    tf.test.main()
