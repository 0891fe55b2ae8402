"""What the ranks run in tests/test_faults_multiprocess.py (not a pytest module).

``python tests/mp/fault_ranks.py MODE TAG``: each mode makes one rank fail in one
way while the others are busy, and prints ``FAILING <unix time>`` just before
the failure so the test can time how long the job lives on after it.
"""

from __future__ import annotations

import sys
import time

import numpy as np
import tensorflow as tf

import smdist_tf as sd


def announce_failure() -> None:
    print(f"FAILING {time.time():.3f}", flush=True)


def exit_while_peer_computes() -> None:
    """Rank 1 exits with 3; rank 0 computes for a minute outside any collective."""
    if sd.rank() == 1:
        announce_failure()
        sys.exit(3)
    a = np.random.default_rng(0).random((256, 256))
    end = time.monotonic() + 60
    while time.monotonic() < end:
        a = np.tanh(a @ a)


def exit_during_collectives() -> None:
    """Rank 1 exits with 3 while every other rank waits in an allreduce it never joins."""
    if sd.rank() == 1:
        time.sleep(1.0)
        announce_failure()
        sys.exit(3)
    sd.allreduce(tf.ones([4]), name="never.completes")


def raise_on_rank0() -> None:
    """Rank 0 raises while the others wait in an allreduce."""
    if sd.rank() == 0:
        time.sleep(1.0)
        announce_failure()
        raise RuntimeError("failure injected on rank 0")
    sd.allreduce(tf.ones([4]), name="never.completes")


if __name__ == "__main__":
    sd.init()
    sd.allreduce(tf.ones([1]), name="everyone.up")
    {"exit_while_peer_computes": exit_while_peer_computes, "exit_during_collectives": exit_during_collectives,
     "raise_on_rank0": raise_on_rank0}[sys.argv[1]]()
