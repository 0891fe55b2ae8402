"""What the ranks run in tests/test_launcher_multiprocess.py (not a pytest module).

``python tests/mp/launcher_ranks.py MODE TAG`` runs one mode; the tag is
put on every process's command line so the test can look for leftovers. The
launcher-mechanics modes (and ``where``) use only the standard library (no TensorFlow import),
so they start in milliseconds; ``topology``, ``engine_flags`` and ``allreduce_info`` use
smdist_tf, and ``tf_startup`` imports TensorFlow.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

RANK = int(os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("PMI_RANK", "0")))
TUNING_VARS = [
    "SMDIST_FUSION_THRESHOLD", "HOROVOD_FUSION_THRESHOLD", "SMDIST_CYCLE_TIME", "HOROVOD_CYCLE_TIME",
    "SMDIST_CACHE_CAPACITY", "HOROVOD_CACHE_CAPACITY", "SMDIST_HIERARCHICAL_ALLREDUCE",
    "HOROVOD_HIERARCHICAL_ALLREDUCE", "SMDIST_TIMELINE", "HOROVOD_TIMELINE", "SMDIST_LOG_LEVEL",
    "HOROVOD_LOG_LEVEL",
]


def echo(tag: str) -> None:
    """Two stdout lines, one stderr line, and the tuning variables as JSON."""
    print(f"hello {RANK} {tag}")
    print(f"second {RANK}")
    print(f"problem {RANK}", file=sys.stderr)
    print("ENV " + json.dumps({k: os.environ.get(k) for k in TUNING_VARS}))


def fail_one(tag: str) -> None:
    """Rank 2 (or the last rank) exits with 7 after a moment; the others would sleep a minute."""
    size = int(os.environ.get("OMPI_COMM_WORLD_SIZE", os.environ.get("PMI_SIZE", "1")))
    print(f"up {RANK}", flush=True)
    if RANK == min(2, size - 1):
        time.sleep(0.5)
        sys.exit(7)
    time.sleep(60)


def kill_self(tag: str) -> None:
    """Rank 1 dies by SIGKILL; the others would sleep a minute."""
    if RANK == 1:
        time.sleep(0.5)
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(60)


def late_line(tag: str) -> None:
    """Each rank prints its attempt line; on the first attempt rank 0 prints it only after rank 1 has failed.

    ``LATE_LINE_DIR`` is a directory the test made: rank 0 marks there that it runs, rank 1 that it failed.
    """
    restart = os.environ["SMDIST_RESTART_COUNT"]
    failed = os.path.join(os.environ["LATE_LINE_DIR"], f"failed.{restart}")
    running = os.path.join(os.environ["LATE_LINE_DIR"], f"running.{restart}")
    if restart == "0" and RANK == 1:
        # Fails once rank 0 runs: rank 0's start on a loaded machine must not eat the launcher's stop grace.
        while not os.path.exists(running):
            time.sleep(0.01)
        open(failed, "w").close()
        sys.exit(5)
    if restart == "0":
        open(running, "w").close()
        while not os.path.exists(failed):
            time.sleep(0.01)
        time.sleep(0.1)  # rank 1 has exited by now: this rank is printing while the job is being stopped
    print(f"attempt {restart} on rank {RANK}", flush=True)
    if restart == "0":
        time.sleep(60)  # only the stop ends it


def hang_with_child(tag: str) -> None:
    """Starts a grandchild (sleep) carrying the tag, says ready, then sleeps: only a stop ends it."""
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)", tag])
    print(f"ready {RANK}", flush=True)
    time.sleep(120)


def where(tag: str) -> None:
    """One line: the rank, the host it runs on and its local rank (no TensorFlow)."""
    import socket  # noqa: PLC0415

    print(f"WHERE {RANK} {socket.gethostname()} {os.environ.get('OMPI_COMM_WORLD_LOCAL_RANK')}", flush=True)


def topology(tag: str) -> None:
    """Topology and allreduce results with the launcher's settings, then with hierarchical off."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import numpy as np  # noqa: PLC0415
    import tensorflow as tf  # noqa: PLC0415

    import smdist_tf as sd  # noqa: PLC0415

    def check(mode: str) -> None:
        sd.init()
        n, r = sd.size(), sd.rank()
        # Several sizes (the large ones take the shared-memory + cross-host path), fp16 on the
        # wire, one fused group; sums and averages of small integers must be exact.
        sums = [sd.allreduce(tf.fill([k], float(r + 1)), op=sd.Sum, name=f"{mode}_s{k}") for k in (1, 7, 1000, 300007)]
        sums.append(sd.allreduce(tf.fill([200003], float(r + 1)), op=sd.Sum, compression=sd.Compression.fp16,
                                 name=f"{mode}_fp16"))
        sums += sd.grouped_allreduce([tf.fill([k], float(r + 1)) for k in (5, 100000, 3)], op=sd.Sum, name=f"{mode}_group")
        avg = sd.allreduce(tf.constant([float(r)] * 3), name=f"{mode}_avg")
        ok = all(np.array_equal(s.numpy(), np.full(s.shape, n * (n + 1) / 2, np.float32)) for s in sums)
        ok = ok and np.allclose(avg.numpy(), (n - 1) / 2)
        info = dict(mode=mode, rank=r, size=n, local_rank=sd.local_rank(), local_size=sd.local_size(),
                    cross_rank=sd.cross_rank(), cross_size=sd.cross_size(),
                    hierarchical=sd.engine_config().get("hierarchical_allreduce"), ok=bool(ok))
        print("TOPO " + json.dumps(info), flush=True)
        sd.shutdown()

    check("launcher")
    os.environ["SMDIST_HIERARCHICAL_ALLREDUCE"] = os.environ["HOROVOD_HIERARCHICAL_ALLREDUCE"] = "0"
    check("flat")


