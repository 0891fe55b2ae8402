"""``ShardedParameter``: this rank's piece of a weight, read as the whole weight (ZeRO stage 3).

Under ``DataParallelStrategy(shard_parameters=True)`` the strategy's variable creator
returns one of these to Keras in place of a full-size ``tf.Variable`` (see "Parameter
sharding (stage 3)" in docs/architecture.md). It holds only this rank's flat piece
(``ShardLayout``: flatten, pad, rank r owns piece r) and converts to the full tensor
through an allgather whose gradient is a reduce-scatter into the piece, so the tape's
gradient for the weight is this rank's piece of the reduced gradient.
"""

from __future__ import annotations

import dataclasses
import weakref
from typing import Any, Optional

import numpy as np
import tensorflow as tf

from smdist_tf.collectives import allgather, reducescatter
from smdist_tf.process_sets import ProcessSet
from smdist_tf.reduce_ops import Sum
from smdist_tf.sharding.layout import ShardLayout


@dataclasses.dataclass(frozen=True)
class ParameterSharding:
    """Options of ``DataParallelStrategy(shard_parameters=ParameterSharding(...))``; ``True`` means the defaults.

    Attributes:
        regather_in_backward: gather a layer's weights again for its backward pass (its call is
            recomputed there), so they exist in full only while the layer runs; ``False`` keeps
            the forward pass's gathered weights until the backward: more memory, half the gathers.
        gather_ahead: in the forward pass, start a recomputed layer's gathers one layer ahead
            (once the previous such layer's input exists), so they overlap that layer's compute;
            ``False`` waits for the layer's own input: one layer's full weights alive at a time
            instead of two. The backward's gathers always wait for the layer's own input.
        overlap_backward: in the backward pass, let a recomputed layer make its weights' full-size
            gradients while its gathered weights still exist, and let the layer before it gather
            meanwhile, so the reduce-scatters overlap the backward's compute: faster where cores are
            spare, and about 1.5 layers more at the step's peak. ``False`` runs each layer's backward in
            turn (gather, the input's gradient, the weights' gradients, their reduce-scatter), so the
            step's peak is about this rank's share of the weights, their gradients and the optimizer
            state, plus one layer.
    """

    regather_in_backward: bool = True
    gather_ahead: bool = True
    overlap_backward: bool = False


def gather_pieces(piece: tf.Tensor, layout: ShardLayout, process_set: Optional[ProcessSet] = None) -> tf.Tensor:
    """The full weight from every rank's ``piece``; its gradient is this rank's piece of the summed gradient.

    Sum, not Average: under a strategy Keras (and ``tf.nn.compute_average_loss``) already
    scales each replica's loss by 1/N, as the unsharded strategy's allreduce expects.
    """

    @tf.custom_gradient
    def gather(value: tf.Tensor) -> Any:
        def reduce_scatter(upstream: Any) -> tf.Tensor:
            # The piece's update consumes this gradient, so waiting here for the read gathered above
            # keeps that update from overtaking the read. tf.function orders them with a control edge,
            # but Grappler's dependency optimizer drops it as redundant next to a path through the
            # recomputing gradient's IdentityN (regather.py; seen with tf.recompute_grad's, the same op),
            # then bypasses the IdentityN, which cuts the path: a weight whose gradient does not use it (a
            # Dense kernel; overlapped, or in the first layer, nothing else orders its regather before
            # the update) was then now and then gathered for the backward after this step had updated
            # its piece (issue 42).
            with tf.control_dependencies([value]):
                # An embedding's IndexedSlices gradient is made dense: the piece is dense.
                return reducescatter(layout.padded(0, tf.convert_to_tensor(upstream)), op=Sum,
                                     process_set=process_set)

        return layout.full_from_gathered(0, allgather(value, process_set=process_set)), reduce_scatter

    return gather(piece)


