"""Checkpoint helpers: rank 0 writes, every rank restores the same values."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from typing import Any, Iterator, Optional, Sequence

import tensorflow as tf

from smdist_tf.collectives import barrier, broadcast_variables
from smdist_tf.keras_api import is_tf_keras_object
from smdist_tf.runtime import rank
from smdist_tf.sharding.checkpoint import gathered_state
from smdist_tf.sharding.optimizer import sharded_optimizers


def save_on_rank_zero(obj: Any, path: str, **save_kwargs: Any) -> Optional[str]:
    """Saves a ``tf.train.Checkpoint`` (``write``) or a Keras model (``save``) on rank 0 only.

    Every rank must call it; all return once the file exists, so a following
    restore on another rank sees it (on a shared file system). A model whose optimizer
    state is sharded is gathered first, so the file holds the full state and loads at
    any number of ranks (see ``smdist_tf.sharding.gathered_state``). A Keras 2 model
    is saved on every rank, the others writing into a scratch directory they remove:
    under a strategy, Keras 2 reads metric variables as collectives while it saves.

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
        if rank() == 0:
            written = _save_here(obj, path, **save_kwargs)
        else:
            written = None
            if is_tf_keras_object(obj):
                with scratch_path(path) as scratch:
                    _save_here(obj, scratch, **save_kwargs)
    barrier()  # nobody reads before rank 0 has finished writing
    return written


@contextlib.contextmanager
def scratch_path(path: str) -> Iterator[str]:
    """A path with ``path``'s file name in a private temporary directory, removed on exit.

    For ranks other than 0 that must run a save (it takes part in collectives) whose
    file nobody wants.
    """
    directory = tempfile.mkdtemp(prefix="smdist_save_")
    try:
        yield os.path.join(directory, os.path.basename(path))
    finally:
        shutil.rmtree(directory, ignore_errors=True)


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
