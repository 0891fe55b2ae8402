"""``DistributedOptimizer``: Horovod-style gradient averaging in a Keras optimizer, without a Strategy.

Keras 3 optimizers reduce in ``apply`` (below); Keras 2 (``tf_keras``) ones where Keras 2
aggregates gradients (smdist_tf/keras/tf_keras_optimizer.py).
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import keras
import tensorflow as tf

from smdist_tf.compression import Compression, Compressor
from smdist_tf.gradient_reducer import GradientReducer
from smdist_tf.keras.gradient_reduction import GradientReduction, distributed_class
from smdist_tf.keras.patches import install_keras_patches
from smdist_tf.keras_api import is_tf_keras_class, is_tf_keras_object, uses_tf_keras
from smdist_tf.process_sets import ProcessSet
from smdist_tf.reduce_ops import Average
from smdist_tf.sharding.optimizer import ShardingSettings, shard_in_place
from smdist_tf.strategy_kind import OneReplicaPerRank


class _DistributedApply(GradientReduction):
    """Keras 3: ``apply``, which every update path goes through, reduces the gradients first."""

    def build(self, variables: Sequence[Any]) -> None:
        super().build(variables)
        if self._smdist_backward_passes_per_step > 1:
            self._smdist_accumulators = [
                self.add_variable_from_reference(v, name="smdist_accumulated_grad") for v in variables
            ]
            self._smdist_passes = self.add_variable((), initializer="zeros", dtype="int64", name="smdist_passes")

    def _compute_gradients(self, loss: Any, var_list: Any, grad_loss: Any = None,
                           tape: Optional[tf.GradientTape] = None) -> list[tuple[Any, Any]]:
        """Horovod's Keras ``_compute_gradients``: ``(gradient, variable)`` pairs, the gradients reduced.

        Args:
            loss: a callable returning the loss (recorded on ``tape``, or a new one), or a loss tensor
                recorded on ``tape``.
            var_list: the variables (or a callable returning them).
            grad_loss: the loss's own gradient, if not ones.
            tape: the ``tf.GradientTape`` that recorded ``loss``; needed for a loss tensor.

        ``apply_gradients`` of these pairs does not reduce them again. With
        ``backward_passes_per_step > 1`` the gradients come back as this rank's: ``apply_gradients``
        accumulates them and reduces every ``backward_passes_per_step``-th call, as always.
        """
        variables = list(var_list() if callable(var_list) else var_list)
        if tape is None:
            if not callable(loss):
                raise ValueError("_compute_gradients: a loss tensor needs the `tape` that recorded it "
                                 "(or pass the loss as a callable)")
            tape = tf.GradientTape()
        if callable(loss):
            with tape:  # trainable variables are watched by themselves
                loss = loss()
        grads = list(tape.gradient(loss, variables, grad_loss))
        if self._smdist_backward_passes_per_step == 1:
            grads = self._smdist_reduced(grads, variables)
            # Alive in the pairs until apply() takes them, so their ids stay theirs.
            self._smdist_reduced_ids = {id(g) for g in grads if g is not None}
        return list(zip(grads, variables))

    def apply(self, grads: Sequence[Any], trainable_variables: Optional[Sequence[Any]] = None) -> None:
        grads = list(grads)
        if trainable_variables is None:
            trainable_variables = self._trainable_variables
        trainable_variables = list(trainable_variables)
        passes = self._smdist_backward_passes_per_step
        reduced_ids, self._smdist_reduced_ids = getattr(self, "_smdist_reduced_ids", set()), set()
        if reduced_ids and all(id(g) in reduced_ids for g in grads if g is not None):
            return super().apply(grads, trainable_variables)  # from _compute_gradients: reduced already
        if passes == 1:
            reduced = self._smdist_reduced(grads, trainable_variables)
            return super().apply(reduced, trainable_variables)
        if not self.built:
            self.build(trainable_variables)
            self.built = True
        return self._smdist_accumulate_and_apply(grads, trainable_variables, passes)

    def _smdist_accumulate_and_apply(self, grads: list, variables: list, passes: int) -> None:
        accumulators = [self._smdist_accumulators[self._get_variable_index(v)] for v in variables]
        for acc, g in zip(accumulators, grads):
            if g is not None:
                acc.assign_add(tf.convert_to_tensor(g))
        self._smdist_passes.assign_add(1)
        divide = self._smdist_average_aggregated_gradients

        def reduce_and_apply():
            # Same iteration count on every rank, so every rank takes this branch together.
            local = [None if g is None else (acc / passes if divide else acc + 0) for acc, g in zip(accumulators, grads)]
            reduced = self._smdist_reduced([None if x is None else tf.convert_to_tensor(x) for x in local], variables)
            super(_DistributedApply, self).apply(reduced, variables)
            for acc in accumulators:
                acc.assign(tf.zeros_like(acc))
            return tf.constant(True)

        tf.cond(tf.equal(self._smdist_passes % passes, 0), reduce_and_apply, lambda: tf.constant(False))


def DistributedOptimizer(
    optimizer: keras.optimizers.Optimizer,
    name: Optional[str] = None,
    device_dense: str = "",
    device_sparse: str = "",
    compression: type[Compressor] = Compression.none,
    sparse_as_dense: bool = False,
    gradient_predivide_factor: float = 1.0,
    op: int = Average,
    backward_passes_per_step: int = 1,
    average_aggregated_gradients: bool = False,
    num_groups: int = 0,
    groups: Optional[Sequence[Sequence[Any]]] = None,
    process_set: Optional[ProcessSet] = None,
    scale_local_gradients: bool = True,
    shard_optimizer_state: bool = False,
    shard_gradients: bool = False,
) -> keras.optimizers.Optimizer:
    """Returns a copy of a Keras ``optimizer`` that averages gradients over all ranks before applying them.

    The result is an instance of a subclass of ``optimizer``'s class with the same class
    name, so ``get_config()``/``from_config()`` round-trip and saved models load
    without smdist_tf. Every update path (``model.fit``, ``apply_gradients``,
    ``apply``, a surrounding ``LossScaleOptimizer``) reduces in ``apply``. Use it
    without a ``tf.distribute`` strategy (a ``DataParallelStrategy`` already reduces).
    ``model.fit`` with it copes with ranks holding different numbers of batches: a rank
    whose epoch is over joins (``smdist_tf.join()``) and the weights are re-synced (see
    ``smdist_tf.keras.uneven_data``).

    Keras 2 (``tf_keras``, with ``TF_USE_LEGACY_KERAS=1``): its optimizers and
    ``tf_keras.optimizers.legacy`` ones reduce where Keras 2 aggregates gradients, before
    clipping and before a surrounding ``LossScaleOptimizer`` checks them for inf/NaN
    (see docs/tf-keras.md); sharding and ``backward_passes_per_step`` need Keras 3.

    Args:
        optimizer: the Keras optimizer to wrap, of the Keras ``tf.keras`` is (its config is copied; a fresh,
            unbuilt one is returned).
        name: optional new name for the optimizer.
        device_dense: accepted for Horovod compatibility.
        device_sparse: accepted for Horovod compatibility.
        compression: ``Compression.none``, ``.fp16``, ``.bf16`` or ``.int8``.
        sparse_as_dense: densify ``tf.IndexedSlices`` gradients before reducing.
        gradient_predivide_factor: with ``Average``, divide before the sum and after by ``size()/factor``.
        op: ``Average``, ``Sum`` or ``Adasum`` (not with ``shard_optimizer_state``/``shard_gradients``).
        backward_passes_per_step: accumulate this many local gradients before one reduction and update.
        average_aggregated_gradients: divide the accumulated gradients by ``backward_passes_per_step``.
        num_groups: split the gradients into this many fused requests (0: one).
        groups: explicit grouping of variables into fused requests.
        process_set: the ``ProcessSet`` to average over (``None``: all ranks). Only its
            members may train with the optimizer; ``fit`` then needs equal batch counts
            on them (the uneven-data join spans all ranks).
        scale_local_gradients: divide the gradients of variables passed to the result's
            ``register_local_var`` (which are not reduced) by ``size()``, as Horovod does.
        shard_optimizer_state: ZeRO stage 1: keep the optimizer's slots for this rank's
            1/N of each variable; gradients are reduce-scattered, updated weights
            allgathered (see docs/sharding.md). Needs an element-wise optimizer,
            ``Compression.none`` and ``backward_passes_per_step=1`` (use the optimizer's
            own ``gradient_accumulation_steps``); save with
            ``smdist_tf.distribute.save_on_rank_zero`` on every rank.
        shard_gradients: ZeRO stage 2 (implies stage 1): gradient-accumulation buffers
            are sharded too.

    Returns:
        The distributed optimizer.

    Raises:
        TypeError: ``optimizer`` is not a Keras optimizer, or is a Keras 2 ``LossScaleOptimizer``
            (wrap the optimizer inside it instead).
        ValueError: a bad argument, a ``tf.distribute`` strategy scope is active, or
            ``optimizer`` is of the other Keras than ``tf.keras``.
    """
    keras_2 = _check_optimizer(optimizer)
    if backward_passes_per_step < 1:
        raise ValueError("backward_passes_per_step must be >= 1")
    if tf.distribute.has_strategy() and _reduces_across_processes(tf.distribute.get_strategy()):
        raise ValueError("DistributedOptimizer reduces by itself; do not use it inside a tf.distribute strategy scope")
    # Made first, so a bad op / predivide / process set fails the same way, on every rank alike.
    reducer = GradientReducer(
        compression=compression, sparse_as_dense=sparse_as_dense, op=op,
        gradient_predivide_factor=gradient_predivide_factor, num_groups=num_groups, groups=groups,
        process_set=process_set, scale_local_gradients=scale_local_gradients,
    )
    if keras_2 and (shard_optimizer_state or shard_gradients):
        raise ValueError("shard_optimizer_state and shard_gradients need Keras 3; they are not supported with "
                         "tf_keras (Keras 2) optimizers")
    if keras_2 and backward_passes_per_step != 1:
        raise ValueError("backward_passes_per_step > 1 is not supported with tf_keras (Keras 2) optimizers; "
                         "accumulate gradients in your own loop, or use Keras 3")
    install_keras_patches()
    config = optimizer.get_config()
    if name is not None:
        config["name"] = name
    if shard_optimizer_state or shard_gradients:
        if backward_passes_per_step != 1:
            raise ValueError("shard_optimizer_state accumulates with the optimizer's own gradient_accumulation_steps; "
                             "leave backward_passes_per_step at 1")
        settings = ShardingSettings.of(reducer, shard_gradients=shard_gradients)
        return shard_in_place(type(optimizer).from_config(config), settings)
    cls = distributed_optimizer_class(type(optimizer), reducer, backward_passes_per_step, average_aggregated_gradients)
    return cls.from_config(config)


def distributed_optimizer_class(base: type, reducer: GradientReducer, backward_passes_per_step: int = 1,
                                average_aggregated_gradients: bool = False) -> type:
    """The distributed subclass of the optimizer class ``base`` (Keras 3 or Keras 2), reducing with ``reducer``."""
    if is_tf_keras_class(base):
        from smdist_tf.keras.tf_keras_optimizer import DistributedAggregation

        return distributed_class(DistributedAggregation, base, reducer)
    return distributed_class(_DistributedApply, base, reducer, backward_passes_per_step, average_aggregated_gradients)


def _reduces_across_processes(strategy: tf.distribute.Strategy) -> bool:
    """True for a strategy that reduces gradients itself: several replicas, or ours at any size (one process
    included, so the mistake shows on a laptop before it meets a cluster)."""
    return strategy.num_replicas_in_sync > 1 or isinstance(strategy, OneReplicaPerRank)


def _check_optimizer(optimizer: Any) -> bool:
    """Checks that ``optimizer`` is one of the Keras ``tf.keras`` is; returns True for Keras 2."""
    keras_2 = is_tf_keras_object(optimizer)
    if not keras_2 and not isinstance(optimizer, keras.optimizers.Optimizer):
        raise TypeError(f"DistributedOptimizer takes a Keras optimizer, got {type(optimizer).__name__} "
                        "(tf.compat.v1.train optimizers are not supported; see docs/migrate-from-horovod.md)")
    if keras_2 != uses_tf_keras():
        raise ValueError(
            f"DistributedOptimizer got a {'Keras 2 (tf_keras)' if keras_2 else 'Keras 3'} optimizer, but tf.keras is "
            f"{'Keras 3' if keras_2 else 'Keras 2'} in this process: smdist_tf serves the Keras tf.keras is. "
            "For Keras 2 set TF_USE_LEGACY_KERAS=1 before importing TensorFlow (with tf-keras installed); "
            "for Keras 3 leave it unset.")
    if keras_2 and hasattr(optimizer, "inner_optimizer"):
        raise TypeError("DistributedOptimizer takes the optimizer inside a tf_keras LossScaleOptimizer: "
                        "wrap it as LossScaleOptimizer(DistributedOptimizer(optimizer))")
    return keras_2
