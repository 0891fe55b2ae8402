"""What every rank script in tests/gpu checks its results with: each rank's values and a counted comparison."""

from __future__ import annotations

import numpy as np

FLOATS = ["float16", "bfloat16", "float32", "float64"]  # a list: every rank must loop in one order


def rank_values(r: int, n: int) -> np.ndarray:
    """Rank `r`'s `n` input values: small, distinct per rank, exact in every dtype."""
    return (r + 1 + np.arange(n) % 5).astype(np.float64)


class Checks:
    """Compares results with NumPy's, counting the comparisons made."""

    def __init__(self) -> None:
        self.count = 0

    def close(self, name: str, got: np.ndarray, want: np.ndarray, what: str) -> None:
        """`got` (elements of dtype `name`) equals `want`: to fp16/bf16 or float precision, exactly for integers."""
        self.count += 1
        if name in FLOATS:
            tol = 2e-2 if name in ("float16", "bfloat16") else 1e-6
            np.testing.assert_allclose(np.asarray(got).astype(np.float64), want, rtol=tol, atol=tol, err_msg=what)
        else:
            np.testing.assert_array_equal(got, np.asarray(want).astype(np.int64).astype(name), err_msg=what)
