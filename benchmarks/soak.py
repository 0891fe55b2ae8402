"""Soak: mixed collectives for a long time, resources sampled every interval, all flat after warm-up.

    smdistrun -np 4 python benchmarks/soak.py --minutes 30

Every rank runs the same seeded random mix of allreduce (every reduce op, fused
groups, fp16 compression), allgather, broadcast, alltoall, reducescatter and
barrier, on tensors of 4 B to 64 MiB, named from a pool of fixed names and with
ever new names (so the response cache keeps evicting), eagerly and inside a
tf.function. Results are checked against their known values as it goes.

Every --sample-seconds each rank reports its resident memory, open file
descriptors and threads, and rank 0 the bytes and files in /dev/shm. Rank 0
prints one JSON line per sample (``"kind": "sample"``, the maximum over ranks)
and a summary (``"kind": "summary"``): each resource's growth from the first
sample after --warmup-minutes to the last and over the second half of that
span, and the calls and bytes moved.
"""

from __future__ import annotations

import argparse
import json
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import smdist_tf as sd  # noqa: E402

SIZES = [1, 16, 1024, 65536, 1 << 20, 4 << 20, 16 << 20]  # float32 elements: 4 B to 64 MiB
# Large tensors are rare, as in training: they dominate the time otherwise.
SIZE_WEIGHTS = np.array([30, 30, 20, 10, 6, 3, 1], float)


def resources() -> dict:
    """This process's resident MiB, open descriptors and threads."""
    with open("/proc/self/statm") as f:
        rss = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    return {"rss_mib": rss, "fds": len(os.listdir("/proc/self/fd")), "threads": len(os.listdir("/proc/self/task"))}


def dev_shm() -> dict:
    entries = [os.path.join("/dev/shm", n) for n in os.listdir("/dev/shm")]
    sizes = [os.stat(p).st_size for p in entries if os.path.isfile(p)]
    return {"shm_files": len(sizes), "shm_mib": sum(sizes) / 2**20}


@tf.function(reduce_retracing=True)
def traced_step(x: tf.Tensor) -> tf.Tensor:
    y = sd.allreduce(x, op=sd.Sum, name="soak.traced.sum")
    return sd.allreduce(y, op=sd.Max, name="soak.traced.max")


