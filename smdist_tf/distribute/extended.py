"""``DataParallelExtended``: the StrategyExtended behind ``DataParallelStrategy``.

One replica per process (rank r is replica r; on a process set, its members in rank
order are the replicas); every cross-replica operation goes
through ``SmdistCrossDeviceOps``. Builds on TF's MirroredExtended for variables,
updates and input pipelines, and overrides what must span processes.
"""

from __future__ import annotations

from typing import Any, Optional

import tensorflow as tf

from smdist_tf import _compat
from smdist_tf.collectives import broadcast
from smdist_tf.distribute.cross_device_ops import SmdistCrossDeviceOps, gather_tensor, local_value
from smdist_tf.runtime import local_rank, rank, size
from smdist_tf.sharding.parameter import ParameterSharding, ShardedParameter
from smdist_tf.sharding.layout import ShardLayout

def _is_weight(kwargs: dict) -> bool:
    """Whether a variable is a model weight that stage 3 shards.

    Keras passes ``trainable`` explicitly: its weights are trainable; moving statistics,
    metrics, optimizer slots and counters are not.
    """
    dtype = kwargs.get("dtype")
    return (kwargs.get("trainable") is True and dtype is not None and tf.as_dtype(dtype).is_floating
            and kwargs.get("synchronization") != tf.VariableSynchronization.ON_READ)


_BROADCASTABLE = (tf.uint8, tf.int8, tf.int32, tf.int64, tf.float16, tf.bfloat16, tf.float32, tf.float64, tf.bool)


def local_device() -> str:
    """The device this process computes on: its local GPU if there is one, else the CPU."""
    gpus = tf.config.list_logical_devices("GPU")
    if gpus:
        return gpus[local_rank() % len(gpus)].name
    return "/job:localhost/replica:0/task:0/device:CPU:0"


