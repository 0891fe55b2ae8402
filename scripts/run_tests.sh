#!/usr/bin/env bash
# Command 2: set up from scratch (or reuse .venv) and run the whole test suite.
# Multi-process suites start their own mpirun with 2 and 4 ranks.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
source scripts/env.sh
start=$(date +%s)
status=0
python -m pytest tests -v -p no:cacheprovider -p tests.file_times --durations=40 "$@" || status=$?
echo "[run_tests] wall time: $(( $(date +%s) - start )) s"
exit $status
