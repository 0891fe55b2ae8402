"""``keras.distribution``'s backend functions for TensorFlow, answered by the smdist_tf job.

Keras' backend-neutral ``keras.distribution`` calls the current backend's
``distribution_lib`` module for everything about processes and devices; Keras 3.15's
TensorFlow module is a prototype without most of them. ``patch_backend_distribution_lib``
sets these functions there (the names Keras calls are listed in smdist_tf/_compat.py).
They describe the job ``DataParallelStrategy`` trains over: one process per rank, one
device per process, so rank r's device is ``"<type>:r"``.

What differs from the JAX backend: nothing is sharded inside a process, so
``distribute_tensor`` and ``distribute_data_input`` (which JAX's trainer calls) return
their value as it is, after checking that the layout asks for no more than data parallelism
(see ``require_data_parallel_layout``).
"""

from __future__ import annotations

from typing import Any, Optional

import tensorflow as tf

from smdist_tf import _compat
from smdist_tf.initialization import init
from smdist_tf.keras.distribution_activation import job_strategy, require_data_parallel_layout
from smdist_tf.runtime import is_initialized, rank, size


def _started() -> None:
    # Keras asks for devices and processes while it builds a Distribution, with or without initialize().
    if not is_initialized():
        init()


def initialize(job_addresses: Optional[str], num_processes: Optional[int], process_id: Optional[int]) -> None:
    """Starts smdist_tf (``sd.init()``); the job is the one MPI started.

    Args:
        job_addresses: the processes' addresses, comma-separated; MPI found them already, so only
            their number is checked (a single address, JAX's coordinator, is not).
        num_processes: checked against ``smdist_tf.size()`` when given.
        process_id: checked against ``smdist_tf.rank()`` when given.

    Raises:
        ValueError: a given value disagrees with the job smdist_tf runs in (on every rank whose
            value disagrees; a value the same on all ranks fails on all of them).
    """
    _started()
    addresses = job_addresses.split(",") if job_addresses and "," in job_addresses else None
    given = {"num_processes": (num_processes, size()), "process_id": (process_id, rank()),
             "job_addresses (count)": (None if addresses is None else len(addresses), size())}
    wrong = {name: values for name, values in given.items() if values[0] is not None and values[0] != values[1]}
    if wrong:
        said = ", ".join(f"{name}={asked} but smdist_tf has {actual}" for name, (asked, actual) in wrong.items())
        raise ValueError(f"keras.distribution.initialize: {said}. On the TensorFlow backend the job is the one "
                         "smdistrun (MPI) started: launch with -np <num_processes>, or leave these arguments out.")


def num_processes() -> int:
    """The number of processes in the job: ``smdist_tf.size()``."""
    _started()
    return size()


def process_id() -> int:
    """This process's index in the job: ``smdist_tf.rank()``."""
    _started()
    return rank()


def list_devices(device_type: Optional[str] = None) -> list[str]:
    """Every rank's device, in rank order: ``["gpu:0", "gpu:1", ...]`` where ranks have GPUs, else ``"cpu:r"``.

    Args:
        device_type: ``"cpu"`` or ``"gpu"``; ``None`` picks GPUs when this process sees one.

    Returns:
        One device per rank, or ``[]`` for a type this process has none of (``"tpu"``).
    """
    _started()
    kind = (device_type or ("gpu" if tf.config.list_logical_devices("GPU") else "cpu")).lower()
    if kind != "cpu" and not tf.config.list_logical_devices(kind.upper()):
        return []
    return [f"{kind}:{r}" for r in range(size())]


def get_device_count(device_type: Optional[str] = None) -> int:
    """``len(list_devices(device_type))``: the job's devices of that type."""
    return len(list_devices(device_type))


def distribute_tensor(tensor: Any, layout: Any) -> Any:
    """``tensor`` as it is: each rank holds its part of the batch, or the whole of a replicated value."""
    require_data_parallel_layout(layout, f"the tensor layout {layout}")
    return tensor


def distribute_data_input(per_process_batch: Any, layout: Any, batch_dim_name: str) -> Any:
    """This process's batch as it is: the strategy trains each rank's replica on its own batch."""
    require_data_parallel_layout(layout, f"the data layout {layout}")
    return per_process_batch


def _to_backend_mesh(device_mesh: Any) -> Any:
    """The ``tf.distribute.Strategy`` that runs ``device_mesh`` (the job's ``DataParallelStrategy``)."""
    if len(device_mesh.devices.flatten()) != size():
        raise ValueError(f"{device_mesh} has {device_mesh.devices.size} devices; this job has one per rank, {size()}")
    return job_strategy()


def _to_backend_layout(tensor_layout: Any) -> Any:
    """The layout itself, once checked: the strategy needs nothing more to place a replicated value."""
    if tensor_layout.device_mesh is None:
        raise ValueError(f"{tensor_layout} has no device mesh")
    require_data_parallel_layout(tensor_layout, f"the layout {tensor_layout}")
    return tensor_layout


_FUNCTIONS = (initialize, num_processes, process_id, list_devices, get_device_count, distribute_tensor,
              distribute_data_input, _to_backend_mesh, _to_backend_layout)


def patch_backend_distribution_lib() -> None:
    """Sets the functions above on Keras' TensorFlow ``distribution_lib`` module."""
    module = _compat.keras_backend_distribution_lib()
    for function in _FUNCTIONS:
        setattr(module, function.__name__, function)