class DataParallelExtended(_compat.MirroredExtended):
    """StrategyExtended for ``DataParallelStrategy`` (see there)."""

    def __init__(self, container_strategy: Any, cross_device_ops: SmdistCrossDeviceOps,
                 shard_parameters: Optional[ParameterSharding] = None) -> None:
        super().__init__(container_strategy, devices=[local_device()], cross_device_ops=cross_device_ops)
        self._shard_parameters = shard_parameters
        self._creating_piece = False
        # Whatever TF would pick for XLA or int32 values, ours is the only one that spans processes.
        self._collective_ops = cross_device_ops
        self._cluster_resolver = None
        process_set = cross_device_ops.process_set
        # Replicas are all ranks, or the process set's members in rank order.
        self._replica = rank() if process_set is None else process_set.rank()
        self._replicas = size() if process_set is None else process_set.size()
        self._first_rank = 0 if process_set is None else process_set.ranks[0]
        # A job of one replica on the CPU takes its input as it is: nothing to shard, rebatch or
        # agree on between ranks, and TF's distributed iterator (a multi-device iterator even for
        # one device) costs about 170 us a step, a sixth of a small training step.
        self._plain_input = self._replicas == 1 and not tf.config.list_logical_devices("GPU")
        self._serves_keras_distribution = False

    def serve_keras_distribution(self) -> None:
        """Takes a dataset as this rank's own while a ``keras.distribution`` is current.

        Keras' data adapter has then sharded it per process already (or the user did, with
        ``auto_shard_dataset=False``), as the JAX backend expects: sharding it again by rank
        would leave each rank 1/N of its share. Without a current ``keras.distribution`` the
        strategy shards a global-batch dataset by rank, as it always does.
        """
        self._serves_keras_distribution = True

    def _keras_sharded_input(self) -> bool:
        if not self._serves_keras_distribution:
            return False
        import keras  # Keras 3: use_keras_distribution() made sure

        return keras.distribution.distribution() is not None

    # --- topology -------------------------------------------------------------------------------
    @property
    def _num_replicas_in_sync(self) -> int:
        return self._replicas

    def _get_replica_id_in_sync_group(self, replica_id: int) -> int:
        return self._replica + replica_id

    def _get_local_replica_id(self, replica_id_in_sync_group: int) -> int:
        return replica_id_in_sync_group - self._replica

    def _in_multi_worker_mode(self) -> bool:
        # Makes TF's distributed iterators agree every step on whether any rank still has
        # data, so uneven shards end together (with empty batches) instead of hanging.
        return True

    @property
    def experimental_between_graph(self) -> bool:
        return True

    @property
    def should_checkpoint(self) -> bool:
        return self._replica == 0

    @property
    def should_save_summary(self) -> bool:
        return self._replica == 0

    def _use_merge_call(self) -> bool:
        # merge_call cannot run inside tf.cond (Keras gradient accumulation); one replica needs none.
        return False

    def _get_cross_device_ops(self, value: Any) -> SmdistCrossDeviceOps:
        return self._cross_device_ops

    # --- variables ------------------------------------------------------------------------------
    def _create_variable(self, next_creator: Any, **kwargs: Any) -> Any:
        # ONLY_FIRST_REPLICA needs merge_call to write; with one replica per process every
        # rank computes the same update anyway (e.g. optimizer.iterations, loss scale).
        if kwargs.get("aggregation") == tf.VariableAggregation.ONLY_FIRST_REPLICA:
            kwargs["aggregation"] = tf.VariableAggregation.NONE
        if self._shard_parameters is not None and _is_weight(kwargs):
            return self._create_sharded_parameter(next_creator, kwargs)
        return super()._create_variable(next_creator, **kwargs)

    def _create_sharded_parameter(self, next_creator: Any, kwargs: dict) -> ShardedParameter:
        """A trainable weight as this rank's piece of rank 0's initial value (ZeRO stage 3)."""
        device = local_device()
        with tf.init_scope():
            full = self._first_replica_value(kwargs["initial_value"], kwargs.get("dtype"), device)()
        layout = ShardLayout([full.shape], self._replicas, self._replica)
        # The full value lives only until its piece is copied out: no full-size variable is made.
        piece = layout.shard_of(0, full, own_buffer=True)
        del full
        self._creating_piece = True
        try:
            variable = super()._create_variable(next_creator, **dict(kwargs, initial_value=piece, shape=piece.shape))
        finally:
            self._creating_piece = False
        return ShardedParameter(variable, tf.TensorShape(layout.shapes[0]), self._replicas, self._replica,
                                regather_in_backward=self._shard_parameters.regather_in_backward,
                                gather_ahead=self._shard_parameters.gather_ahead,
                                overlap_backward=self._shard_parameters.overlap_backward,
                                process_set=self._cross_device_ops.process_set)

    def _get_variable_creator_initial_value(self, replica_id: int, device: str, primary_var: Any, **kwargs: Any) -> Any:
        if replica_id != 0 or self._creating_piece:  # a piece is this rank's own
            return super()._get_variable_creator_initial_value(replica_id, device, primary_var, **kwargs)
        return self._first_replica_value(kwargs["initial_value"], kwargs.get("dtype"), device)

    def _first_replica_value(self, initial_value: Any, dtype: Any, device: str) -> Any:
        """A function giving the first replica's ``initial_value`` (broadcast), whatever this rank's seed."""

        def from_rank_zero():
            value = initial_value() if callable(initial_value) else initial_value
            if isinstance(value, _compat.CheckpointInitialValue):
                value = value.wrapped_value
            value = tf.convert_to_tensor(value, dtype=dtype)
            if self._replicas == 1 or value.dtype not in _BROADCASTABLE:
                return value
            # Every replica starts from the first one's value, whatever its own random seed.
            with tf.device(device):
                return broadcast(value, root_rank=self._first_rank, process_set=self._cross_device_ops.process_set)

        return from_rank_zero

    # --- input ----------------------------------------------------------------------------------
    def _input_context(self) -> tf.distribute.InputContext:
        return tf.distribute.InputContext(num_input_pipelines=self._replicas, input_pipeline_id=self._replica,
                                          num_replicas_in_sync=self._replicas)

    def _experimental_distribute_dataset(self, dataset: tf.data.Dataset, options: Any) -> Any:
        if options and options.experimental_replication_mode == tf.distribute.InputReplicationMode.PER_REPLICA:
            raise NotImplementedError("InputReplicationMode.PER_REPLICA needs distribute_datasets_from_function")
        if self._plain_input:
            return dataset
        if self._keras_sharded_input():
            return self._distribute_datasets_from_function(lambda _: dataset, options)
        return _compat.get_distributed_dataset(
            dataset,
            self._input_workers_with_options(options),
            self._container_strategy(),
            num_replicas_in_sync=self._replicas,
            input_context=self._input_context(),
            options=options,
        )

    def _distribute_datasets_from_function(self, dataset_fn: Any, options: Any) -> Any:
        if self._plain_input:
            return dataset_fn(self._input_context())
        return _compat.get_distributed_datasets_from_function(
            dataset_fn=dataset_fn,
            input_workers=self._input_workers_with_options(options),
            input_contexts=[self._input_context()],
            strategy=self._container_strategy(),
            options=options,
        )

    def _experimental_distribute_values_from_function(self, value_fn: Any) -> Any:
        context = tf.distribute.experimental.ValueContext(replica_id_in_sync_group=self._replica,
                                                          num_replicas_in_sync=self._replicas)
        return _compat.regroup((value_fn(context),))

    # --- communication --------------------------------------------------------------------------
    def _reduce_to(self, reduce_op: Any, value: Any, destinations: Any, options: Any) -> Any:
        flat = tf.nest.flatten(value, expand_composites=False)
        if all(isinstance(v, _compat.Mirrored) for v in flat) and reduce_op == tf.distribute.ReduceOp.MEAN:
            return value  # already identical everywhere
        # Plain tensors count as this rank's replica value (graph tensors captured
        # outside strategy.run come with empty destinations, which TF's checks reject).
        reduced = self._cross_device_ops.reduce_tensors(reduce_op, [local_value(v) for v in flat])
        return tf.nest.pack_sequence_as(value, reduced)

    def _batch_reduce_to(self, reduce_op: Any, value_destination_pairs: Any, options: Any) -> list:
        values = [value for value, _ in value_destination_pairs]
        return self._reduce_to(reduce_op, values, None, options)

    def _gather_to_implementation(self, value: Any, destinations: Any, axis: int, options: Any) -> Any:
        process_set = self._cross_device_ops.process_set
        return tf.nest.map_structure(lambda v: gather_tensor(local_value(v), axis, process_set), value)

    def _replica_ctx_all_reduce(self, reduce_op: Any, value: Any, options: Any = None) -> Any:
        # One replica per process: no merge_call, in eager mode too.
        return self._cross_device_ops._all_reduce(reduce_op, value, 0, options)

    def _replica_ctx_update(self, var: Any, fn: Any, args: Any, kwargs: Any, group: bool) -> Any:
        if isinstance(var, _compat.DistributedVariable):
            var = var._get_replica(0)  # pylint: disable=protected-access
        with tf.device(var.device):
            return fn(var, *args, **kwargs)
