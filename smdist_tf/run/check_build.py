"""``smdistrun --check-build``: what this smdist_tf was built with and can use (``python -m smdist_tf.check``'s report)."""

from __future__ import annotations

import sys


def print_check_build() -> int:
    """Prints the report; returns the exit code (1 if smdist_tf cannot be loaded)."""
    try:
        from smdist_tf.check import report  # noqa: PLC0415 - imports TensorFlow: only this command needs it

        print(report())
    except ImportError as e:
        print(f"smdistrun: smdist_tf cannot be loaded: {e}", file=sys.stderr)
        return 1
    return 0
