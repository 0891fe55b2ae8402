"""How gradients are split into buckets (smdist_tf.buckets): single process, no communication."""

from __future__ import annotations

import os
from unittest import mock

import tensorflow as tf

import smdist_tf as sd
from smdist_tf.buckets import BUCKET_CAP_VARIABLE, bucket_cap_bytes, gradient_buckets, ready_order_buckets

KIB = 1024


class ReadyOrderBucketsTest(tf.test.TestCase):
    def test_buckets_fill_from_the_last_source_backwards_up_to_the_cap(self):
        @tf.function
        def traced():
            values = [tf.zeros([KIB]), tf.zeros([KIB]), tf.zeros([KIB]), tf.zeros([2 * KIB]), tf.zeros([KIB // 2])]
            # float32: 4, 4, 4, 8 and 2 KiB.
            self.assertEqual(ready_order_buckets(values, [0, 1, 2, 3, 4], 8 * KIB), [[4], [3], [1, 2], [0]])
            self.assertEqual(ready_order_buckets(values, [0, 2, 4], 8 * KIB), [[2, 4], [0]])
            self.assertEqual(ready_order_buckets(values, [0, 1, 2, 3, 4], 1), [[4], [3], [2], [1], [0]])
            self.assertEqual(ready_order_buckets(values, [0, 1, 2, 3, 4], 1 << 30), [[0, 1, 2, 3, 4]])
            self.assertEqual(ready_order_buckets(values, [], 8 * KIB), [])
            return tf.constant(0)

        traced()

    def test_sparse_and_unknown_shapes(self):
        @tf.function(input_signature=[tf.TensorSpec([None], tf.float32)])
        def traced(unknown):
            sparse = tf.IndexedSlices(tf.zeros([2, KIB // 4]), tf.constant([0, 3]), tf.constant([8, KIB // 4]))
            values = [tf.zeros([KIB // 4]), sparse, unknown, tf.zeros([KIB // 4])]
            # 1 KiB, 2 KiB of values, unknown (a bucket of its own), 1 KiB.
            self.assertEqual(ready_order_buckets(values, [0, 1, 2, 3], 3 * KIB), [[3], [2], [0, 1]])
            return unknown

        traced(tf.zeros([3]))

    def test_eager_code_keeps_one_request(self):
        values = [tf.zeros([KIB]) for _ in range(4)]
        self.assertEqual(gradient_buckets(values, [0, 1, 2, 3], bytes_per_pack=1), [[0, 1, 2, 3]])


class BucketCapTest(tf.test.TestCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        sd.init()

    def test_variable_options_and_the_fusion_threshold(self):
        fusion = sd.engine_config()["fusion_threshold_bytes"]
        with mock.patch.dict(os.environ, {BUCKET_CAP_VARIABLE: "0.5"}):
            self.assertEqual(bucket_cap_bytes(), 512 * KIB)
            self.assertEqual(bucket_cap_bytes(bytes_per_pack=3000), 3000)
        with mock.patch.dict(os.environ, {BUCKET_CAP_VARIABLE: str(2 * fusion)}):
            self.assertEqual(bucket_cap_bytes(), fusion)  # never above what the engine fuses
        os.environ.pop(BUCKET_CAP_VARIABLE, None)
        self.assertGreater(bucket_cap_bytes(), 0)
        for bad in ("0", "-1", "lots"):
            with mock.patch.dict(os.environ, {BUCKET_CAP_VARIABLE: bad}):
                with self.assertRaisesRegex(ValueError, BUCKET_CAP_VARIABLE):
                    bucket_cap_bytes()
