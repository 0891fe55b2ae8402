"""What the ranks run in the restart tests of tests/test_elastic_multiprocess.py (not a pytest module).

``python tests/mp/restart_ranks.py MODE TAG``: the modes use the standard library only,
so an attempt starts in well under a second. Every rank prints one ``ATTEMPT`` line with
what the launcher gave it; the tag is on every command line so the test can look for
leftovers. ``resume_with_unshared_dir`` is for ``smdist_tf.run`` and uses smdist_tf.
"""

from __future__ import annotations

import json
import os
import sys
import time

RANK = int(os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("PMI_RANK", "0")))
SIZE = int(os.environ.get("OMPI_COMM_WORLD_SIZE", os.environ.get("PMI_SIZE", "1")))
RESTART = int(os.environ.get("SMDIST_RESTART_COUNT", "0"))


def report() -> None:
    print("ATTEMPT " + json.dumps({
        "rank": RANK, "size": SIZE, "restart": RESTART, "elastic_dir": os.environ.get("SMDIST_ELASTIC_DIR"),
        "token": os.environ.get("SMDISTRUN_TOKEN"),
    }), flush=True)


def fail_first(tag: str) -> None:
    """Rank 1 exits with 3 on the first attempt; every later attempt succeeds."""
    report()
    if RANK == 1 and RESTART == 0:
        sys.exit(3)


def always_fail(tag: str) -> None:
    """Rank 1 exits with 10 + the restart count: the last attempt's code tells which one ended the job."""
    report()
    if RANK == 1:
        sys.exit(10 + RESTART)


def succeed(tag: str) -> None:
    report()


def hang(tag: str) -> None:
    """Says ready, then sleeps: only a stop ends it."""
    report()
    print(f"ready {RANK}", flush=True)
    time.sleep(120)


def resume_with_unshared_dir(unshared_dir: str) -> tuple:
    """Counts 4 steps with a committed variable; rank 1 exits with 3 after commit 2 on the first attempt.

    Rank 1's ``SMDIST_ELASTIC_DIR`` is another directory, as on a host that does not see
    rank 0's: the resumed state must reach it from rank 0 all the same. Returns
    ((step, variable) at the start of this attempt, final step, final variable).
    """
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf  # noqa: PLC0415

    import smdist_tf as sd  # noqa: PLC0415

    if RANK == 1:
        os.environ["SMDIST_ELASTIC_DIR"] = unshared_dir
    sd.init()
    v = tf.Variable([0.0, 0.0])
    state = sd.elastic.TensorFlowState([v], step=0)

    @sd.elastic.run
    def count(state):
        start = (state.step, v.numpy().tolist())
        while state.step < 4:
            v.assign_add(sd.allreduce(tf.constant([1.0, float(sd.rank())]), op=sd.Sum, name="count"))
            state.step += 1
            state.commit()
            if state.step == 2 and RESTART == 0 and sd.rank() == 1:
                sys.exit(3)
        return start, state.step, v.numpy().tolist()

    return count(state)


MODES = {"fail_first": fail_first, "always_fail": always_fail, "succeed": succeed, "hang": hang}

if __name__ == "__main__":
    MODES[sys.argv[1]](sys.argv[2] if len(sys.argv) > 2 else "")
