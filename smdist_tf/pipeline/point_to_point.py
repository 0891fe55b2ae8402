"""Point-to-point ``send``/``recv`` between two ranks (the engine's ``SmdistSend``/``SmdistRecv`` ops)."""

from __future__ import annotations

from typing import Optional, Sequence

import tensorflow as tf

from smdist_tf._native import op_module


def send(tensors: Sequence[tf.Tensor], peer: int, tag: int = 0) -> Optional[tf.Operation]:
    """Sends ``tensors`` to rank ``peer`` as one message.

    Returns once the message is queued: it never waits for the receiver, so two
    neighbours may both send before they receive. Messages with the same peer and
    tag arrive in the order they were sent. Dtypes and shapes travel with the
    first message and again whenever they change.

    Args:
        tensors: the tensors of the message (at least one).
        peer: the receiving rank.
        tag: non-negative message tag; the receiver names the same tag.

    Returns:
        Inside a ``tf.function``, the send operation (for control dependencies); eagerly, ``None``.
    """
    tensors = [tf.convert_to_tensor(t) for t in tensors]
    if not tensors:
        raise ValueError("send needs at least one tensor")
    return op_module.smdist_send(tensors, peer=int(peer), tag=int(tag))


def recv(dtypes: Sequence[tf.DType], peer: int, tag: int = 0,
         shapes: Optional[Sequence[tf.TensorShape]] = None) -> list:
    """Receives the next message ``peer`` sent with ``tag``.

    Args:
        dtypes: the dtype of every tensor of the message (checked on arrival).
        peer: the sending rank.
        tag: the tag the sender used.
        shapes: optional static shapes (``None`` dimensions allowed) for graph shape
            inference; a received tensor that does not fit raises ``InvalidArgumentError``.

    Returns:
        The received tensors, as a list.
    """
    if not dtypes:
        raise ValueError("recv needs at least one dtype")
    hints = [tf.TensorShape(s) for s in shapes] if shapes is not None else []
    return list(op_module.smdist_recv(T=list(dtypes), peer=int(peer), tag=int(tag), shapes=hints))
