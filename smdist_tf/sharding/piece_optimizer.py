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
import numpy as np
import tensorflow as tf

from smdist_tf.sharding.optimizer import check_shardable
from smdist_tf.collectives import allgather
from smdist_tf.sharding.parameter import ShardedParameter, is_piece_view, owner_of_view


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
        chain: Optional[list] = None
        if trainable_variables is not None:
            _check_no_constraints(trainable_variables)
            # Last layer first: the order the backward pass delivers the pieces' gradients in (see update_step).
            grads, trainable_variables = list(grads)[::-1], pieces_of(trainable_variables)[::-1]
            chain = []
        self._smdist_pieces.last_update = chain
        try:
            return super().apply(grads, trainable_variables)
        finally:
            self._smdist_pieces.last_update = None

    def update_step(self, gradient: Any, variable: Any, learning_rate: Any) -> None:
        # One piece's update after another, in the backward pass's order: the optimizer's temporaries of one
        # piece are alive at a time, not those of every piece at once, and each piece's gradient is consumed
        # soon after it arrives. The next update waits for a read of this piece, which automatic control
        # dependencies order after this update's writes to it.
        last_update = self._smdist_pieces.last_update
        if last_update is None or not tf.inside_function():
            super().update_step(gradient, variable, learning_rate)
            return
        with tf.control_dependencies(last_update):
            super().update_step(gradient, variable, learning_rate)
            self._smdist_pieces.last_update = [tf.convert_to_tensor(variable)]

    def _all_reduce_sum_gradients(self, grads_and_vars: Any) -> list:
        return list(grads_and_vars)  # each piece's gradient arrives reduced

    # --- checkpoints: the slots are pieces, the file holds them whole -----------------------------
    def add_variable_from_reference(self, reference_variable: Any, name: Optional[str] = None,
                                    initializer: Any = "zeros") -> Any:
        slot = super().add_variable_from_reference(reference_variable, name=name, initializer=initializer)
        owner = owner_of_view(reference_variable)
        if owner is not None:
            self._smdist_pieces.owners[id(slot)] = owner
        return slot

    def smdist_gather_slots(self) -> None:
        """Gathers every piece-shaped slot in full for a save (a collective: every rank calls it, in order)."""
        owners = self._smdist_pieces.owners
        self._smdist_pieces.gathered = {
            id(slot): owners[id(slot)].layout.full_from_gathered(
                0, allgather(tf.convert_to_tensor(slot), process_set=owners[id(slot)].process_set)).numpy()
            for slot in self.variables if id(slot) in owners}

    def smdist_release_slots(self) -> None:
        self._smdist_pieces.gathered = None

    def save_own_variables(self, store: Any) -> None:
        owners, gathered = self._smdist_pieces.owners, self._smdist_pieces.gathered
        if owners and gathered is None:
            raise ValueError("this optimizer's state is sharded over the ranks (shard_parameters); save with "
                             "smdist_tf.distribute.save_on_rank_zero(model, path) called on every rank")
        for i, variable in enumerate(self.variables):
            store[str(i)] = gathered[id(variable)] if id(variable) in owners else variable.numpy()

    def load_own_variables(self, store: Any) -> None:
        owners = self._smdist_pieces.owners
        if len(store.keys()) != len(self.variables):
            raise ValueError(f"the checkpoint holds {len(store.keys())} variables for optimizer '{self.name}', "
                             f"which has {len(self.variables)}: it was saved from another optimizer or model")
        for i, variable in enumerate(self.variables):
            value = np.asarray(store[str(i)])
            owner = owners.get(id(variable))
            expected = tuple(variable.shape) if owner is None else tuple(owner.shape)
            if value.shape != expected:
                raise ValueError(f"optimizer variable {i} ({variable.name}) has shape {value.shape} in the "
                                 f"checkpoint, expected {expected}")
            variable.assign(value if owner is None else owner.layout.shard_of_array(0, value))


class _PieceSlots:
    """Which slots are pieces, and their gathered values while a save runs (a plain object: Keras tracks none of it)."""

    def __init__(self) -> None:
        self.owners: dict[int, ShardedParameter] = {}  # id(slot) -> the parameter whose piece it is shaped like
        self.gathered: Optional[dict[int, np.ndarray]] = None
        # While apply() runs with its variables given: what the next piece's update waits for.
        self.last_update: Optional[list] = None


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
    optimizer._smdist_pieces = _PieceSlots()
    return optimizer
