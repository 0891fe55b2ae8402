"""Horovod's graph-mode topology ops: ``rank_op()``, ``size_op()``, ... evaluated when the graph runs.

``rank()`` and friends return Python ints, which ``tf.function`` bakes into the
graph as constants; these ops read the running job's topology instead, so a
graph saved by one job gives the right values in another.
"""

from __future__ import annotations

from typing import Optional

import tensorflow as tf

from smdist_tf._native import op_module as _ops


def rank_op(name: Optional[str] = None) -> tf.Tensor:
    """This process's rank, as an int32 scalar tensor computed at run time."""
    return _ops.smdist_rank(name=name)


def local_rank_op(name: Optional[str] = None) -> tf.Tensor:
    """This process's rank on its host, as an int32 scalar tensor computed at run time."""
    return _ops.smdist_local_rank(name=name)


def size_op(process_set_id: int = 0, name: Optional[str] = None) -> tf.Tensor:
    """The number of ranks, as an int32 scalar tensor computed at run time.

    Args:
        process_set_id: only 0, the global process set, exists today.
        name: optional op name.
    """
    return _ops.smdist_size(process_set_id=process_set_id, name=name)


def local_size_op(name: Optional[str] = None) -> tf.Tensor:
    """The number of ranks on this host, as an int32 scalar tensor computed at run time."""
    return _ops.smdist_local_size(name=name)


def process_set_included_op(process_set_id: int = 0, name: Optional[str] = None) -> tf.Tensor:
    """1 if this rank belongs to the process set, as an int32 scalar tensor (only set 0, all ranks, exists)."""
    return _ops.smdist_process_set_included(process_set_id=process_set_id, name=name)


for _op in ("SmdistRank", "SmdistSize", "SmdistLocalRank", "SmdistLocalSize", "SmdistProcessSetIncluded"):
    tf.no_gradient(_op)
