"""Adasum computed with NumPy, pairwise up the binary tree of the ranks, for the suites to compare against.

``adasum(a, b) = (1 - a·b / (2‖a‖²)) a + (1 - a·b / (2‖b‖²)) b`` (Maleki et al., MLSys 2021), a coefficient
term counted as 0 where its vector is zero; ranks 2i and 2i+1 are combined first, then those results in
pairs, and so on. Dots and norms are in float64 over the whole tensor; each level's result is rounded to
the tensor's dtype, as the engine stores it.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf


def adasum_pair(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The combination of two vectors (any shape, float64)."""
    dot = float(np.vdot(a, b))
    a_sq, b_sq = float(np.vdot(a, a)), float(np.vdot(b, b))
    a_coefficient = 1.0 - dot / (2.0 * a_sq) if a_sq > 0 else 1.0
    b_coefficient = 1.0 - dot / (2.0 * b_sq) if b_sq > 0 else 1.0
    return a_coefficient * a + b_coefficient * b


def adasum(values: list, dtype: tf.DType = tf.float64) -> np.ndarray:
    """Adasum of one tensor's per-rank values (a power-of-two count of them), rounded to ``dtype`` per level."""
    level = [np.asarray(v, np.float64) for v in values]
    assert len(level) & (len(level) - 1) == 0, "Adasum combines a power-of-two number of vectors"
    while len(level) > 1:
        level = [_rounded(adasum_pair(level[i], level[i + 1]), dtype) for i in range(0, len(level), 2)]
    return level[0]


def _rounded(x: np.ndarray, dtype: tf.DType) -> np.ndarray:
    return tf.cast(tf.cast(tf.constant(x, tf.float64), dtype), tf.float64).numpy()
