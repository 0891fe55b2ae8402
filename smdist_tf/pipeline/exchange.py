"""Sums or broadcasts variables within groups of ranks, each group a process set.

A pipeline variable is held by a *group* of ranks: the data-parallel replicas of every
stage that uses it (more than one stage for tied weights). Gradients must be summed,
and initial values copied, within each group. Each distinct group is registered as a
process set when the plan is made (every rank makes the same plans, in the same order),
so a group's sum is one fused allreduce among its members only: a rank moves and holds
its own stage's values, never a buffer covering the whole model, and the groups of
different stages run at the same time. The byte helpers move values of any dtype
through point-to-point messages and byte-wise collectives.
"""

from __future__ import annotations

from typing import Optional, Sequence

import tensorflow as tf

from smdist_tf.collectives import grouped_allreduce, grouped_broadcast
from smdist_tf.reduce_ops import Sum
from smdist_tf import process_sets
from smdist_tf.buckets import gradient_buckets


def to_bytes(value: tf.Tensor) -> tf.Tensor:
    """A tensor as a flat uint8 tensor (no copy where TensorFlow can avoid one)."""
    value = tf.reshape(tf.convert_to_tensor(value), [-1])
    if value.dtype == tf.bool:
        return tf.cast(value, tf.uint8)
    if value.dtype.size == 1:
        return tf.bitcast(value, tf.uint8)
    return tf.reshape(tf.bitcast(value, tf.uint8), [-1])


def from_bytes(data: tf.Tensor, dtype: tf.DType, shape: Sequence[int]) -> tf.Tensor:
    """Inverse of :func:`to_bytes`."""
    dtype = tf.as_dtype(dtype)
    if dtype == tf.bool:
        flat = tf.cast(data, tf.bool)
    elif dtype.size == 1:
        flat = tf.bitcast(data, dtype)
    else:
        flat = tf.bitcast(tf.reshape(data, [-1, dtype.size]), dtype)
    return tf.reshape(flat, shape)


class GroupPlan:
    """Which of this rank's variables are shared with which ranks, and how to combine them.

    Making a plan registers a process set for every group of two or more ranks (or reuses
    the registered set with those ranks): collective over all ranks, which must make the
    same plans in the same order.

    Args:
        holders: for every variable of the model, in the same order on every rank, the
            ascending tuple of ranks holding it.
        local: for every variable, its index in this rank's value list, or ``None`` if
            this rank does not hold it.
    """

    def __init__(self, holders: Sequence[tuple], local: Sequence[Optional[int]]):
        self.needed = any(len(h) > 1 for h in holders)
        # Decided from global facts only, so every rank registers the same sets in the same order.
        self.sets = {members: process_sets.ensure_registered(members)
                     for members in sorted({tuple(h) for h in holders if len(h) > 1})}
        # This rank's values per group, in the variables' global order.
        self.groups: dict[tuple, list[int]] = {}
        for members, index in zip(holders, local):
            if len(members) > 1 and index is not None:
                self.groups.setdefault(tuple(members), []).append(index)

    def reduce(self, values: list, postscale: float = 1.0, name: str = "pipeline.group_sum") -> list:
        """Sums each grouped value over its group's members, times ``postscale``; others are returned as given."""
        out = list(values)
        for members, indices in sorted(self.groups.items()):
            tensors = [tf.convert_to_tensor(values[i]) for i in indices]
            # Inside a tf.function (a pipeline step), buckets in backpropagation's order: the
            # last layers' sums start while the last backward still runs for the first layers.
            buckets = gradient_buckets(tensors, list(range(len(tensors))))
            for k, bucket in enumerate(buckets):
                label = _label(members) if len(buckets) == 1 else f"{_label(members)}.{k}"
                summed = grouped_allreduce([tensors[j] for j in bucket], op=Sum, name=f"{name}.{label}",
                                              process_set=self.sets[members])
                for j, t in zip(bucket, summed):
                    out[indices[j]] = t
            for i in indices:
                t, is_float = out[i], out[i].dtype.is_floating
                if postscale != 1.0:
                    # Integers: scale exactly, then truncate.
                    t = t * tf.cast(postscale, t.dtype) if is_float else \
                        tf.cast(tf.cast(t, tf.float64) * postscale, t.dtype)
                out[i] = t
        return out

    def broadcast(self, values: list, name: str = "pipeline.group_broadcast") -> list:
        """Gives every grouped value its first (lowest) member's value."""
        out = list(values)
        for members, indices in sorted(self.groups.items()):
            received = grouped_broadcast([values[i] for i in indices], members[0],
                                            name=f"{name}.{_label(members)}", process_set=self.sets[members])
            for i, t in zip(indices, received):
                out[i] = t
        return out


def _label(members: tuple) -> str:
    return "-".join(str(r) for r in members)
