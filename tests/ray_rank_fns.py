"""What the ranks of tests/test_ray.py run (no Ray import: these run in the MPI rank processes)."""

from __future__ import annotations

import os
import socket
import time


def topology(scale: float, offset: float = 0.0) -> dict:
    """The rank's place in the job and an allreduce through the engine."""
    import tensorflow as tf

    import smdist_tf as sd

    sd.init()
    total = sd.allreduce(tf.constant([float(sd.rank()) * scale + offset]), op=sd.Sum, name="ray.topology")
    return {"rank": sd.rank(), "size": sd.size(), "local_rank": sd.local_rank(), "local_size": sd.local_size(),
            "sum": float(total.numpy()[0]), "pid": os.getpid()}


def _engine():
    """The engine without TensorFlow (the runtime module on NumPy buffers): a rank starts in a second."""
    from smdist_tf import _runtime as rt

    rt.init()
    return rt


def allreduce_ranks() -> dict:
    """Sum of the ranks through the engine, with this rank's topology."""
    import numpy as np

    rt = _engine()
    out = np.empty(1, np.float64)
    rt._allreduce_buffer(np.array([float(rt.rank())]), out, "ray.ranks", 1)  # 1: Sum
    return {"rank": rt.rank(), "size": rt.size(), "local_rank": rt.local_rank(), "sum": float(out[0])}


def topology_and_sum() -> dict:
    """This rank's full topology, host identity and a sum over the ranks through the engine."""
    import numpy as np

    rt = _engine()
    out = np.empty(1, np.float64)
    rt._allreduce_buffer(np.array([float(rt.rank() + 1)]), out, "ray.topology", 1)  # 1: Sum
    return {"rank": rt.rank(), "size": rt.size(), "local_rank": rt.local_rank(), "local_size": rt.local_size(),
            "cross_rank": rt.cross_rank(), "cross_size": rt.cross_size(), "sum": float(out[0]),
            "hostname": socket.gethostname()}


def raise_on_rank_one() -> None:
    """Rank 1 raises while rank 0 waits in a collective for it."""
    import numpy as np

    rt = _engine()
    if rt.rank() == 1:
        raise ValueError("rank one refuses")
    rt._allreduce_buffer(np.ones(1), np.empty(1), "ray.waits", 1)


def allreduce_until_stopped(marker_dir: str) -> None:
    """Writes ``started.<rank>`` (holding its pid), then allreduces for up to 60 s."""
    import numpy as np

    rt = _engine()
    with open(os.path.join(marker_dir, f"started.{rt.rank()}"), "w") as f:
        f.write(str(os.getpid()))
    deadline = time.monotonic() + 60
    step = 0
    while time.monotonic() < deadline:
        rt._allreduce_buffer(np.ones(4), np.empty(4), f"ray.loop.{step}", 1)
        step += 1
        time.sleep(0.01)



if __name__ == "__main__":
    # examples/ray_keras.py's training under smdistrun: ``smdistrun -np 2 python tests/ray_rank_fns.py OUT.npz``.
    import sys

    from examples.ray_keras import train

    train(save_weights=sys.argv[1])
