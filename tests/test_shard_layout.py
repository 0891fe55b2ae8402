"""``ShardLayout``: pieces of uneven and tiny variables, padding and gathering, against NumPy."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from smdist_tf.sharding.layout import ShardLayout


class ShardLayoutTest(tf.test.TestCase):
    SHAPES = [(7, 5), (5,), (1,), (2, 3, 4)]

    def values(self) -> list[np.ndarray]:
        rng = np.random.default_rng(0)
        return [rng.normal(size=shape).astype(np.float32) for shape in self.SHAPES]

    def test_pieces_cover_each_variable_once_with_zero_padding(self):
        for ranks in (1, 2, 3, 4, 8):
            layouts = [ShardLayout(self.SHAPES, ranks, r) for r in range(ranks)]
            for i, value in enumerate(self.values()):
                pieces = [layout.shard_of(i, tf.constant(value)).numpy() for layout in layouts]
                arrays = [layout.shard_of_array(i, value) for layout in layouts]
                for piece, array in zip(pieces, arrays):
                    self.assertAllEqual(piece, array)
                    self.assertEqual(piece.shape, (layouts[0].shard_sizes[i],))
                joined = np.concatenate(pieces)
                self.assertAllEqual(joined[: value.size], value.ravel())
                self.assertAllEqual(joined[value.size:], np.zeros(joined.size - value.size))

    def test_a_padded_variable_splits_into_every_ranks_piece_and_gathers_back(self):
        # What a reduce-scatter of padded() gives rank r, and what an allgather of the pieces gives back.
        ranks = 3
        layouts = [ShardLayout(self.SHAPES, ranks, r) for r in range(ranks)]
        for i, value in enumerate(self.values()):
            padded = layouts[0].padded(i, tf.constant(value)).numpy()
            rows = padded.reshape(ranks, -1)
            for r, layout in enumerate(layouts):
                self.assertAllEqual(rows[r], layout.shard_of(i, tf.constant(value)))
            self.assertAllEqual(layouts[1].full_from_gathered(i, tf.constant(padded)), value)
