"""Autotuning (SMDIST_AUTOTUNE=1 / HOROVOD_AUTOTUNE=1), run on every rank by tests/test_autotune_multiprocess.py.

Small samples (one warm-up sample, two working cycles each) so tuning ends within a few dozen
steps. While it tries settings every result stays right. When it ends, every rank runs the
same choice, the choice is kept, and rank 0's log has a line per sample.
"""

from __future__ import annotations

import csv
import os

import numpy as np
import tensorflow as tf

import smdist_tf as sd

TUNED = ["fusion_threshold_bytes", "cycle_time_ms", "shm_min_bytes", "cross_memory_min_bytes"]
MAX_STEPS = 400


class AutotuneTest(tf.test.TestCase):
    def step_function(self):
        # Four 256 KiB tensors: large enough for the intra-host paths, small enough to fuse.
        tensors = [tf.fill([64 * 1024], float(sd.rank() + i)) for i in range(4)]

        @tf.function
        def step():
            return sd.grouped_allreduce(tensors, op=sd.Sum, name="tuned")

        return step

    def tuned_settings(self) -> np.ndarray:
        config = sd.engine_config()
        return np.array([float(config[k]) for k in TUNED])

    def tune(self) -> None:
        """Steps until tuning has ended on every rank (at once if it has), checking every result."""
        step = self.step_function()
        total = sum(range(sd.size()))
        steps = 0
        # Each rank reads its own state, so they agree first: tuning ends on the same cycle everywhere.
        while not all(sd.allgather_object(sd.engine_config()["autotune_finished"])):
            self.assertLess(steps, MAX_STEPS, "autotuning did not finish")
            for i, reduced in enumerate(step()):
                self.assertAllEqual(reduced[:4], [total + i * sd.size()] * 4)
            steps += 1

    def test_tuning_ends_with_one_choice_on_every_rank_and_keeps_it(self):
        self.assertTrue(sd.engine_config()["autotune"])
        self.tune()
        chosen = self.tuned_settings()
        for r, theirs in enumerate(sd.allgather_object(chosen)):
            self.assertAllEqual(theirs, chosen, msg=f"rank {r} tuned differently")
        step = self.step_function()
        for _ in range(20):
            step()
        self.assertAllEqual(self.tuned_settings(), chosen, "the choice changed after tuning ended")

    def test_rank_zero_logs_every_sample(self):
        self.tune()
        if sd.rank() != 0:
            return
        with open(os.environ["SMDIST_AUTOTUNE_LOG"]) as f:
            rows = list(csv.DictReader(f))
        phases = [row["phase"] for row in rows]
        self.assertEqual(phases[0], "warmup")
        self.assertIn("fusion threshold", phases)
        self.assertIn("cycle time", phases)
        self.assertTrue(all(float(row["bytes_per_second"]) > 0 for row in rows[1:]), rows)
        thresholds = {int(row["fusion_threshold_bytes"]) for row in rows}
        self.assertGreaterEqual(len(thresholds), 4, "the fusion threshold was not varied")



if __name__ == "__main__":
    tf.test.main()
