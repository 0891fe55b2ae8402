#!/usr/bin/env bash
# Command 1: set up from scratch (or reuse .venv) and run the main job:
# data-parallel training on scikit-learn's digits with 2 ranks.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
source scripts/env.sh
exec mpirun -np "${NP:-2}" --oversubscribe python examples/tf2_digits.py "$@"
