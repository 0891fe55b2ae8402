"""Averaging stage gradients over data-parallel replicas and summing tied weights over stages.

Every rank contributes a flat buffer covering *all* trainable variables of the
unpartitioned model: its own stage's gradients in their slots, zeros elsewhere.
One world ``grouped_allreduce`` (the engine's fused allreduce) then sums each slot
over the d replicas of every stage that uses the variable; dividing by d gives
the replica average, and a tied variable gets the sum over its stages. The
engine has no process sets yet, so this costs ``num_stages`` times the bytes of
a per-stage allreduce; it needs no new communicator and no extra negotiation.
"""

from __future__ import annotations

import collections

import numpy as np
import tensorflow as tf

import smdist_tf as sd


class GradientSync:
    """Makes each stage's gradients those of the unpartitioned model on the global batch."""

    def __init__(self, all_variables: list, stage_variables: list, users: dict[int, int], dp_size: int):
        """Args:
            all_variables: trainable variables of the whole model, in the same order on every rank.
            stage_variables: the subset this rank's stage trains.
            users: number of stages using each variable (by ``id``).
            dp_size: replicas of each stage.
        """
        self.dp_size = dp_size
        self.needed = dp_size > 1 or any(n > 1 for n in users.values())
        mine = {id(v): k for k, v in enumerate(stage_variables)}
        # Per dtype: (stage index or None, shape, offset, size) of every variable.
        self._groups: dict[tf.DType, list] = collections.defaultdict(list)
        offsets: dict[tf.DType, int] = collections.defaultdict(int)
        for v in all_variables:
            dtype = tf.as_dtype(v.dtype)
            size = int(np.prod(v.shape, dtype=np.int64))
            self._groups[dtype].append((mine.get(id(v)), tuple(v.shape), offsets[dtype], size))
            offsets[dtype] += size

    def __call__(self, grads: list) -> list:
        """Returns the synchronised gradients, in the order of the stage's variables."""
        if not self.needed:
            return grads
        buffers, layout = [], []
        for dtype, entries in self._groups.items():
            parts = []
            for index, shape, offset, size in entries:
                if index is None:
                    parts.append(tf.zeros([size], dtype))
                else:
                    parts.append(tf.reshape(tf.cast(grads[index], dtype), [-1]))
                    layout.append((len(buffers), offset, size, shape, index))
            buffers.append(tf.concat(parts, 0))
        summed = sd.grouped_allreduce(buffers, op=sd.Sum, postscale_factor=1.0 / self.dp_size, name="pipeline.gradients")
        out = list(grads)
        for buffer, offset, size, shape, index in layout:
            out[index] = tf.reshape(summed[buffer][offset:offset + size], shape)
        return out