class Mix:
    """One rank's share of the random mix; every rank draws the same sequence."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.rank, self.size = sd.rank(), sd.size()
        self.calls = 0
        self.bytes = 0
        self.fresh = 0

    def name(self, kind: str) -> str:
        if self.rng.random() < 0.3:  # a name never seen before
            self.fresh += 1
            return f"soak.{kind}.fresh.{self.fresh}"
        return f"soak.{kind}.{int(self.rng.integers(0, 64))}"

    def elements(self) -> int:
        return int(self.rng.choice(SIZES, p=SIZE_WEIGHTS / SIZE_WEIGHTS.sum()))

    def step(self) -> None:
        kind = self.rng.choice(["allreduce", "group", "fp16", "allgather", "broadcast", "alltoall",
                                "reducescatter", "barrier", "traced"])
        n = self.elements()
        getattr(self, f"_{kind}")(n)
        self.calls += 1
        self.bytes += 4 * n

    def _allreduce(self, n: int) -> None:
        op = self.rng.choice([sd.Sum, sd.Average, sd.Min, sd.Max])
        out = sd.allreduce(tf.fill([n], float(self.rank + 1)), op=op, name=self.name("allreduce"))
        want = {sd.Sum: self.size * (self.size + 1) / 2, sd.Average: (self.size + 1) / 2, sd.Min: 1.0,
                sd.Max: float(self.size)}[op]
        check(out, want)

    def _group(self, n: int) -> None:
        count = int(self.rng.integers(2, 40))
        per = max(1, n // count)
        outs = sd.grouped_allreduce([tf.fill([per], float(i)) for i in range(count)], op=sd.Sum, name=self.name("group"))
        check(outs[-1], float((count - 1) * self.size))

    def _fp16(self, n: int) -> None:
        out = sd.allreduce(tf.ones([n]), op=sd.Sum, compression=sd.Compression.fp16, name=self.name("fp16"))
        check(out, float(self.size))

    def _allgather(self, n: int) -> None:
        rows = max(1, n // (16 * self.size))
        out = sd.allgather(tf.fill([rows + self.rank, 16], float(self.rank)), name=self.name("allgather"))
        if out.shape[0] != sum(rows + r for r in range(self.size)):
            raise AssertionError(f"allgather returned {out.shape[0]} rows")

    def _broadcast(self, n: int) -> None:
        root = int(self.rng.integers(0, self.size))
        check(sd.broadcast(tf.fill([n], float(self.rank)), root, name=self.name("broadcast")), float(root))

    def _alltoall(self, n: int) -> None:
        rows = max(1, n // self.size)
        out = sd.alltoall(tf.fill([rows * self.size], float(self.rank)), name=self.name("alltoall"))
        check(out[:rows], 0.0)

    def _reducescatter(self, n: int) -> None:
        rows = max(self.size, n // self.size * self.size)
        check(sd.reducescatter(tf.ones([rows]), op=sd.Sum, name=self.name("reducescatter")), float(self.size))

    def _barrier(self, n: int) -> None:
        sd.barrier(name=self.name("barrier"))

    def _traced(self, n: int) -> None:
        check(traced_step(tf.ones([min(n, 1 << 18)])), float(self.size))


def check(tensor: tf.Tensor, value: float) -> None:
    got = tensor.numpy()
    if not np.allclose(got, value, rtol=1e-3):
        raise AssertionError(f"expected {value}, got {got.ravel()[:4]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--sample-seconds", type=float, default=60.0)
    parser.add_argument("--warmup-minutes", type=float, default=3.0)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    sd.init()
    mix = Mix(args.seed)
    start = time.monotonic()
    samples = []
    next_sample = start
    while True:
        now = time.monotonic()
        # Every rank takes the same decision (rank 0's clock): they must sample together.
        sample_now, done = sd.broadcast_object((now >= next_sample, now - start >= args.minutes * 60), 0)
        if sample_now or done:
            mine = resources()
            per_rank = sd.allgather_object(mine)
            if sd.rank() == 0:
                sample = {"kind": "sample", "minute": round((now - start) / 60, 2), "calls": mix.calls,
                          "gib_moved": round(mix.bytes / 2**30, 2)}
                for key in mine:
                    sample[key] = max(r[key] for r in per_rank)
                sample.update(dev_shm())
                samples.append(sample)
                print(json.dumps(sample), flush=True)
            next_sample = now + args.sample_seconds
        if done:
            break
        for _ in range(20):
            mix.step()
    if sd.rank() == 0:
        steady = [s for s in samples if s["minute"] >= args.warmup_minutes] or samples[-1:]
        first, last = steady[0], samples[-1]
        summary = {"kind": "summary", "np": sd.size(), "minutes": round(last["minute"], 2), "calls": mix.calls,
                   "gib_moved": round(mix.bytes / 2**30, 2), "fresh_names": mix.fresh,
                   "from_minute": first["minute"]}
        # The second half tells a leak (still growing) from a slow warm-up (pools filling).
        middle = steady[len(steady) // 2]
        summary["second_half_from_minute"] = middle["minute"]
        for key in ["rss_mib", "fds", "threads", "shm_files", "shm_mib"]:
            summary[f"{key}_growth"] = round(last[key] - first[key], 2)
            summary[f"{key}_growth_second_half"] = round(last[key] - middle[key], 2)
            summary[f"{key}_max"] = max(s[key] for s in steady)
        print(json.dumps(summary), flush=True)


if __name__ == "__main__":
    main()
