"""``broadcast_object`` and ``allgather_object``: move picklable Python objects between ranks."""

from __future__ import annotations

import pickle
from typing import Any, Optional

import numpy as np
import tensorflow as tf

from smdist_tf.collectives import allgather, broadcast
from smdist_tf.runtime import rank, size


def _to_bytes_tensor(obj: Any) -> tf.Tensor:
    return tf.constant(np.frombuffer(pickle.dumps(obj), dtype=np.uint8))


def broadcast_object(obj: Any, root_rank: int = 0, name: Optional[str] = None) -> Any:
    """Returns ``root_rank``'s ``obj`` on every rank (pickled, sent as bytes).

    Must be called eagerly, by every rank, in the same order. Other ranks may pass
    any value (for example ``None``); only the root's is pickled.

    Args:
        obj: a picklable object (read on ``root_rank`` only).
        root_rank: the rank whose object everyone receives.
        name: optional name to match this call across ranks.

    Returns:
        The root's object, unpickled (a copy, also on the root).
    """
    if not 0 <= root_rank < size():
        raise ValueError(f"root_rank {root_rank} is out of range for {size()} ranks")
    payload = _to_bytes_tensor(obj) if rank() == root_rank else tf.zeros([0], tf.uint8)
    # The length travels first so every rank can allocate the same buffer shape.
    length = broadcast(tf.shape(payload, out_type=tf.int64), root_rank, name=f"{name}.size" if name else None)
    buffer = payload if rank() == root_rank else tf.zeros(length, tf.uint8)
    data = broadcast(buffer, root_rank, name=f"{name}.data" if name else None)
    return pickle.loads(data.numpy().tobytes())


def allgather_object(obj: Any, name: Optional[str] = None) -> list:
    """Returns the list of every rank's ``obj``, in rank order.

    Must be called eagerly, by every rank, in the same order.

    Args:
        obj: a picklable object.
        name: optional name to match this call across ranks.

    Returns:
        ``[obj of rank 0, obj of rank 1, ...]``.
    """
    payload = _to_bytes_tensor(obj)
    sizes = allgather(tf.shape(payload, out_type=tf.int64), name=f"{name}.sizes" if name else None).numpy()
    data = allgather(payload, name=f"{name}.data" if name else None).numpy()
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    return [pickle.loads(data[offsets[i] : offsets[i + 1]].tobytes()) for i in range(len(sizes))]
