"""``PieceApply``: a Keras optimizer that updates this rank's pieces of sharded parameters (ZeRO stage 3).

Under ``DataParallelStrategy(shard_parameters=True)`` each weight's backing store is a
``ShardedParameter`` and its gradient arrives as this rank's piece of the reduced
gradient (the reduce-scatter is the gather's gradient). Keras' optimizer takes slot
shapes from, and assigns updates to, the variables it is given, so ``build`` and
``apply`` give it, in place of each weight, a piece-shaped Keras variable that *is* the
piece. Keras' own update then runs unchanged on pieces: slots and
gradient-accumulation buffers are per piece (stages 1 and 2 with no code of their own),
learning-rate schedules, weight decay, EMA and the iteration count work as ever.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import keras

from smdist_tf.sharding.optimizer import check_shardable
from smdist_tf.sharding.parameter import ShardedParameter, is_piece_view


def sharded_parameter(variable: Any) -> Optional[ShardedParameter]:
    """The ``ShardedParameter`` behind a Keras variable, or ``None``."""
    # Keras' Variable keeps what tf.Variable(...) returned in _value (listed in _compat.py).
    store = variable._value if isinstance(variable, keras.Variable) else None
    return store if isinstance(store, ShardedParameter) else None


def pieces_of(variables: Sequence[Any]) -> list:
    """Each sharded weight's piece-shaped Keras variable (a piece view stays itself: ``apply`` builds with them).

    Raises:
        ValueError: a variable is not sharded (it was made outside the strategy's scope).
    """
    pieces = []
    for variable in variables:
        if is_piece_view(variable):
            pieces.append(variable)
            continue
        parameter = sharded_parameter(variable)
        if parameter is None:
            raise ValueError(f"shard_parameters: {getattr(variable, 'path', variable)} is not sharded; create the "
                             "model (every trainable weight) inside the DataParallelStrategy's scope")
        pieces.append(parameter.piece_view(keras, variable.name))
    return pieces


class PieceApply:
    """Mixin in front of an element-wise Keras optimizer: updates pieces of sharded parameters only."""

    def build(self, variables: Sequence[Any]) -> None:
        super().build(pieces_of(variables))

    def apply(self, grads: Sequence[Any], trainable_variables: Optional[Sequence[Any]] = None) -> Any:
        if trainable_variables is not None:
            _check_no_constraints(trainable_variables)
            trainable_variables = pieces_of(trainable_variables)
        return super().apply(grads, trainable_variables)

    def _all_reduce_sum_gradients(self, grads_and_vars: Any) -> list:
        return list(grads_and_vars)  # each piece's gradient arrives reduced


def _check_no_constraints(variables: Sequence[Any]) -> None:
    for variable in variables:
        if variable.constraint is not None:
            raise ValueError(f"shard_parameters: {variable.path} has a constraint, which needs the whole weight; "
                             "constraints are not supported with parameter sharding")


_classes: dict[type, type] = {}


def piece_class(base: type) -> type:
    """``base`` with ``PieceApply`` in front, under the same name and module (made once per class)."""
    if base not in _classes:
        _classes[base] = type(base.__name__, (PieceApply, base), {"__module__": base.__module__})
    return _classes[base]


def update_pieces_in_place(optimizer: keras.optimizers.Optimizer) -> keras.optimizers.Optimizer:
    """Makes an unbuilt element-wise Keras optimizer update pieces of sharded parameters.

    Raises:
        ValueError: the optimizer is not element-wise, is built already, or clips
            gradients (Keras clips each rank's local gradient, which stage 3 never holds whole).
    """
    if isinstance(optimizer, PieceApply):
        return optimizer
    check_shardable(optimizer)
    if optimizer.clipnorm or optimizer.global_clipnorm or optimizer.clipvalue:
        raise ValueError("shard_parameters: gradient clipping (clipnorm, global_clipnorm, clipvalue) is not "
                         "supported: each rank holds a piece of the reduced gradient only")
    optimizer.__class__ = piece_class(type(optimizer))
    return optimizer
