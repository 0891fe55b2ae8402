"""``smdistrun --check-build``: what this smdist_tf was built with and can use (``python -m smdist_tf.check``'s report).

The report runs in a child Python: it loads TensorFlow, which the launcher never
imports, and ``smdist_tf.check`` sits above the launcher (it reuses its MPI detection).
"""

from __future__ import annotations

import subprocess
import sys


def print_check_build() -> int:
    """Prints the report; returns the exit code (1 if smdist_tf cannot be loaded)."""
    done = subprocess.run([sys.executable, "-m", "smdist_tf.check"], capture_output=True, text=True)
    if done.returncode != 0:
        reason = done.stderr.strip().splitlines()[-1:] or [f"exit status {done.returncode}"]
        print(f"smdistrun: smdist_tf cannot be loaded: {reason[0]}", file=sys.stderr)
        return 1
    print(done.stdout, end="")
    return 0
