"""Saving sharded optimizer state: gathered into one file that loads at any rank count.

Saving gathers every sharded slot to its full shape, so the file is exactly what the
unsharded optimizer writes: it loads into a sharded optimizer at any number of ranks
(each rank keeps its own piece of each slot), into an unsharded one, and into Keras
without smdist_tf. One file, rather than one per rank plus a manifest, because Keras'
own formats (``.keras``, ``.weights.h5``) then carry the optimizer, and resharding
needs nothing but the slicing every rank does on load anyway. The cost is that the
saving rank holds the full optimizer state in host memory while it writes.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

from smdist_tf.sharding.optimizer import sharded_optimizers
from smdist_tf.sharding.piece_optimizer import PieceApply, sharded_parameter


@contextlib.contextmanager
def gathered_state(obj: Any) -> Iterator[None]:
    """Gathers the sharded optimizer state of ``obj`` (a model or an optimizer) for a save inside.

    A collective: every rank that shares the state enters it, in the same order. Inside,
    ``model.save``/``save_weights`` on any rank (usually rank 0) write the full state.
    The weights of a model under parameter sharding (stage 3) are gathered too, one at a
    time, and read without collectives inside.

    Args:
        obj: a Keras model compiled with a sharded optimizer, or the optimizer.
    """
    optimizers = [o for o in sharded_optimizers(obj) if o._smdist_shards is not None]
    for optimizer in optimizers:
        optimizer._smdist_shards.gathered = optimizer.smdist_gather_state()
    parameters = [p for p in map(sharded_parameter, getattr(obj, "weights", [])) if p is not None]
    for parameter in parameters:
        parameter.gathered = parameter.read_value()
    piece_optimizers = [o for o in _optimizers_of(obj) if isinstance(o, PieceApply)]
    for optimizer in piece_optimizers:
        optimizer.smdist_gather_slots()
    try:
        yield
    finally:
        for optimizer in optimizers:
            optimizer._smdist_shards.gathered = None
        for parameter in parameters:
            parameter.gathered = None
        for optimizer in piece_optimizers:
            optimizer.smdist_release_slots()


def _optimizers_of(obj: Any) -> list:
    """A model's or optimizer's optimizer and those inside it (a LossScaleOptimizer's)."""
    optimizer, found = getattr(obj, "optimizer", obj), []
    while optimizer is not None:
        found.append(optimizer)
        optimizer = getattr(optimizer, "inner_optimizer", None)
    return found
