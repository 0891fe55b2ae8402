"""Collectives with the signatures of Horovod's Keras module, and ``broadcast_global_variables``.

Horovod's Keras functions take any tensor-compatible value (a number, a list, a NumPy
array, a tensor or a variable) and return the result rather than an op to run. Each
works eagerly and inside ``tf.function``; ``name`` is the name ranks match the
collective by (see ``smdist_tf.allreduce``).
"""

from __future__ import annotations

from typing import Any, Optional, Sequence, Union

import keras
import tensorflow as tf

from smdist_tf import collectives
from smdist_tf.compression import Compression, Compressor
from smdist_tf.process_sets import ProcessSet
from smdist_tf.reduce_ops import Average
from smdist_tf.sharding.optimizer import unsharded_variables


def allreduce(
    value: Any,
    name: Optional[str] = None,
    average: Optional[bool] = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    op: Optional[int] = None,
    compression: type[Compressor] = Compression.none,
    process_set: Optional[ProcessSet] = None,
) -> tf.Tensor:
    """Reduces ``value`` over all ranks; every rank receives the result.

    Args:
        value: a tensor-compatible value with the same shape and dtype on every rank.
        name: name used to match this collective across ranks.
        average: deprecated; ``True`` means ``op=Average``, ``False`` means ``op=Sum``.
        prescale_factor: multiplies the input before the reduction.
        postscale_factor: multiplies the result after the reduction (and averaging).
        op: ``Average`` (when ``None``), ``Sum``, ``Adasum``, ``Min``, ``Max`` or ``Product``.
        compression: ``Compression.none``, ``.fp16``, ``.bf16`` or ``.int8``.
        process_set: reduce over this ``ProcessSet`` only (``None``: all ranks).

    Returns:
        The reduced tensor (``.numpy()`` gives an array), same shape and dtype as ``value``.
    """
    return collectives.allreduce(value, average=average, compression=compression, op=op,
                                 prescale_factor=prescale_factor, postscale_factor=postscale_factor, name=name,
                                 process_set=process_set)


def grouped_allreduce(
    values: Sequence[Any],
    name: Optional[str] = None,
    average: Optional[bool] = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    op: Optional[int] = None,
    compression: type[Compressor] = Compression.none,
    process_set: Optional[ProcessSet] = None,
) -> list[tf.Tensor]:
    """Reduces a list of values as one fused request; arguments as for :func:`allreduce`.

    Returns:
        The reduced tensors, in the order of ``values``.
    """
    return collectives.grouped_allreduce(values, average=average, compression=compression, op=op,
                                         prescale_factor=prescale_factor, postscale_factor=postscale_factor,
                                         name=name, process_set=process_set)


def allgather(value: Any, name: Optional[str] = None, process_set: Optional[ProcessSet] = None) -> tf.Tensor:
    """Concatenates every rank's ``value`` along dimension 0, in rank order.

    Dimension 0 may differ between ranks; the others must match. A scalar counts as a
    vector of one element.
    """
    return collectives.allgather(value, name=name, process_set=process_set)


def broadcast(value: Any, root_rank: int, name: Optional[str] = None,
              process_set: Optional[ProcessSet] = None) -> tf.Tensor:
    """Returns ``root_rank``'s ``value`` on every rank (same shape and dtype everywhere)."""
    return collectives.broadcast(value, root_rank, name=name, process_set=process_set)


def reducescatter(value: Any, name: Optional[str] = None, op: int = Average,
                  process_set: Optional[ProcessSet] = None) -> tf.Tensor:
    """Reduces ``value`` over all ranks and returns this rank's block of dimension 0.

    With ``d`` rows and ``n`` ranks, rank ``r`` gets ``d // n`` rows, plus one if ``r < d % n``.
    """
    return collectives.reducescatter(value, op=op, name=name, process_set=process_set)


def alltoall(value: Any, splits: Optional[Any] = None, name: Optional[str] = None,
             process_set: Optional[ProcessSet] = None) -> Union[tf.Tensor, tuple[tf.Tensor, tf.Tensor]]:
    """Sends ``splits[r]`` rows of ``value`` (in order) to rank ``r`` and receives theirs.

    Without ``splits``, dimension 0 is divided equally over the ranks.

    Returns:
        The received rows in rank order; with ``splits`` given, ``(received, received_splits)``.
    """
    return collectives.alltoall(value, splits=splits, name=name, process_set=process_set)


def broadcast_global_variables(root_rank: int, model: Optional[keras.Model] = None) -> Any:
    """Gives every rank ``root_rank``'s model and optimizer state.

    Horovod broadcasts TensorFlow's global variable collection, which Keras 3 (and
    TensorFlow 2 eager code) does not have; Horovod itself raises there. This takes the
    model instead and broadcasts ``model.variables`` and, once compiled,
    ``model.optimizer.variables``, in place. Optimizer slots that do not exist yet are
    created later with the same initial values on every rank. Every rank must call it
    with the same model structure. ``callbacks.BroadcastGlobalVariablesCallback`` does
    the same inside ``fit``.

    Args:
        root_rank: the rank whose values everyone takes.
        model: a built Keras model.

    Returns:
        ``None`` eagerly; the grouped assign op inside ``tf.function``.

    Raises:
        ValueError: when no model is given, or it is not built.
    """
    if model is None:
        raise ValueError(
            "Keras 3 has no global variables: pass the model, broadcast_global_variables(root_rank, model), "
            "or use callbacks.BroadcastGlobalVariablesCallback(root_rank) in fit()")
    if not model.built:
        raise ValueError("broadcast_global_variables: the model is not built yet (call it on data or build() it)")
    variables = list(model.variables)
    if getattr(model, "optimizer", None) is not None:
        variables += unsharded_variables(model.optimizer)
    return collectives.broadcast_variables(variables, root_rank)