class ShardedParameter:
    """A weight of which this rank keeps piece ``index`` of ``ranks`` (the backing store of a Keras variable).

    Reads (``tf.convert_to_tensor``, ``read_value``, operators) give the full weight via
    an allgather, a collective every rank makes; assigns take a full value and keep this
    rank's piece.

    Args:
        piece: the variable holding this rank's flat piece (a mirrored variable of the strategy).
        shape: the weight's full shape.
        ranks: how many ranks share the weight.
        index: this rank's position among them.
        regather_in_backward: gather the weight again for its layer's backward pass instead of
            keeping the forward pass's gathered value (smdist_tf/sharding/regather.py).
        gather_ahead: let its layer's gathers start one layer ahead (smdist_tf/sharding/regather.py).
        overlap_backward: let its layer's backward overlap the next one's (smdist_tf/sharding/regather.py).
        process_set: the ranks that share the weight (``None``: all); ``ranks`` and ``index`` count its members.
    """

    def __init__(self, piece: tf.Variable, shape: tf.TensorShape, ranks: int, index: int,
                 regather_in_backward: bool = True, gather_ahead: bool = True, overlap_backward: bool = False,
                 process_set: Optional[ProcessSet] = None) -> None:
        self.piece = piece
        self.process_set = process_set
        self.regather_in_backward = regather_in_backward
        self.gather_ahead = gather_ahead
        self.overlap_backward = overlap_backward
        self.layout = ShardLayout([shape], ranks, index)
        self.gathered: Optional[tf.Tensor] = None  # the full value while a checkpoint save runs
        self._view: Any = None

    # --- what Keras and TensorFlow ask of a variable --------------------------------------------
    @property
    def shape(self) -> tf.TensorShape:
        return tf.TensorShape(self.layout.shapes[0])

    @property
    def dtype(self) -> tf.DType:
        return self.piece.dtype

    @property
    def name(self) -> str:
        return self.piece.name

    @property
    def trainable(self) -> bool:
        return self.piece.trainable

    @property
    def device(self) -> str:
        return self.piece.device

    @property
    def _unique_id(self) -> str:
        # Keras' TF optimizer keys variables by it (TFOptimizer._var_key): the piece's, so a
        # LossScaleOptimizer's key for the weight and its inner optimizer's for the piece agree.
        return self.piece._unique_id

    @property
    def handle(self) -> tf.Tensor:
        # Keras' Variable.handle: what GradientTape watches. The piece is what is read and trained.
        return self.piece.handle

    def read_value(self) -> tf.Tensor:
        """The full weight (an allgather of every rank's piece)."""
        if self.gathered is not None:
            return self.gathered
        return gather_pieces(tf.convert_to_tensor(self.piece), self.layout, self.process_set)

    def numpy(self) -> Any:
        """The full weight as a NumPy array (a collective unless a save has gathered it)."""
        return self.read_value().numpy()

    def __array__(self, dtype: Any = None, copy: Any = None) -> Any:
        # NumPy conversion must not be a collective (Keras' repr tries it on one rank): gathered saves only.
        if self.gathered is None:
            raise ValueError(f"sharded weight {self.name}: read it with .numpy() on every rank, or save it "
                            "with smdist_tf.distribute.save_on_rank_zero")
        return np.asarray(self.gathered.numpy(), dtype=dtype)

    def assign(self, value: Any, use_locking: bool = False, name: Optional[str] = None, read_value: bool = True) -> Any:
        """Keeps this rank's piece of the full ``value``."""
        return self.piece.assign(self._piece_of(value), use_locking=use_locking, read_value=read_value)

    def assign_add(self, delta: Any, use_locking: bool = False, name: Optional[str] = None,
                   read_value: bool = True) -> Any:
        return self.piece.assign_add(self._piece_of(delta), use_locking=use_locking, read_value=read_value)

    def assign_sub(self, delta: Any, use_locking: bool = False, name: Optional[str] = None,
                   read_value: bool = True) -> Any:
        return self.piece.assign_sub(self._piece_of(delta), use_locking=use_locking, read_value=read_value)

    def _piece_of(self, value: Any) -> tf.Tensor:
        value = tf.convert_to_tensor(value, dtype=self.dtype)
        if not value.shape.is_compatible_with(self.shape):
            raise ValueError(f"cannot assign a value of shape {value.shape} to sharded weight {self.name} "
                             f"of shape {self.shape}")
        return self.layout.shard_of(0, value, own_buffer=True)  # the piece must not keep the full value

    def piece_view(self, keras_module: Any, name: str) -> Any:
        """A piece-shaped Keras variable that is this rank's piece (no copy): what the optimizer updates."""
        if self._view is None:
            piece = self.piece
            # Keras makes its store with tf.Variable(...): hand it the existing piece instead.
            with tf.variable_creator_scope(lambda next_creator, **kwargs: piece):
                self._view = keras_module.Variable(initializer=lambda shape, dtype: tf.zeros(shape, dtype),
                                                   shape=tuple(piece.shape), dtype=piece.dtype.name,
                                                   trainable=True, name=name)
            _views[id(self._view)] = self._view
            _owners[id(self._view)] = self
        return self._view

    def __repr__(self) -> str:
        return (f"<ShardedParameter {self.name} shape={tuple(self.shape)} piece={self.layout.index}/"
                f"{self.layout.ranks} ({self.layout.shard_sizes[0]} elements)>")


# The piece views made so far and their parameters, by id (Keras variables are not hashable).
_views: "weakref.WeakValueDictionary[int, Any]" = weakref.WeakValueDictionary()
_owners: "weakref.WeakValueDictionary[int, ShardedParameter]" = weakref.WeakValueDictionary()


def is_piece_view(variable: Any) -> bool:
    """Whether ``variable`` is a ``ShardedParameter``'s piece view (what a stage-3 optimizer updates)."""
    return _views.get(id(variable)) is variable


def owner_of_view(variable: Any) -> Optional[ShardedParameter]:
    """The ``ShardedParameter`` whose piece view ``variable`` is, or ``None``."""
    return _owners.get(id(variable)) if is_piece_view(variable) else None


def _to_tensor(value: ShardedParameter, dtype: Any = None, name: Optional[str] = None, as_ref: bool = False) -> Any:
    if dtype is not None and not tf.as_dtype(dtype).is_compatible_with(value.dtype):
        return NotImplemented
    return value.read_value()


tf.register_tensor_conversion_function(ShardedParameter, _to_tensor)


def _operator(name: str) -> Any:
    def apply(self: ShardedParameter, *args: Any) -> Any:
        return getattr(self.read_value(), name)(*args)

    apply.__name__ = name
    return apply


# Keras' Variable forwards indexing (and some arithmetic) to its store: read the full weight.
for _name in tf.Tensor.OVERLOADABLE_OPERATORS:
    if _name not in ("__eq__", "__ne__"):  # identity comparison, as for tf.Variable in dict keys
        setattr(ShardedParameter, _name, _operator(_name))
