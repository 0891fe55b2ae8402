"""Gradient buckets: fused requests issued in the order backpropagation produces the gradients.

Inside a ``tf.function`` every bucket is a grouped allreduce of its own, which TensorFlow
starts as soon as that bucket's gradients exist, while the rest of the backward pass still
runs: communication overlaps computation. Backpropagation produces gradients from the
last layer to the first, so buckets fill from the last source backwards. One request for
all gradients would wait for the first layer's, the last one computed.

A bucket holds at most ``bucket_cap_bytes()``: ``SMDIST_BUCKET_CAP_MB`` (the
``bucket_cap_mb`` of SageMaker's data-parallel library), never more than the engine's
fusion threshold, since the engine fuses what it gets in one cycle up to that anyway.
Eager code keeps one request: an eager op returns only when its collective is done, so
there is nothing to overlap and every extra request costs a round trip.
"""

from __future__ import annotations

import os
from typing import Any, Optional

import tensorflow as tf

from smdist_tf.bucket_setting import BUCKET_CAP_VARIABLE, bucket_cap_megabytes  # noqa: F401 - re-exported
from smdist_tf.runtime import engine_config

_MIB = 1 << 20


def bucket_cap_bytes(bytes_per_pack: int = 0) -> int:
    """The most bytes one bucket holds.

    Args:
        bytes_per_pack: a caller's own cap (``tf.distribute``'s
            ``CommunicationOptions.bytes_per_pack``); 0 takes ``SMDIST_BUCKET_CAP_MB``.

    Raises:
        ValueError: ``SMDIST_BUCKET_CAP_MB`` is not a positive number.
    """
    cap = bytes_per_pack
    if cap <= 0:
        cap = int(bucket_cap_megabytes(os.environ) * _MIB)
    return max(1, min(cap, int(engine_config()["fusion_threshold_bytes"]) or cap))


def _nbytes(value: Any) -> Optional[int]:
    """Bytes of a gradient as traced (an ``IndexedSlices``' values), or None when its shape is unknown."""
    tensor = value.values if isinstance(value, tf.IndexedSlices) else value
    elements = tensor.shape.num_elements()
    return None if elements is None else elements * tensor.dtype.size


def gradient_buckets(values: list, positions: list[int], bytes_per_pack: int = 0) -> list[list[int]]:
    """The requests ``positions`` (indices into ``values``, in source order) travel in.

    Eagerly, one request; the bucket size is not even read, as this runs every step.
    Inside a ``tf.function``, :func:`ready_order_buckets` with :func:`bucket_cap_bytes`.
    """
    if not positions:
        return []
    if tf.executing_eagerly():
        return [list(positions)]
    return ready_order_buckets(values, positions, bucket_cap_bytes(bytes_per_pack))


def ready_order_buckets(values: list, positions: list[int], cap: int) -> list[list[int]]:
    """Splits ``positions`` (indices into ``values``, in source order) into buckets, last sources first.

    Consecutive positions go together, walking backwards, until the next would push a
    bucket past ``cap`` bytes; a gradient larger than ``cap``, or of unknown size, gets a
    bucket of its own. Each bucket lists its positions in ascending order.
    """
    if not positions:
        return []
    buckets: list[list[int]] = []
    current: list[int] = []
    filled = 0
    for position in reversed(positions):
        size = _nbytes(values[position])
        size = cap if size is None else size
        if current and filled + size > cap:
            buckets.append(sorted(current))
            current, filled = [], 0
        current.append(position)
        filled += size
    buckets.append(sorted(current))
    return buckets
