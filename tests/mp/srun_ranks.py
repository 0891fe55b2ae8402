"""Every rank of ``srun --mpi=pmix -n N`` (no mpirun, no smdistrun): the engine without TensorFlow.

Run by tests/test_slurm_cluster.py. Each rank prints ``SRUN rank size local_rank local_size sum``: the
engine learnt the job from Slurm's PMIx server, and an allreduce of rank + 1 went through it.
"""

from __future__ import annotations

import sys

sys.modules["tensorflow"] = None  # starting ranks is what is tested here: TensorFlow's import would only cost

import numpy as np  # noqa: E402

from smdist_tf import _runtime as rt  # noqa: E402

SUM = 1  # smdist_tf/reduce_ops.py

rt.init()
values = np.full(3, float(rt.rank() + 1), np.float32)
total = np.empty_like(values)
rt._allreduce_buffer(values, total, "srun.sum", SUM, 1.0, 1.0)
print(f"SRUN {rt.rank()} {rt.size()} {rt.local_rank()} {rt.local_size()} {total[0]:g}", flush=True)
rt.shutdown()
