"""``broadcast_object`` and ``allgather_object``: move picklable Python objects between ranks.

Each call is two collectives that every rank joins whatever happens: a header
``[status, byte count]``, then the bytes. A rank that cannot pickle its object
sends ``_UNPICKLABLE`` and a description of the failure instead of the pickle, so
every rank learns of it and raises, rather than the others waiting for bytes that
never come.
"""

from __future__ import annotations

import pickle
from typing import Any, Callable, Optional

import numpy as np
import tensorflow as tf

from smdist_tf import _compat, process_sets as _process_sets
from smdist_tf.collectives import allgather, broadcast
from smdist_tf.process_sets import ProcessSet
from smdist_tf.runtime import rank

_PICKLED, _UNPICKLABLE = 0, 1


def _type_name(obj: Any) -> str:
    cls = type(obj)
    return cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"


def _pickle(obj: Any) -> tuple[int, bytes, Optional[Exception]]:
    """``(status, payload, error)``: the pickle, or a description of why ``obj`` has none."""
    try:
        return _PICKLED, pickle.dumps(obj), None
    except Exception as error:  # whatever pickling raises, the other ranks must hear of it
        return _UNPICKLABLE, f"{_type_name(obj)}: {type(error).__name__}: {error}".encode(errors="backslashreplace"), error


def _bytes_tensor(data: bytes) -> tf.Tensor:
    return tf.constant(np.frombuffer(data, dtype=np.uint8))


def broadcast_object(obj: Any, root_rank: int = 0, name: Optional[str] = None,
                     process_set: Optional[ProcessSet] = None) -> Any:
    """Returns ``root_rank``'s ``obj`` on every rank (pickled, sent as bytes).

    Must be called by every rank (of ``process_set``), in the same order. Other ranks
    may pass any value (for example ``None``); only the root's is pickled. Called while
    ``tf.function`` traces or a ``tf.compat.v1`` graph is built, the exchange happens
    then, eagerly.

    Args:
        obj: a picklable object (read on ``root_rank`` only).
        root_rank: the rank whose object everyone receives (a job rank, a member of
            ``process_set``).
        name: optional name to match this call across ranks.
        process_set: the ``ProcessSet`` to broadcast among (``None``: all ranks).

    Returns:
        The root's object, unpickled (a copy, also on the root).

    Raises:
        ValueError: ``root_rank`` is not a rank of the set.
        pickle.PicklingError: on every rank, when the root cannot pickle ``obj``; the
            message names the root and the object's type, and on the root the
            original error is the cause.
    """
    _, ranks, _ = _process_sets.membership(process_set)
    if root_rank not in ranks:
        where = f"{len(ranks)} ranks" if process_set is None else f"process set {ranks}"
        raise ValueError(f"root_rank {root_rank} is out of range for {where}")
    with _compat.eager_scope():  # a Python value: exchanged eagerly, also while a graph is being built
        return _broadcast_object(obj, root_rank, name, process_set)


def _broadcast_object(obj: Any, root_rank: int, name: Optional[str], process_set: Optional[ProcessSet]) -> Any:
    is_root = rank() == root_rank
    status, payload, error = _pickle(obj) if is_root else (_PICKLED, b"", None)
    # The header travels first so every rank knows the outcome and allocates the same buffer shape.
    header = broadcast(tf.constant([status, len(payload)], tf.int64), root_rank,
                       name=f"{name}.size" if name else None, process_set=process_set)
    status, length = header.numpy().tolist()
    buffer = _bytes_tensor(payload) if is_root else tf.zeros([length], tf.uint8)
    data = broadcast(buffer, root_rank, name=f"{name}.data" if name else None,
                     process_set=process_set).numpy().tobytes()
    if status == _UNPICKLABLE:
        raise pickle.PicklingError(f"broadcast_object: root rank {root_rank} could not pickle its {data.decode(errors='replace')}") from error
    return pickle.loads(data)


def broadcast_object_fn(root_rank: int = 0, name: Optional[str] = None,
                        process_set: Optional[ProcessSet] = None) -> Callable[[Any], Any]:
    """Horovod's ``broadcast_object_fn``: a function that broadcasts its argument from ``root_rank``.

    Args:
        root_rank: the rank whose object everyone receives.
        name: optional name to match the calls across ranks.
        process_set: the ``ProcessSet`` to broadcast among (``None``: all ranks).

    Returns:
        ``fn(obj)``, equivalent to ``broadcast_object(obj, root_rank, name, process_set)``.
    """
    return lambda obj: broadcast_object(obj, root_rank, name, process_set)


def allgather_object(obj: Any, name: Optional[str] = None, process_set: Optional[ProcessSet] = None) -> list:
    """Returns the list of every rank's ``obj`` (of ``process_set``), in rank order.

    Must be called by every rank (of ``process_set``), in the same order. Called while
    ``tf.function`` traces or a ``tf.compat.v1`` graph is built, the exchange happens
    then, eagerly.

    Args:
        obj: a picklable object.
        name: optional name to match this call across ranks.
        process_set: the ``ProcessSet`` to gather from (``None``: all ranks).

    Returns:
        ``[obj of rank 0, obj of rank 1, ...]`` (the set's members, in rank order).

    Raises:
        pickle.PicklingError: on every rank, when any rank cannot pickle its ``obj``;
            the message names each such rank and its object's type, and on those
            ranks the original error is the cause.
    """
    with _compat.eager_scope():  # a Python value: exchanged eagerly, also while a graph is being built
        return _allgather_object(obj, name, process_set)


def _allgather_object(obj: Any, name: Optional[str], process_set: Optional[ProcessSet]) -> list:
    status, payload, error = _pickle(obj)
    headers = allgather(tf.constant([[status, len(payload)]], tf.int64), name=f"{name}.sizes" if name else None,
                        process_set=process_set).numpy()
    data = allgather(_bytes_tensor(payload), name=f"{name}.data" if name else None, process_set=process_set).numpy()
    offsets = np.concatenate([[0], np.cumsum(headers[:, 1])])
    payloads = [data[offsets[r] : offsets[r + 1]].tobytes() for r in range(len(headers))]
    ranks = _process_sets.membership(process_set)[1]
    failures = [f"rank {ranks[r]}: {payloads[r].decode(errors='replace')}" for r in range(len(headers))
                if headers[r, 0] == _UNPICKLABLE]
    if failures:
        raise pickle.PicklingError(f"allgather_object: could not pickle the object of {'; '.join(failures)}") from error
    return [pickle.loads(p) for p in payloads]
