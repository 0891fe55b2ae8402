#!/usr/bin/env bash
# Command 1: set up from scratch (or reuse .venv) and run the main job:
# Keras model.fit under DataParallelStrategy on scikit-learn's digits, 2 ranks,
# started by the project's launcher (smdistrun, over mpirun).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
source scripts/env.sh
exec smdistrun -np "${NP:-2}" python examples/keras_digits.py "$@"
