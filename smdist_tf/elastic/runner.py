"""``@smdist_tf.elastic.run``: start a training function from the latest commit."""

from __future__ import annotations

import functools
from typing import Any, Callable, TypeVar

from smdist_tf.elastic.state import State

_Result = TypeVar("_Result")


def run(func: Callable[..., _Result]) -> Callable[..., _Result]:
    """Decorates ``func(state, *args, **kwargs)`` so it starts from the latest commit of ``state``.

    At the call, on every rank: if ``SMDIST_ELASTIC_DIR`` holds a commit (this is a
    restart), rank 0 loads it, every rank receives it, and the reset callbacks run;
    otherwise every rank takes rank 0's state (``state.sync()``). Then ``func`` runs.

    Unlike Horovod's, the wrapper does not retry ``func`` in this process when a rank
    fails: MPI cannot replace a rank in a running job, so the job ends, and
    ``smdistrun --max-restarts`` starts it again from the latest commit.

    Args:
        func: the training function; its first argument is the ``State``.

    Returns:
        The wrapped function, returning what ``func`` returns.
    """

    @functools.wraps(func)
    def wrapper(state: State, *args: Any, **kwargs: Any) -> _Result:
        if state.resume():
            state.on_reset()
        return func(state, *args, **kwargs)

    return wrapper
