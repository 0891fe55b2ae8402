"""Optimizer-state sharding (ZeRO stages 1 and 2) for Keras 3 optimizers.

A sharded optimizer keeps its slot variables (Adam's moments, momentum, ...) only for
this rank's piece of every model variable (``ShardLayout``). Each update step:

1. the local gradients are reduce-scattered, one request per variable read where it
   lies, so each rank receives the reduced gradient of its own pieces only: the full
   reduced gradient never exists on a rank (and a rank that joined, out of data,
   fails the step on every rank instead of leaving a piece unreduced);
2. each rank copies its pieces of the model variables into shard variables and runs
   the optimizer's own ``update_step`` on them with its sharded slots;
3. the updated pieces are allgathered back into the model variables.

Every supported optimizer updates element by element, so this is the unsharded update
computed in pieces. Keras' own steps around the update stay as they are: learning-rate
schedules, weight decay (applied to the full model variables, which every rank holds),
constraints, EMA, the iteration count. The class keeps the wrapped class's name and
config, so saved models load without smdist_tf.

Where the gradient is reduced decides where clipping happens, as in the unsharded
paths: under ``DataParallelStrategy`` Keras clips each rank's own gradient before the
reduction (as it does under every ``tf.distribute`` strategy); with
``DistributedOptimizer`` clipping applies to the reduced gradient, so its norms are
summed over the shards with one small allreduce.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional, Sequence

import keras
import numpy as np
import tensorflow as tf

from smdist_tf.collectives import allgather, allreduce, reducescatter
from smdist_tf.compression import Compression
from smdist_tf.gradient_reducer import GradientReducer
from smdist_tf.process_sets import ProcessSet
from smdist_tf.reduce_ops import Adasum, Average, Sum
from smdist_tf.runtime import rank, size
from smdist_tf.sharding.layout import ShardLayout

# Optimizers whose update is element by element, so a piece of a variable updates alone.
# Lamb (per-layer trust ratio), Adafactor (factored moments) and Muon (matrix
# orthogonalisation) need whole variables.
ELEMENTWISE_OPTIMIZERS = (
    keras.optimizers.SGD, keras.optimizers.Adam, keras.optimizers.AdamW, keras.optimizers.Adagrad,
    keras.optimizers.RMSprop, keras.optimizers.Lion, keras.optimizers.Adadelta, keras.optimizers.Adamax,
    keras.optimizers.Nadam, keras.optimizers.Ftrl,
)

# Keras slot names that must keep the full shape: the EMA of the model variables.
_FULL_SIZE_SLOTS = ("average",)
_ACCUMULATOR_SLOT = "gradient_accumulator"


@dataclasses.dataclass(frozen=True)
class ShardingSettings:
    """How a sharded optimizer reduces and what it shards.

    Attributes:
        shard_gradients: ZeRO stage 2: gradient-accumulation buffers are sharded too
            (reduce-scattered every micro-step) instead of kept full-size per rank.
        op: the reduction (``Sum`` under a strategy, whose loss is already scaled).
        prescale_factor: multiplies gradients before the reduction.
        postscale_factor: multiplies them after it.
        process_set: the ranks that share the state (``None``: all).
        clip_reduced: clip the reduced gradient (``DistributedOptimizer``), not each
            rank's own (Keras under ``tf.distribute``).
        shard_parameters: ZeRO stage 3: the weights are sharded too (``DataParallelStrategy`` only).
    """

    shard_gradients: bool = False
    op: int = Average
    prescale_factor: float = 1.0
    postscale_factor: float = 1.0
    process_set: Optional[ProcessSet] = None
    clip_reduced: bool = True
    shard_parameters: bool = False

    @classmethod
    def of(cls, reducer: GradientReducer, shard_gradients: bool = False) -> "ShardingSettings":
        """The settings that reduce-scatter as ``reducer`` would reduce (``DistributedOptimizer``, the tape).

        Raises:
            ValueError: ``reducer`` compresses (a reduce-scatter has no wire compression) or uses Adasum.
        """
        if reducer.op == Adasum:
            raise ValueError("optimizer-state sharding reduce-scatters gradients, and Adasum is an allreduce op; "
                             "use op=Average or op=Sum with sharding")
        if reducer.compression is not Compression.none:
            raise ValueError("optimizer-state sharding: reduce-scatter has no wire compression; use Compression.none")
        prescale, postscale = reducer.scale_factors
        return cls(shard_gradients=shard_gradients, op=reducer.op, prescale_factor=prescale,
                   postscale_factor=postscale, process_set=reducer.process_set)

    @property
    def ranks(self) -> int:
        return size() if self.process_set is None else self.process_set.size()

    @property
    def index(self) -> int:
        return rank() if self.process_set is None else self.process_set.rank()


class _ShardState:
    """The shards behind one optimizer; a plain object so Keras tracks none of it as optimizer state."""

    def __init__(self, layout: ShardLayout, model_variables: list, shards: list) -> None:
        self.layout = layout
        self.model_variables = model_variables
        self.shards = shards
        self.position: dict[Any, int] = {}  # optimizer's key of a model variable -> its index
        self.slot_owner: dict[int, int] = {}  # id(slot) -> index of its model variable
        self.gathered: Optional[dict[int, np.ndarray]] = None  # full slots while a save runs


def check_shardable(optimizer: Any) -> None:
    """Raises ``ValueError`` unless ``optimizer`` can be sharded (an unbuilt element-wise Keras optimizer)."""
    if isinstance(optimizer, (keras.optimizers.LossScaleOptimizer, keras.optimizers.MultiOptimizer)):
        raise ValueError(f"shard the optimizers inside the {type(optimizer).__name__}, not the wrapper")
    if not isinstance(optimizer, ELEMENTWISE_OPTIMIZERS):
        names = ", ".join(cls.__name__ for cls in ELEMENTWISE_OPTIMIZERS)
        raise ValueError(f"optimizer-state sharding supports element-wise Keras optimizers ({names}); "
                         f"{type(optimizer).__name__} updates whole variables at once")
    if optimizer.built:
        raise ValueError("optimizer-state sharding must be set up before the optimizer is built "
                         "(before its first step)")


class ShardedApply:
    """Mixed in front of a Keras optimizer's class: slots for this rank's shards only (see module doc)."""

    _smdist_sharding: ShardingSettings
    _smdist_shards: Optional[_ShardState] = None

    # LossScaleOptimizer asks this to agree across ranks on finite gradients.
    @property
    def _smdist_reduces_in_apply(self) -> bool:
        return True

    @property
    def smdist_process_set(self) -> Optional[ProcessSet]:
        """The process set this optimizer reduces over (``None``: all ranks)."""
        return self._smdist_sharding.process_set

    @property
    def shards_optimizer_state(self) -> bool:
        """Always true: this optimizer keeps its slots for this rank's shard of each variable."""
        return True

    # --- building -------------------------------------------------------------------------------
    def build(self, variables: Sequence[Any]) -> None:
        settings = self._smdist_sharding
        if settings.shard_gradients and self.gradient_accumulation_steps and self.use_ema:
            raise ValueError("shard_gradients with gradient_accumulation_steps does not support use_ema")
        variables = list(variables)
        layout = ShardLayout([tuple(v.shape) for v in variables], settings.ranks, settings.index)
        shards = [
            keras.Variable(initializer="zeros", shape=(s,), dtype=v.dtype, trainable=False, aggregation="none",
                           name=v.name)
            for v, s in zip(variables, layout.shard_sizes)
        ]
        state = _ShardState(layout, variables, shards)
        state.position = {self._var_key(v): i for i, v in enumerate(variables)}
        self._smdist_shards = state
        super().build(variables)
        for i, shard in enumerate(shards):
            # A shard updates with its model variable's slots.
            self._trainable_variables_indices[self._var_key(shard)] = i

    def add_variable_from_reference(self, reference_variable: Any, name: Optional[str] = None,
                                    initializer: Any = "zeros") -> Any:
        state = self._smdist_shards
        keep_full = name in _FULL_SIZE_SLOTS or (name == _ACCUMULATOR_SLOT and not self._smdist_sharding.shard_gradients)
        if state is None or keep_full:
            return super().add_variable_from_reference(reference_variable, name=name, initializer=initializer)
        owner = state.position[self._var_key(reference_variable)]
        slot = super().add_variable_from_reference(state.shards[owner], name=name, initializer=initializer)
        state.slot_owner[id(slot)] = owner
        return slot

    # --- the update -----------------------------------------------------------------------------
    def _clip_gradients(self, grads: list) -> list:
        # Keras calls this on the gradients it was given: this rank's own. Under a
        # strategy that is Keras' rule; otherwise clipping waits for the reduced shards.
        if self._smdist_shards is not None and self._smdist_sharding.clip_reduced:
            return grads
        return super()._clip_gradients(grads)

    def _all_reduce_sum_gradients(self, grads_and_vars: Any) -> list:
        return list(grads_and_vars)  # shards arrive reduced

    def _backend_update_step(self, grads: list, trainable_variables: list, learning_rate: Any) -> None:
        positions = [self._get_variable_index(v) for v in trainable_variables]
        shard_grads = self._reduced_shards(positions, grads)
        if self._smdist_sharding.clip_reduced:
            shard_grads = self._clip_shards(positions, shard_grads)
        self._update_shards(positions, shard_grads, learning_rate)

    def _backend_apply_gradients(self, grads: list, trainable_variables: list) -> None:
        if not (self._smdist_sharding.shard_gradients and self.gradient_accumulation_steps):
            return super()._backend_apply_gradients(grads, trainable_variables)
        # Stage 2 with accumulation: reduce-scatter every micro-step into sharded accumulators.
        steps = self.gradient_accumulation_steps
        positions = [self._get_variable_index(v) for v in trainable_variables]
        shard_grads = self._reduced_shards(positions, grads)
        accumulators = [self._accumulated_gradients[i] for i in positions]
        is_update_step = tf.equal((self._iterations + 1) % steps, 0)

        def update() -> None:
            averaged = [(g + a) / steps for g, a in zip(shard_grads, accumulators)]
            self._apply_weight_decay(trainable_variables)
            self._update_shards(positions, self._clip_shards(positions, averaged), self.learning_rate)
            self._backend_reset_gradient_accumulators()

        tf.cond(is_update_step, update, lambda: self._backend_increment_gradient_accumulators(shard_grads, accumulators))

    def _reduced_shards(self, positions: list, grads: list) -> list:
        """This rank's pieces of the reduced gradients."""
        settings, layout = self._smdist_sharding, self._smdist_shards.layout
        grads = [tf.convert_to_tensor(g) for g in grads]  # embeddings' IndexedSlices become dense
        # One reduce-scatter per variable: it reads the gradient where it lies (no packed copy).
        return [reducescatter(layout.padded(i, g), op=settings.op, prescale_factor=settings.prescale_factor,
                              postscale_factor=settings.postscale_factor, process_set=settings.process_set)
                for i, g in zip(positions, grads)]

    def _clip_shards(self, positions: list, shard_grads: list) -> list:
        """Keras' clipping of the reduced gradient, with norms summed over every rank's shard."""
        process_set = self._smdist_sharding.process_set
        if self.clipnorm and self.clipnorm > 0:
            squares = tf.stack([tf.reduce_sum(tf.cast(tf.square(g), tf.float32)) for g in shard_grads])
            norms = tf.sqrt(allreduce(squares, op=Sum, process_set=process_set))
            return [_scaled(g, self.clipnorm / tf.maximum(norms[k], self.clipnorm)) for k, g in enumerate(shard_grads)]
        if self.global_clipnorm and self.global_clipnorm > 0:
            square = tf.add_n([tf.reduce_sum(tf.cast(tf.square(g), tf.float32)) for g in shard_grads])
            norm = tf.sqrt(allreduce(square, op=Sum, process_set=process_set))
            # A non-finite norm makes every gradient NaN, as Keras' clip_by_global_norm does.
            scale = self.global_clipnorm * tf.minimum(1.0 / norm, 1.0 / self.global_clipnorm) + (norm - norm)
            return [_scaled(g, scale) for g in shard_grads]
        if self.clipvalue and self.clipvalue > 0:
            return [tf.clip_by_value(g, -self.clipvalue, self.clipvalue) for g in shard_grads]
        return shard_grads

    def _update_shards(self, positions: list, shard_grads: list, learning_rate: Any) -> None:
        state = self._smdist_shards
        model_variables = [state.model_variables[i] for i in positions]
        shards = [state.shards[i] for i in positions]
        for i, variable, shard in zip(positions, model_variables, shards):
            self.assign(shard, state.layout.shard_of(i, tf.convert_to_tensor(variable)))
        super()._backend_update_step(shard_grads, shards, learning_rate)
        strategy = self._distribution_strategy
        for i, variable, shard in zip(positions, model_variables, shards):
            # One allgather per variable: its result is the padded variable, so no unpacking copy.
            full = state.layout.full_from_gathered(i, self._gathered(shard))
            # Through the strategy: a replica-context assign to a mirrored variable would allreduce it.
            strategy.extended.update(variable.value, _assign, args=(full,), group=False)

    def _gathered(self, shard: Any) -> tf.Tensor:
        return allgather(tf.convert_to_tensor(shard), process_set=self._smdist_sharding.process_set)

    # --- checkpoints ----------------------------------------------------------------------------
    def smdist_gather_state(self) -> dict[int, np.ndarray]:
        """Every sharded slot in full (a collective: all ranks that share the state call it)."""
        state = self._smdist_shards
        if state is None:
            return {}
        # One slot at a time, so only one full slot is in flight beside the gathered arrays.
        return {id(slot): state.layout.full_from_gathered(state.slot_owner[id(slot)], self._gathered(slot)).numpy()
                for slot in self.variables if id(slot) in state.slot_owner}

    def save_own_variables(self, store: Any) -> None:
        state = self._smdist_shards
        if state is not None and state.slot_owner and state.gathered is None:
            raise ValueError(
                "this optimizer's state is sharded over the ranks; save it with "
                "smdist_tf.distribute.save_on_rank_zero(model, path) called on every rank, or inside "
                "`with smdist_tf.sharding.gathered_state(model):` entered on every rank")
        gathered = {} if state is None else state.gathered
        for i, variable in enumerate(self.variables):
            store[str(i)] = gathered[id(variable)] if id(variable) in gathered else variable.numpy()

    def _trackable_children(self, save_type: str = "checkpoint", **kwargs: Any) -> dict:
        # tf.train.Checkpoint would write this rank's shards as if they were the state.
        state = self._smdist_shards
        if save_type == "checkpoint" and state is not None and state.slot_owner and state.gathered is None:
            raise ValueError("a sharded optimizer cannot be saved by tf.train.Checkpoint (it holds this rank's "
                             "shards only): save the Keras model (.keras or .weights.h5) with "
                             "smdist_tf.distribute.save_on_rank_zero on every rank")
        return super()._trackable_children(save_type, **kwargs)

    def load_own_variables(self, store: Any) -> None:
        state = self._smdist_shards
        if state is None:
            raise ValueError("a sharded optimizer loads its state once built: call "
                             "optimizer.build(model.trainable_variables) before loading")
        if len(store.keys()) != len(self.variables):
            raise ValueError(f"the checkpoint holds {len(store.keys())} variables for optimizer '{self.name}', "
                             f"which has {len(self.variables)}: it was saved from another optimizer or model")
        for i, variable in enumerate(self.variables):
            value = np.asarray(store[str(i)])
            owner = state.slot_owner.get(id(variable))
            expected = tuple(variable.shape) if owner is None else state.layout.shapes[owner]
            if value.shape != expected:
                raise ValueError(f"optimizer variable {i} ({variable.name}) has shape {value.shape} in the "
                                 f"checkpoint, expected {expected}")
            variable.assign(value if owner is None else state.layout.shard_of_array(owner, value))


