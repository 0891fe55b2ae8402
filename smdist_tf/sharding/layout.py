"""``ShardLayout``: which elements of each variable a rank owns when state is split over ranks.

Each variable is flattened and padded to a multiple of the number of ranks; rank ``r``
owns the ``r``-th of the equal pieces. Per-variable pieces (not one slice of a
concatenation) keep every shard tied to one variable, so name-based settings such as
weight-decay exclusions and per-variable clipping still apply. A variable padded to
``ranks`` equal pieces is exactly what a reduce-scatter splits (rank ``r`` receives piece
``r``), and the allgather of its pieces is that variable, padded: neither needs packing.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import tensorflow as tf


class ShardLayout:
    """Shard sizes of a list of variables over ``ranks`` ranks, seen from the rank at ``index``.

    Args:
        shapes: the variables' shapes (fully defined).
        ranks: how many ranks share the state.
        index: this rank's position among them.
    """

    def __init__(self, shapes: Sequence[Sequence[int]], ranks: int, index: int) -> None:
        self.shapes = [tuple(int(d) for d in shape) for shape in shapes]
        self.ranks = ranks
        self.index = index
        self.sizes = [int(np.prod(shape, dtype=np.int64)) for shape in self.shapes]
        # At least one element, so every rank holds a shard of every variable.
        self.shard_sizes = [max(1, -(-n // ranks)) for n in self.sizes]

    def padded(self, i: int, value: tf.Tensor) -> tf.Tensor:
        """Variable ``i``'s full ``value``, flat and zero-padded to ``ranks`` equal pieces (a copy only if padded)."""
        flat = tf.reshape(value, [-1])
        pad = self.shard_sizes[i] * self.ranks - self.sizes[i]
        return tf.pad(flat, [[0, pad]]) if pad else flat

    def shard_of(self, i: int, value: tf.Tensor, own_buffer: bool = False) -> tf.Tensor:
        """This rank's piece of variable ``i``'s full ``value``.

        With ``own_buffer``, the piece does not share ``value``'s memory: a slice keeps its tensor's
        whole buffer alive, so a variable made or assigned from it would hold the full value.
        """
        # Slices before padding, so no full-size copy of the variable is made.
        s, n = self.shard_sizes[i], self.sizes[i]
        start, stop = min(self.index * s, n), min((self.index + 1) * s, n)
        piece = tf.reshape(value, [-1])[start:stop]
        if stop - start < s:
            return tf.pad(piece, [[0, s - (stop - start)]])  # a new buffer
        return tf.raw_ops.DeepCopy(x=piece) if own_buffer else piece

    def shard_of_array(self, i: int, array: np.ndarray) -> np.ndarray:
        """``shard_of`` for a NumPy array (restoring a checkpoint)."""
        s = self.shard_sizes[i]
        flat = np.zeros(s * self.ranks, dtype=array.dtype)
        flat[: self.sizes[i]] = array.reshape(-1)
        return flat[self.index * s : (self.index + 1) * s]

    def full_from_gathered(self, i: int, gathered: tf.Tensor) -> tf.Tensor:
        """Variable ``i``'s full value from the allgather of every rank's piece of it."""
        return tf.reshape(gathered[: self.sizes[i]], self.shapes[i])
