"""Where scikit-learn (requirements-optional.txt) and JAX (requirements-jax.txt) live: on PYTHONPATH only where
a test asks.

tests/conftest.py gives .venv/optional to the processes of tests marked ``optional_packages`` and
.venv/optional-jax to those of tests marked ``jax_packages``; tests/mpi_harness.py gives .venv/optional to
the shared jobs, some of whose suites load scikit-learn's digits.
"""

from pathlib import Path

OPTIONAL_PACKAGES = str(Path(__file__).resolve().parents[1] / ".venv" / "optional")
JAX_PACKAGES = str(Path(__file__).resolve().parents[1] / ".venv" / "optional-jax")