def _assign(variable: Any, value: tf.Tensor) -> Any:
    return variable.assign(value)


def _scaled(gradient: tf.Tensor, factor: tf.Tensor) -> tf.Tensor:
    return gradient * tf.cast(factor, gradient.dtype)


_classes: dict[type, type] = {}


def sharded_class(base: type) -> type:
    """``base`` with ``ShardedApply`` in front, under the same name and module (made once per class)."""
    if base not in _classes:
        _classes[base] = type(base.__name__, (ShardedApply, base), {"__module__": base.__module__})
    return _classes[base]


def shard_in_place(optimizer: keras.optimizers.Optimizer, settings: ShardingSettings) -> keras.optimizers.Optimizer:
    """Makes an unbuilt Keras optimizer keep its state sharded (it becomes an instance of ``sharded_class``)."""
    if isinstance(optimizer, ShardedApply):
        return optimizer
    check_shardable(optimizer)
    optimizer.__class__ = sharded_class(type(optimizer))
    optimizer._smdist_sharding = settings
    return optimizer


def sharded_optimizers(obj: Any) -> list[ShardedApply]:
    """The sharded optimizers of a model or optimizer (looking inside a LossScaleOptimizer)."""
    optimizer = getattr(obj, "optimizer", obj)
    found = []
    while optimizer is not None:
        if isinstance(optimizer, ShardedApply):
            found.append(optimizer)
        optimizer = getattr(optimizer, "inner_optimizer", None)
    return found


def unsharded_variables(optimizer: Any) -> list:
    """``optimizer.variables`` without sharded slots: what may be broadcast from one rank."""
    owners: set = set()
    for sharded in sharded_optimizers(optimizer):
        if sharded._smdist_shards is not None:
            owners |= set(sharded._smdist_shards.slot_owner)
    variables = optimizer.variables
    if callable(variables):  # Keras 2's tf_keras.optimizers.legacy: a method
        variables = variables()
    return [v for v in variables if id(v) not in owners]
