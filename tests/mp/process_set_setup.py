"""The process sets every process-set suite runs on, and the helpers they share.

Imported by the suite_process_sets*.py suites (run in one job by tests/test_process_sets_multiprocess.py):
importing it registers the static sets with ``init(process_sets=[...])``, once per rank (conftest.py has
started the engine without sets). At 4 ranks they are even [0, 2], odd [1, 3], low [0, 1], high [1, 2, 3]
(which overlaps low and odd), top [2, 3] (disjoint from low) and solo [3]; at 2 ranks every subset but the
singletons [0] and [1] repeats the global set, which cannot be registered twice.

Each rank runs a test's collectives on the sets it belongs to, in the order of ``ALL_SETS`` (one order for
every rank, so blocking calls on overlapping sets cannot wait on each other in a cycle). Inputs depend on
the rank and the set, so a collective that ran on the wrong ranks gives a wrong result rather than a lucky
right one.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

import smdist_tf as sd
from tests.mp.collective_expectations import rank_values
from tests.mp.engine_restart import restart_engine

SIZE = sd.size()


def static_set_ranks() -> dict:
    if SIZE >= 4:
        return {
            "even": list(range(0, SIZE, 2)),
            "odd": list(range(1, SIZE, 2)),
            "low": [0, 1],
            "high": list(range(1, SIZE)),
            "top": [SIZE - 2, SIZE - 1],
            "solo": [SIZE - 1],
        }
    # At 2 ranks any other subset has the global set's ranks: a set may not repeat them.
    return {f"only{r}": [r] for r in range(SIZE)}


SETS = {name: sd.ProcessSet(ranks) for name, ranks in static_set_ranks().items()}
ALL_SETS = list(SETS.values())
sd.init(process_sets=ALL_SETS)
STATIC_IDS = {name: ps.process_set_id for name, ps in SETS.items()}

# Two sets without a common rank that together hold every rank, and (at 4 ranks) two that share rank 1.
DISJOINT = (SETS["low"], SETS["top"]) if SIZE >= 4 else (SETS["only0"], SETS["only1"])
# Sets registered by the dynamic tests: at 4 ranks they overlap; at 2 the singletons.
DYNAMIC_RANKS = [[0, 2], [1, 2, 3]] if SIZE >= 4 else [[0], [1]]


def my_sets() -> list:
    return [ps for ps in ALL_SETS if ps.included()]


def other_sets() -> list:
    return [ps for ps in ALL_SETS if not ps.included()]


def set_values(ps, shape, dtype, op=sd.Sum, seed=0) -> list:
    """Each member's input (in member order); other sets get other inputs."""
    return [rank_values(r, shape, dtype, op, seed * 101 + ps.process_set_id) for r in ps.ranks]


def as_f64(t) -> np.ndarray:
    return tf.cast(t, tf.float64).numpy() if t.dtype != tf.bool else t.numpy()


def block_of(rows: int, n: int, index: int) -> slice:
    """The rows of dimension 0 member ``index`` of ``n`` gets from reducescatter."""
    start = sum(rows // n + (i < rows % n) for i in range(index))
    return slice(start, start + rows // n + (index < rows % n))


def restart(process_sets=None, **env: str) -> None:
    """Restarts the engine on every rank with ``process_sets`` and extra settings ('' removes one)."""
    if sd.is_initialized():
        # shutdown() fails every rank's pending collectives, on any set: wait until all are done
        # (a rank may still be in a collective on a set of its own while another comes here).
        sd.barrier()
    restart_engine(process_sets, **env)


def _root(ps) -> int:
    return ps.ranks[0] if isinstance(ps, sd.ProcessSet) and ps.ranks else 0


def _variables_broadcast(ps, n):
    var = tf.Variable(tf.ones([2]))
    sd.broadcast_variables([var], _root(ps), process_set=ps)
    return var


# Every collective with process_set=, and inputs any member may pass (n: members of the set).
COLLECTIVES = {
    "allreduce": lambda ps, n: sd.allreduce(tf.ones([4]), op=sd.Sum, process_set=ps),
    "grouped_allreduce": lambda ps, n: sd.grouped_allreduce([tf.ones([4]), tf.ones([2], tf.int32)], op=sd.Sum, process_set=ps),
    "allgather": lambda ps, n: sd.allgather(tf.ones([2, 3]), process_set=ps),
    "grouped_allgather": lambda ps, n: sd.grouped_allgather([tf.ones([2]), tf.zeros([1], tf.int64)], process_set=ps),
    "broadcast": lambda ps, n: sd.broadcast(tf.ones([3]), _root(ps), process_set=ps),
    "grouped_broadcast": lambda ps, n: sd.grouped_broadcast([tf.ones([3]), tf.ones([1], tf.bool)], _root(ps), process_set=ps),
    "alltoall": lambda ps, n: sd.alltoall(tf.ones([2 * n, 2]), process_set=ps),
    "alltoall_splits": lambda ps, n: sd.alltoall(tf.ones([n, 2]), splits=[1] * n, process_set=ps),
    "reducescatter": lambda ps, n: sd.reducescatter(tf.ones([2 * n, 2]), op=sd.Sum, process_set=ps),
    "grouped_reducescatter": lambda ps, n: sd.grouped_reducescatter([tf.ones([n, 2])], op=sd.Sum, process_set=ps),
    "barrier": lambda ps, n: sd.barrier(process_set=ps),
}
# Variables cannot be created inside tf.function on every call: eager only.
EAGER_ONLY = {"broadcast_variables": _variables_broadcast}
