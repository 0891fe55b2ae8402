"""What the ranks run in tests/test_pipeline_multiprocess.py's rank-death tests (not a pytest module).

``python tests/mp/pipeline_rank_death.py MODE`` trains a 2-stage PipelineModel (with 4
ranks: 2 stages x 2 replicas); on its third step, rank 1 (stage 1) ends instead of
running its schedule, while stage 0 sends it forwards and then waits for their gradients:

* ``exit``: ``os._exit(3)``, a hard death (no Python cleanup, no MPI finalize);
* ``raise``: an exception escapes ``fit`` and the process exits through Python's
  cleanup, which shuts its engine down.

Every other rank prints ``rank R: <error type>: <message>`` if its step fails (and
exits 0), and ``rank R: finished`` if training completes (which must not happen).
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402

import smdist_tf as sd  # noqa: E402
from smdist_tf.keras import PipelineModel  # noqa: E402


def main(mode: str) -> None:
    sd.init()
    rank = sd.rank()

    def model_fn() -> keras.Model:
        keras.utils.set_random_seed(1)
        return keras.Sequential([keras.Input((8,))] + [keras.layers.Dense(8, activation="tanh") for _ in range(3)]
                                + [keras.layers.Dense(3)])

    pm = PipelineModel(model_fn, num_stages=2, num_microbatches=2, verbose=False)
    pm.compile(optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 8)).astype(np.float32)
    y = rng.integers(0, 3, 64)

    runner, run, calls = pm._runner, pm._runner.run, [0]

    def dying_run(*args, **kwargs):
        calls[0] += 1
        if rank == 1 and calls[0] == 3:  # step 3: stage 0 waits for gradients only this rank sends
            print(f"rank {rank}: dying ({mode})", flush=True)
            if mode == "exit":
                os._exit(3)
            raise RuntimeError("rank 1 fails inside its pipeline step")
        return run(*args, **kwargs)

    runner.run = dying_run
    try:
        pm.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0)
    except Exception as e:  # noqa: BLE001 - reported for the test to read
        if rank == 1:
            raise
        # Exit 0 after reporting: a non-zero exit would make mpirun stop the other
        # survivors before they report; the job's code is the failing rank's.
        # One line: an error inside the compiled step puts TensorFlow's "Graph execution error:" first.
        text = " | ".join(line.strip() for line in str(e).splitlines() if line.strip())
        print(f"rank {rank}: {type(e).__name__}: {text[:3000]}", flush=True)
        return
    print(f"rank {rank}: finished", flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
