# Sourced by the run scripts: the venv first on PATH, its optional packages on
# PYTHONPATH, and Open MPI allowed to run as root (CI and containers run as root).
export PATH="$PWD/.venv/bin:$PATH"
# What the examples, docs and JAX tests import besides smdist_tf (requirements-optional.txt, requirements-jax.txt).
export PYTHONPATH="$PWD/.venv/optional:$PWD/.venv/optional-jax${PYTHONPATH:+:$PYTHONPATH}"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export TF_CPP_MIN_LOG_LEVEL="${TF_CPP_MIN_LOG_LEVEL:-2}"
