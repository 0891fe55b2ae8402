"""Optimizer-state, gradient and parameter sharding (ZeRO stages 1, 2 and 3); see docs/sharding.md."""

from smdist_tf.sharding.checkpoint import gathered_state
from smdist_tf.sharding.layout import ShardLayout
from smdist_tf.sharding.optimizer import ELEMENTWISE_OPTIMIZERS, ShardingSettings, sharded_optimizers, unsharded_variables
from smdist_tf.sharding.parameter import ParameterSharding, ShardedParameter
from smdist_tf.sharding.piece_optimizer import sharded_parameter
from smdist_tf.sharding.tape import apply_sharded_gradients

__all__ = ["ELEMENTWISE_OPTIMIZERS", "ParameterSharding", "ShardLayout", "ShardedParameter", "ShardingSettings", "apply_sharded_gradients",
           "gathered_state", "sharded_optimizers", "sharded_parameter", "unsharded_variables"]
