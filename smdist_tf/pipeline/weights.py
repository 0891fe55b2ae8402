"""Which weights a rank materialises, and unpartitioned checkpoints written and read a variable at a time.

A pipeline rank holds only its stage's variables (tied ones included). Keras 3 can
create a variable without a value: inside ``keras.StatelessScope`` a variable with an
initializer only records it (``_value is None``) until ``_deferred_initialize()``.
:func:`build_deferred` builds the whole model that way; the pipeline then initialises
this stage's variables and leaves the others empty. A variable left empty gets a
:class:`NotHeld` initializer: it still yields symbolic placeholders (Keras traces
whole models to learn shapes) but refuses to make a value eagerly, so a stray read
fails with a clear message instead of silently returning fresh random weights.

Keras' own ``save_weights``/``load_weights`` need every variable's value on the calling
rank. :func:`checkpoint_layout` replays Keras' saving traversal with a recording store
to learn where each variable lives in a ``.weights.h5`` file; saving then streams the
values to rank 0 one at a time, and loading reads only this rank's datasets. The file
is byte-for-byte the layout Keras writes (any stage count, or plain Keras, loads it).
This uses Keras' saving internals, through smdist_tf/_compat.py (pinned Keras 3.15; the
checkpoint tests exercise them).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional

import keras
import tensorflow as tf

from smdist_tf import _compat


class NotHeld(keras.initializers.Initializer):
    """Initializer of a variable another pipeline stage holds: symbolic use only."""

    def __init__(self, path: str, stages: list[int], rank: int):
        self.path, self.stages, self.rank = path, stages, rank

    def __call__(self, shape, dtype=None):
        if tf.executing_eagerly():
            raise RuntimeError(
                f"variable {self.path} belongs to pipeline stage(s) {self.stages}; rank {self.rank} does not hold it. "
                "Use the PipelineModel (fit/evaluate/predict/save_weights), or gather_weights() to "
                "materialise the whole model on every rank.")
        # Inside a graph being traced for shapes: a Fill op, nothing is allocated.
        return tf.zeros(shape, dtype)


def build_deferred(model_fn: Callable[[], keras.Model]) -> tuple[keras.Model, keras.StatelessScope]:
    """Calls ``model_fn`` so that its variables are declared but get no values.

    Returns:
        The model and the scope it was built in (holding any assignments ``model_fn`` made).
    """
    # initialize_variables=False: leaving the scope must not initialise everything.
    with keras.StatelessScope(initialize_variables=False) as scope:
        try:
            model = model_fn()
        except ValueError as e:
            if "stateless scope" in str(e):
                raise ValueError(f"PipelineModel builds model_fn's variables without values, which failed: {e}\n"
                                 "model_fn must create layers only; or pass a built model instead.") from e
            raise
    if not isinstance(model, keras.Model):
        raise TypeError(f"model_fn must return a keras.Model, got {type(model).__name__}")
    return model, scope


def claim_deferred(variables: list) -> None:
    """Takes ``variables`` off Keras' list of variables awaiting initialisation.

    Keras initialises everything on that list whenever an outermost ``StatelessScope``
    closes, and ``fit`` opens one to trace the model for shapes: that would quietly
    materialise every stage's weights on every rank.
    """
    pending = _compat.get_global_attribute("uninitialized_variables")
    if pending:
        ours = {id(v) for v in variables}
        _compat.set_global_attribute("uninitialized_variables", [v for v in pending if id(v) not in ours])


def is_held(variable: Any) -> bool:
    """Whether this process has a value for ``variable``."""
    return variable._value is not None


def materialize(variable: Any, scope: Optional[keras.StatelessScope]) -> None:
    """Gives a deferred variable its initial value (and any value ``model_fn`` assigned to it)."""
    if is_held(variable):
        return
    variable._deferred_initialize()
    assigned = scope.get_current_value(variable) if scope is not None else None
    if assigned is not None:
        variable.assign(assigned)


def release(variable: Any, guard: NotHeld) -> None:
    """Drops this process's value of ``variable`` (freed once nothing else references it)."""
    variable._value = None
    variable._initializer = guard


def set_value(variable: Any, value: tf.Tensor) -> None:
    """Assigns ``value``, first creating the variable's storage if this process did not hold it."""
    if is_held(variable):
        variable.assign(value)
    else:
        variable._initializer = None
        variable._initialize(tf.cast(value, tf.as_dtype(variable._dtype)))


@dataclasses.dataclass
class Entry:
    """One group of a ``.weights.h5`` file (a layer's ``vars``) and the variables stored in it."""

    path: str
    metadata: Optional[dict]
    items: list  # (key, variable)


class _RecordingStore(_compat.H5IOStore):
    """Records what Keras' saving traversal would write, without a file."""

    def __init__(self):  # noqa: D107 - deliberately skips opening a file
        self.mode = "w"
        self.entries: list[Entry] = []

    def __bool__(self) -> bool:
        return True

    def make(self, path, metadata=None):
        self.entries.append(Entry(path, metadata, []))
        return self

    def __setitem__(self, key, value):
        self.entries[-1].items.append((key, value))

    def close(self) -> None:
        pass


def checkpoint_layout(model: keras.Model) -> list[Entry]:
    """Where every variable of ``model`` goes in a Keras ``.weights.h5`` file, in writing order.

    Raises:
        ValueError: a layer saves computed values rather than its variables (quantized
            or LoRA layers), which a stage cannot produce for another stage's layer.
    """
    store = _RecordingStore()
    try:
        _compat.save_state(model, weights_store=store, assets_store=None, inner_path="",
                               visited_saveables=set())
    except RuntimeError as e:
        if "does not hold it" not in str(e):
            raise
        raise ValueError("PipelineModel checkpoints support layers that save their variables as they are; a layer "
                         f"computes what it saves from its weights ({e})") from None
    known = {id(v) for v in model.variables}
    for entry in store.entries:
        for key, value in entry.items:
            if id(value) not in known:
                raise ValueError("PipelineModel checkpoints support layers that save their variables as they are; "
                                 f"layer {entry.path!r} saves a computed value as {key!r}")
    return store.entries
