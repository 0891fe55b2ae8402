"""Optimizer-state and gradient sharding (ZeRO stages 1 and 2); see docs/sharding.md."""

from smdist_tf.sharding.checkpoint import gathered_state
from smdist_tf.sharding.layout import ShardLayout
from smdist_tf.sharding.optimizer import ELEMENTWISE_OPTIMIZERS, ShardingSettings, sharded_optimizers, unsharded_variables
from smdist_tf.sharding.tape import apply_sharded_gradients

__all__ = ["ELEMENTWISE_OPTIMIZERS", "ShardLayout", "ShardingSettings", "apply_sharded_gradients", "gathered_state",
           "sharded_optimizers", "unsharded_variables"]
