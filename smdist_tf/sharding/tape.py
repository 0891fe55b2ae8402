"""``apply_sharded_gradients``: a custom loop's step with a ``DistributedGradientTape`` and sharded optimizer state."""

from __future__ import annotations

from typing import Any

import keras

from smdist_tf.gradient_tape import DistributedGradientTape
from smdist_tf.sharding.optimizer import ShardingSettings, shard_in_place


def apply_sharded_gradients(tape: DistributedGradientTape, optimizer: keras.optimizers.Optimizer, target: Any,
                            sources: Any, shard_gradients: bool = False) -> None:
    """Computes ``target``'s gradients with ``tape`` and applies them through sharded optimizer state.

    The tape's local gradients are reduce-scattered (with its ``op``,
    ``gradient_predivide_factor`` and ``process_set``), so each rank gets the reduced
    gradient of its shard only; ``optimizer`` updates that shard and the updated
    weights are allgathered. On the first call an unbuilt ``optimizer`` becomes sharded
    in place (see ``smdist_tf.sharding``); use it only with this function afterwards.

    Args:
        tape: the ``DistributedGradientTape`` that recorded ``target``.
        optimizer: an element-wise Keras 3 optimizer (SGD, Adam, AdamW, ...), unbuilt on the first call.
        target: the loss.
        sources: the variables (a flat list).
        shard_gradients: ZeRO stage 2 for the optimizer's ``gradient_accumulation_steps``.

    Raises:
        ValueError: the tape compresses or keeps local sources, or the optimizer cannot be sharded.
    """
    if tape.local_sources():
        raise ValueError("apply_sharded_gradients: local sources are not supported with sharded state")
    shard_in_place(optimizer, ShardingSettings.of(tape.reducer, shard_gradients=shard_gradients))
    sources = list(sources)
    optimizer.apply(tape.local_gradient(target, sources), sources)
