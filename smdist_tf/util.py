"""Helpers under the names Horovod's ``horovod.tensorflow.util`` gives them (scripts and tests import them)."""

from __future__ import annotations

import tensorflow as tf


def _executing_eagerly() -> bool:
    """Whether TensorFlow executes eagerly here (Horovod's ``util._executing_eagerly``)."""
    return tf.executing_eagerly()