def engine_flags(tag: str) -> None:
    """One allreduce under the launcher's engine settings (log level, timeline), then a shutdown."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf  # noqa: PLC0415

    import smdist_tf as sd  # noqa: PLC0415

    sd.init()
    sd.allreduce(tf.ones([2]), name="launcher.flags")
    sd.shutdown()  # finishes the timeline file


def tf_startup(tag: str) -> None:
    """Imports TensorFlow (which prints its start-up lines on stderr), then says so on stderr."""
    import tensorflow as tf  # noqa: PLC0415

    tf.ones([2]) + 1  # the first op: TensorFlow's kernels are set up
    print(f"imported {RANK}", file=sys.stderr)


# --- functions for smdist_tf.run(fn, ...): importable by name on every rank ---

def add_rank(x: int, y: int = 0) -> dict:
    """Returns what this rank saw: its MPI rank and x + y (no TensorFlow)."""
    return {"rank": RANK, "sum": x + y}


def allreduce_info(value: float) -> dict:
    """Initialises smdist_tf and returns this rank's view of an allreduce."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf  # noqa: PLC0415

    import smdist_tf as sd  # noqa: PLC0415

    sd.init()
    total = sd.allreduce(tf.constant([value * (sd.rank() + 1)]), op=sd.Sum, name="prog_sum")
    return {"rank": sd.rank(), "size": sd.size(), "local_rank": sd.local_rank(), "sum": float(total.numpy()[0])}


def raise_on_rank_one() -> int:
    """Rank 1 raises; the others return their rank after a moment."""
    if RANK == 1:
        raise ValueError("rank one refuses")
    time.sleep(30)
    return RANK


MODES = {"echo": echo, "where": where, "fail_one": fail_one, "kill_self": kill_self, "hang_with_child": hang_with_child,
         "late_line": late_line, "topology": topology, "tf_startup": tf_startup, "engine_flags": engine_flags}

if __name__ == "__main__":
    MODES[sys.argv[1]](sys.argv[2] if len(sys.argv) > 2 else "")
