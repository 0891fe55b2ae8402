"""Deterministic per-rank inputs and the results collectives must produce, computed locally with NumPy."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

import smdist_tf as sd

REDUCIBLE = [tf.uint8, tf.int8, tf.uint16, tf.int16, tf.int32, tf.int64, tf.float16, tf.bfloat16, tf.float32, tf.float64]
MOVABLE = REDUCIBLE + [tf.bool]
REDUCE_OPS = [sd.Sum, sd.Average, sd.Min, sd.Max, sd.Product]


def rank_values(rank: int, shape, dtype: tf.DType, op: int = sd.Sum, seed: int = 0) -> np.ndarray:
    """Values rank ``rank`` contributes, exactly representable in ``dtype`` and safe from overflow."""
    rng = np.random.default_rng(seed * 1009 + rank * 7919 + 17)
    if dtype == tf.bool:
        return rng.integers(0, 2, size=shape).astype(bool)
    if op == sd.Product:
        if dtype.is_floating:
            base = rng.uniform(0.5, 1.5, size=shape)
        else:
            base = rng.choice([1, 2] if dtype in (tf.uint8, tf.uint16) else [-1, 1, 2], size=shape)
    elif dtype.is_floating:
        base = rng.uniform(-4.0, 4.0, size=shape)
    elif dtype in (tf.uint8, tf.uint16):
        base = rng.integers(0, 30, size=shape)
    else:
        base = rng.integers(-15, 30, size=shape)
    # Round through the dtype so the expectation sees the exact inputs.
    return tf.cast(tf.constant(base, tf.float64), dtype).numpy()


def all_rank_values(shape, dtype, op=sd.Sum, seed=0) -> list[np.ndarray]:
    return [rank_values(r, shape, dtype, op, seed) for r in range(sd.size())]


def contributors(joined=()) -> list[int]:
    """The ranks that submit a collective while the ranks in ``joined`` wait in ``join()``, in rank order."""
    return [r for r in range(sd.size()) if r not in joined]


def expected_reduction(values: list[np.ndarray], op: int, dtype: tf.DType, prescale=1.0, postscale=1.0) -> np.ndarray:
    # Integers are scaled in double and truncated toward zero on each rank, as the engine documents.
    stack = np.stack([v.astype(np.float64) * prescale for v in values])
    if not dtype.is_floating:
        stack = np.trunc(stack)
    n = len(values)
    if op == sd.Sum:
        out = stack.sum(axis=0)
    elif op == sd.Average:
        out = stack.sum(axis=0)
        out = out / n if dtype.is_floating else np.trunc(out / n)
    elif op == sd.Min:
        out = stack.min(axis=0)
    elif op == sd.Max:
        out = stack.max(axis=0)
    else:
        out = stack.prod(axis=0)
    out = out * postscale
    return out if dtype.is_floating else np.trunc(out)


def tolerance(dtype: tf.DType) -> dict:
    if dtype == tf.float16:
        return dict(rtol=1e-2, atol=2e-2)
    if dtype == tf.bfloat16:
        return dict(rtol=4e-2, atol=1e-1)
    if dtype == tf.float32:
        return dict(rtol=1e-5, atol=1e-5)
    if dtype == tf.float64:
        return dict(rtol=1e-12, atol=1e-12)
    return dict(rtol=0, atol=0)
