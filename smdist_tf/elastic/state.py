"""``State`` and ``ObjectState``: training state that survives a restart of the job (Horovod's shape).

``commit()`` saves the state in memory and, under ``smdistrun`` (which sets
``SMDIST_ELASTIC_DIR``), rank 0 also writes it to that directory; ``resume()``, run by
``smdist_tf.elastic.run`` at start, loads the latest commit there on rank 0 and
gives it to every rank.
"""

from __future__ import annotations

import copy
import sys
from typing import Any, Callable, Iterable

from smdist_tf.elastic.commit_store import CommitStore
from smdist_tf.objects import broadcast_object
from smdist_tf.runtime import rank as _rank

# Collective names: commits and resumes are matched by name, never by call order.
_COMMIT_NAME = "smdist.elastic.commit"
_RESUME_NAME = "smdist.elastic.resume"


class State:
    """State that every rank keeps identical and commits together.

    Subclasses say what the state is with ``save``, ``restore``, ``sync`` and the
    snapshot hooks. Every rank must call ``commit``, ``sync`` and ``resume``, in the
    same order: each runs collectives.
    """

    def __init__(self) -> None:
        self._reset_callbacks: list[Callable[[], Any]] = []
        self._store = CommitStore.from_environment()
        self._commit_number = 0  # of the latest commit on disk, carried over restarts

    def register_reset_callbacks(self, callbacks: Iterable[Callable[[], Any]]) -> None:
        """Adds functions to call after the state was restored from a commit on a restart.

        For example, to rescale the learning rate when the restarted job has another
        number of ranks.

        Args:
            callbacks: functions taking no arguments.
        """
        self._reset_callbacks.extend(callbacks)

    def on_reset(self) -> None:
        """Calls the reset callbacks, in the order they were registered."""
        for callback in self._reset_callbacks:
            callback()

    def commit(self) -> None:
        """Saves the state in memory (for ``restore``) and, under smdistrun, to ``SMDIST_ELASTIC_DIR``.

        Rank 0 writes the commit; then every rank learns whether that worked, so all
        ranks either pass a commit together or raise together. Committing costs a copy
        of the state to host memory (and to disk on rank 0): commit every few batches
        rather than every one.

        Raises:
            RuntimeError: on every rank, when rank 0 could not write the commit.
        """
        self.save()
        if self._store is None:
            return
        number = self._commit_number + 1
        error = None
        if _rank() == 0:
            try:
                self._store.write(number, self._snapshot())
            except Exception as e:  # every rank must hear of it, whatever it is
                error = f"{type(e).__name__}: {e}"
        error = broadcast_object(error, root_rank=0, name=_COMMIT_NAME)
        if error is not None:
            raise RuntimeError(f"smdist_tf.elastic: rank 0 could not write commit {number} to "
                               f"{self._store.directory}: {error}")
        self._commit_number = number

    def resume(self) -> bool:
        """Starts every rank from the latest commit, if there is one, else from rank 0's state.

        Rank 0 loads the commit from ``SMDIST_ELASTIC_DIR`` (the directory need not be
        shared between hosts); ``sync`` then gives its state to every rank.

        Returns:
            Whether a commit was restored.

        Raises:
            ValueError: on every rank, when rank 0 could not read or apply the commit.
        """
        header: dict[str, Any] | None = None
        if _rank() == 0 and self._store is not None:
            try:
                latest = self._store.latest()
                if latest is not None:
                    number, snapshot = latest
                    self._load_snapshot(snapshot)
                    self.restore()
                    header = {"commit": number}
            except Exception as e:  # every rank must hear of it, whatever it is
                header = {"error": f"{type(e).__name__}: {e}"}
        header = broadcast_object(header, root_rank=0, name=_RESUME_NAME)
        if header is not None and "error" in header:
            raise ValueError(f"smdist_tf.elastic: rank 0 could not resume from {self._store.directory}: "
                             f"{header['error']}")
        self.sync()
        if header is None:
            return False
        self._commit_number = header["commit"]
        if _rank() == 0:
            sys.stderr.write(f"[smdist_tf rank 0] elastic: resumed from commit {self._commit_number} "
                             f"in {self._store.directory}\n")
            sys.stderr.flush()
        return True

    def save(self) -> None:
        """Saves the state in this process's memory; ``restore`` returns to it."""
        raise NotImplementedError

    def restore(self) -> None:
        """Returns to the last saved state, dropping changes made since."""
        raise NotImplementedError

    def sync(self) -> None:
        """Gives rank 0's state to every rank, and saves it."""
        raise NotImplementedError

    def _snapshot(self) -> dict[str, Any]:
        """The last saved state, picklable: what a commit writes."""
        raise NotImplementedError

    def _load_snapshot(self, snapshot: dict[str, Any]) -> None:
        """Makes ``snapshot`` (from ``_snapshot``) the saved state; ``restore`` then applies it."""
        raise NotImplementedError


class ObjectState(State):
    """State made of Python values, each given as a keyword argument and kept as an attribute.

    ``state = ObjectState(epoch=0, batch=0)``; then ``state.epoch += 1``. The values
    must be picklable (a commit pickles them).

    Args:
        bcast_object: accepted for Horovod compatibility (its ``ObjectState`` takes
            ``hvd.broadcast_object`` here); smdist_tf's ``broadcast_object`` is used
            when None.
        get_rank: accepted for Horovod compatibility (``hvd.rank``); unused.
        **kwargs: the values, by attribute name.
    """

    def __init__(self, bcast_object: Callable[..., Any] | None = None, get_rank: Callable[[], int] | None = None,
                 **kwargs: Any) -> None:
        super().__init__()
        self._bcast_object = bcast_object or broadcast_object
        self._saved_state = copy.deepcopy(kwargs)
        self._set_attrs()

    def _current_attrs(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self._saved_state}

    def _set_attrs(self) -> None:
        for name, value in self._saved_state.items():
            setattr(self, name, copy.deepcopy(value))

    def save(self) -> None:
        self._saved_state = copy.deepcopy(self._current_attrs())

    def restore(self) -> None:
        self._set_attrs()

    def sync(self) -> None:
        if self._saved_state:
            self._saved_state = self._bcast_object(self._current_attrs(), root_rank=0)
            self._set_attrs()

    def _snapshot(self) -> dict[str, Any]:
        return {"attrs": self._saved_state}

    def _load_snapshot(self, snapshot: dict[str, Any]) -> None:
        # Attributes the program has added since the commit keep their initial values.
        self._saved_state = {**self._saved_state, **snapshot["attrs"]}
