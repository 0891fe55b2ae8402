"""``PipelineModel``'s checkpoints: whole-model ``.weights.h5`` files and per-stage ``.npz`` files.

Each function takes the ``PipelineModel``; its methods of the same names call them.
A variable's first holder (``pipe._holders(v)[0]``) is the rank that sends or writes it.
"""

from __future__ import annotations

import os
from typing import Any, Union

import numpy as np
import tensorflow as tf

from smdist_tf import _compat
from smdist_tf.collectives import barrier, grouped_allreduce
from smdist_tf.objects import broadcast_object
from smdist_tf.pipeline import weights as weights_lib
from smdist_tf.pipeline.exchange import from_bytes, to_bytes
from smdist_tf.pipeline.point_to_point import recv, send
from smdist_tf.pipeline.stage import TAG_CHECKPOINT
from smdist_tf.reduce_ops import Sum
from smdist_tf.runtime import rank


def gather_weights(pipe: Any) -> list[np.ndarray]:
    """``PipelineModel.gather_weights`` (see its docstring) for ``pipe``."""
    variables = pipe.unpartitioned.variables
    values = []
    for v in variables:
        nbytes = int(np.prod(v.shape, dtype=np.int64)) * tf.as_dtype(v.dtype).size
        first = pipe._holders(v)[0] == rank()
        values.append(to_bytes(tf.convert_to_tensor(v)) if first else tf.zeros([nbytes], tf.uint8))
    # Bytes summed with zeros from every rank but the first holder: an exact copy, any dtype.
    for v, value in zip(variables, grouped_allreduce(values, op=Sum, name="pipeline.gather_weights")):
        weights_lib.set_value(v, from_bytes(value, v.dtype, v.shape))
    pipe.unpartitioned._smdist_released = False  # whole again: it may be wrapped anew
    return pipe.unpartitioned.get_weights()


def _check_h5(filepath: Union[str, os.PathLike]) -> str:
    path = os.fspath(filepath)
    if not path.endswith(".weights.h5"):
        raise ValueError(f"PipelineModel checkpoints are Keras .weights.h5 files; got {path!r}")
    return path


def save_weights(pipe: Any, filepath: Union[str, os.PathLike], overwrite: bool = True, **kwargs) -> None:
    """``PipelineModel.save_weights`` (see its docstring) for ``pipe``."""
    path = _check_h5(filepath)
    if kwargs:
        raise ValueError(f"PipelineModel.save_weights does not support {sorted(kwargs)}")
    exists = broadcast_object(os.path.exists(path) if rank() == 0 else None, name="pipeline.save_exists")
    if exists and not overwrite:
        raise FileExistsError(f"{path} exists and overwrite=False")
    layout = weights_lib.checkpoint_layout(pipe.unpartitioned)
    me, error = rank(), None
    if me != 0:
        for entry in layout:
            for _, v in entry.items:
                if pipe._holders(v)[0] == me:
                    send([to_bytes(tf.convert_to_tensor(v))], 0, TAG_CHECKPOINT)
    else:

        store = None
        try:
            store = _compat.H5IOStore(path, mode="w")
        except Exception as e:  # noqa: BLE001 - reported to every rank below
            error = e
        for entry in layout:
            if error is None:
                try:
                    store.make(entry.path, metadata=entry.metadata)
                except Exception as e:  # noqa: BLE001
                    error = e
            for key, v in entry.items:
                owner = pipe._holders(v)[0]
                # Receive even after a write failed: no message may stay behind for a later save.
                if owner == 0:
                    value = tf.convert_to_tensor(v)
                else:
                    value = from_bytes(recv([tf.uint8], owner, TAG_CHECKPOINT)[0], v.dtype, v.shape)
                if error is None:
                    try:
                        store[key] = value.numpy()
                    except Exception as e:  # noqa: BLE001
                        error = e
        if store is not None:
            store.close()
    # Collective: every rank learns whether rank 0 wrote the file.
    failure = broadcast_object(None if error is None else f"{type(error).__name__}: {error}",
                                  name="pipeline.save_weights")
    if error is not None:
        raise error
    if failure is not None:
        raise OSError(f"rank 0 could not write {path}: {failure}")


def load_weights(pipe: Any, filepath: Union[str, os.PathLike], skip_mismatch: bool = False, **kwargs) -> None:
    """``PipelineModel.load_weights`` (see its docstring) for ``pipe``."""
    path = _check_h5(filepath)
    if skip_mismatch or kwargs:
        raise ValueError("PipelineModel.load_weights does not support skip_mismatch or other options")

    layout = weights_lib.checkpoint_layout(pipe.unpartitioned)
    store = _compat.H5IOStore(path, mode="r")
    try:
        for entry in layout:
            store.get(entry.path)
            for key, v in entry.items:
                if key not in store:
                    raise ValueError(f"{path} has no weight {entry.path}/vars/{key} for {v.path}")
                shape = tuple(store._h5_entry_group[key].shape)
                if shape != tuple(v.shape):
                    raise ValueError(f"{path}: {entry.path}/vars/{key} has shape {shape}, {v.path} has {tuple(v.shape)}")
        for entry in layout:
            store.get(entry.path)
            for key, v in entry.items:
                if weights_lib.is_held(v):
                    v.assign(store[key])
    finally:
        store.close()


def _stage_file(pipe: Any, directory: Union[str, os.PathLike]) -> str:
    return os.path.join(os.fspath(directory), f"stage-{pipe.topology.pp_rank}-of-{pipe.num_stages}.npz")


def _stage_weight_variables(pipe: Any) -> dict:
    """This stage's variables keyed by their position in the unpartitioned model (names differ between instances)."""
    position = {id(v): k for k, v in enumerate(pipe.unpartitioned.variables)}
    out = {}
    for c in pipe._runner.calls:
        for v in c.layer.variables:
            out[f"variable_{position[id(v)]}"] = v
    return out


def save_stage_weights(pipe: Any, directory: Union[str, os.PathLike]) -> str:
    """``PipelineModel.save_stage_weights`` (see its docstring) for ``pipe``."""
    path = _stage_file(pipe, directory)
    if pipe.topology.dp_rank == 0:
        os.makedirs(os.fspath(directory), exist_ok=True)
        np.savez(path, **{key: np.asarray(v) for key, v in _stage_weight_variables(pipe).items()})
    barrier(name="pipeline.save_stage_weights")
    return path


def load_stage_weights(pipe: Any, directory: Union[str, os.PathLike]) -> None:
    """``PipelineModel.load_stage_weights`` (see its docstring) for ``pipe``."""
    with np.load(_stage_file(pipe, directory)) as data:
        for key, v in _stage_weight_variables(pipe).items():
            if key not in data or data[key].shape != tuple(v.shape):
                raise ValueError(f"{_stage_file(pipe, directory)} does not match this stage's {v.path}")
            v.assign(data[key])
