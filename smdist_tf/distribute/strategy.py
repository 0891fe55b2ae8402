"""``DataParallelStrategy``: a ``tf.distribute.Strategy`` with one replica per smdist_tf process."""

from __future__ import annotations

from typing import Any, Optional, Union

import tensorflow as tf

from smdist_tf import _compat, process_sets as _process_sets
from smdist_tf.compression import Compression, Compressor
from smdist_tf.distribute.cross_device_ops import SmdistCrossDeviceOps, group_size
from smdist_tf.distribute.extended import DataParallelExtended
from smdist_tf.keras.patches import install_keras_patches
from smdist_tf.keras.strategy_gradients import validated_gradient_op
from smdist_tf.keras_api import keras_api, require_keras_3, uses_tf_keras
from smdist_tf.process_sets import ProcessSet
from smdist_tf.reduce_ops import Average, Sum
from smdist_tf.initialization import init
from smdist_tf.runtime import is_initialized, rank
from smdist_tf.sharding.optimizer import ShardingSettings
from smdist_tf.sharding.parameter import ParameterSharding
from smdist_tf.strategy_kind import OneReplicaPerRank


def _is_scalar_value(value: Any) -> bool:
    def scalar(v: Any) -> bool:
        v = v.values[0] if isinstance(v, _compat.DistributedValues) else v
        shape = getattr(v, "shape", None)
        return shape is not None and shape.rank == 0

    return all(scalar(v) for v in tf.nest.flatten(value, expand_composites=False))


