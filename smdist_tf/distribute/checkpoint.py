"""Checkpoint helpers: rank 0 writes, every rank restores the same values."""

from __future__ import annotations

from typing import Any, Optional, Sequence

import tensorflow as tf

from smdist_tf.collectives import barrier, broadcast_variables
from smdist_tf.runtime import rank
from smdist_tf.sharding.checkpoint import gathered_state
from smdist_tf.sharding.optimizer import sharded_optimizers


def save_on_rank_zero(obj: Any, path: str, **save_kwargs: Any) -> Optional[str]:
    """Saves a ``tf.train.Checkpoint`` (``write``) or a Keras model (``save``) on rank 0 only.

    Every rank must call it; all return once the file exists, so a following
    restore on another rank sees it (on a shared file system). A model whose optimizer
    state is sharded is gathered first, so the file holds the full state and loads at
    any number of ranks (see ``smdist_tf.sharding.gathered_state``).

    Args:
        obj: a ``tf.train.Checkpoint`` or a ``keras.Model``.
        path: checkpoint prefix, or the model file (``.keras``/``.weights.h5``).
        **save_kwargs: passed to ``write``/``save``.

    Returns:
        The path written on rank 0, ``None`` elsewhere.
    """
    if isinstance(obj, tf.train.Checkpoint) and any(sharded_optimizers(v) for v in vars(obj).values()):
        raise ValueError("tf.train.Checkpoint would save rank 0's shards of the optimizer state only: save the "
                         "Keras model itself (.keras or .weights.h5) with save_on_rank_zero")
    with gathered_state(obj):
        written = _save_here(obj, path, **save_kwargs) if rank() == 0 else None
    barrier()  # nobody reads before rank 0 has finished writing
    return written


def _save_here(obj: Any, path: str, **save_kwargs: Any) -> str:
    if isinstance(obj, tf.train.Checkpoint):
        return obj.write(path, **save_kwargs)
    if path.endswith(".weights.h5"):
        obj.save_weights(path, **save_kwargs)
    else:
        obj.save(path, **save_kwargs)
    return path


def restore_and_broadcast(checkpoint: tf.train.Checkpoint, path: str, variables: Sequence[Any], root_rank: int = 0) -> None:
    """Restores ``checkpoint`` from ``path`` on ``root_rank`` and broadcasts ``variables`` to all ranks.

    Only the root needs to read the file; afterwards ``variables`` are identical everywhere.

    Args:
        checkpoint: the ``tf.train.Checkpoint`` tracking ``variables``.
        path: the prefix passed to ``write``/``save``.
        variables: the variables to synchronise (e.g. ``model.variables + optimizer.variables``).
        root_rank: the rank that reads the file.
    """
    if rank() == root_rank:
        checkpoint.read(path).expect_partial()
    broadcast_variables(list(variables), root_rank=root_rank)
