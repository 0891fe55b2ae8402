"""Where scikit-learn and JAX live (requirements-optional.txt): on PYTHONPATH only where a test asks.

tests/conftest.py gives .venv/optional to the processes of tests marked ``optional_packages``;
tests/mpi_harness.py gives it to the shared jobs, some of whose suites load scikit-learn's digits.
"""

from pathlib import Path

OPTIONAL_PACKAGES = str(Path(__file__).resolve().parents[1] / ".venv" / "optional")