# Subclassing MultiWorkerMirroredStrategy (without its __init__) makes Keras treat us as a
# multi-worker strategy: per-batch logs are reduced across ranks and predict() gathers.
class DataParallelStrategy(OneReplicaPerRank, tf.distribute.MultiWorkerMirroredStrategy):
    """Synchronous data parallelism over smdist_tf processes (launched by ``mpirun``), one replica each.

    Use like any ``tf.distribute.Strategy``: create and compile the model inside
    ``scope()``; ``model.fit`` and ``strategy.run`` then average gradients over all
    ranks in one fused allreduce, variables start from rank 0's values, datasets are
    sharded per rank (the batch size you give is the global batch), and logs are
    global averages; per-rank datasets of different lengths never hang ``fit`` or
    ``evaluate`` (see ``smdist_tf.keras.uneven_data``). ``model.predict_on_batch(x)``
    predicts this rank's ``x`` alone, with no communication. Checkpoints and summaries
    should be written where ``strategy.extended.should_checkpoint`` is true (rank 0).

    Args:
        compression: wire compression for floating-point reductions
            (``Compression.none``, ``.fp16``, ``.bf16`` or ``.int8``).
        progress_on_rank_zero_only: route Keras' progress bars and messages on the other
            ranks to absl logging (hidden by default), so one rank prints them.
        process_set: train over this ``ProcessSet``'s members only (its first rank plays
            rank 0's part); other ranks may train other models at the same time. Its
            members must hold equally many batches (the uneven-data join spans all ranks).
        shard_optimizer_state: ZeRO stage 1: every Keras optimizer made in ``scope()``
            keeps its slots for this rank's 1/N of each variable; gradients are
            reduce-scattered and updated weights allgathered (see docs/sharding.md).
            Save with ``smdist_tf.distribute.save_on_rank_zero`` on every rank.
        shard_gradients: ZeRO stage 2 (implies stage 1): gradient-accumulation
            buffers (``gradient_accumulation_steps``) are sharded too.
        shard_parameters: ZeRO stage 3 (implies stages 1 and 2): every trainable weight
            made in ``scope()`` keeps only this rank's 1/N piece; reads allgather it, its
            gradient is reduce-scattered into the piece, and the optimizer updates pieces
            (see docs/sharding.md). ``True`` gathers each layer's weights again for its
            backward pass; ``sd.sharding.ParameterSharding(regather_in_backward=False)`` keeps
            them from the forward pass instead (more memory, half the gathers), and
            ``gather_ahead=False`` stops the forward's gathers starting one layer ahead (less memory, no overlap),
            and ``overlap_backward=True`` lets each layer's backward overlap the next one's (more memory; faster
            where cores are spare).
        gradient_op: how the optimizer combines the ranks' gradients, as ``op`` of
            Horovod's ``DistributedOptimizer``: ``Average`` (the global mean gradient) or
            ``Adasum`` (the Adasum of each rank's gradient of its own batch; Keras 3, a
            power-of-two number of replicas, no compression or sharding; see
            docs/api.md#adasum). Metrics, losses, ``strategy.reduce`` and BatchNorm
            statistics are reduced as always.

    Raises:
        ValueError: when this rank is not a member of ``process_set`` or it is not
            registered, sharding is asked for together with compression, or
            ``gradient_op`` is not one the strategy can use here.
    """

    def __init__(self, compression: type[Compressor] = Compression.none, progress_on_rank_zero_only: bool = True,
                 process_set: Optional[ProcessSet] = None, shard_optimizer_state: bool = False,
                 shard_gradients: bool = False, shard_parameters: Union[bool, ParameterSharding] = False,
                 gradient_op: int = Average) -> None:
        if not is_initialized():
            init()
        self._sharding = None
        if shard_optimizer_state or shard_gradients or shard_parameters:
            require_keras_3("shard_optimizer_state")
            if compression is not Compression.none:
                raise ValueError("shard_optimizer_state: reduce-scatter has no wire compression; use Compression.none")
            # Keras scales each replica's loss by 1/N under a strategy, so the gradients are summed.
            self._sharding = ShardingSettings(shard_gradients=shard_gradients or bool(shard_parameters), op=Sum,
                                              process_set=process_set, clip_reduced=False,
                                              shard_parameters=bool(shard_parameters))
        if process_set is not None:
            _process_sets.process_set_id(process_set)  # registered?
            if not process_set.included():
                raise ValueError(f"rank {rank()} is not a member of {process_set}: only its members may use "
                                 "DataParallelStrategy(process_set=...)")
        self._process_set = process_set
        self._gradient_op = validated_gradient_op(gradient_op, compression, group_size(process_set),
                                                  sharded=self._sharding is not None)
        parameter_sharding = ParameterSharding() if shard_parameters is True else (shard_parameters or None)
        tf.distribute.Strategy.__init__(self, DataParallelExtended(self, SmdistCrossDeviceOps(compression, process_set),
                                                                   shard_parameters=parameter_sharding))
        install_keras_patches()
        first_replica = (rank() if process_set is None else process_set.rank()) == 0
        if progress_on_rank_zero_only and not first_replica:
            keras = keras_api()
            (keras.utils if uses_tf_keras() else keras.config).disable_interactive_logging()

    @property
    def process_set(self) -> Optional[ProcessSet]:
        """The ``ProcessSet`` this strategy trains over, or ``None`` for all ranks."""
        return self._process_set

    @property
    def gradient_op(self) -> int:
        """How the optimizer combines the ranks' gradients: ``Average`` or ``Adasum``."""
        return self._gradient_op

    @property
    def sharding_settings(self) -> Any:
        """The ``ShardingSettings`` optimizers made in ``scope()`` get, or ``None`` without sharding."""
        return self._sharding

    @property
    def cluster_resolver(self) -> None:
        """No TF cluster: processes are found through MPI."""
        return None

    def reduce(self, reduce_op: Any, value: Any, axis: Optional[int] = None) -> Any:
        """``tf.distribute.Strategy.reduce``, also for scalars with ``axis=0``.

        TF fails on ``reduce(MEAN, scalar, axis=0)`` (tensorflow/tensorflow#72388),
        which Keras issues for per-batch logs; a scalar has no axis to reduce, so the
        axis is dropped.
        """
        if axis == 0 and _is_scalar_value(value):
            axis = None
        return super().reduce(reduce_op, value, axis)

    def __deepcopy__(self, memo: dict) -> "DataParallelStrategy":
        # Keras and tf.function may deep-copy strategies; one per process is enough.
        memo[id(self)] = self
        return self
