"""Process sets at once: overlapping sets, disjoint sets working concurrently, and the timeline of both.

Run on every rank by tests/test_process_sets_multiprocess.py, in one job with the other suite_process_sets*.py;
tests/mp/process_set_setup.py registers the sets they share (even, odd, low, high, top, solo at 4 ranks).
"""

from __future__ import annotations

import json
import os
import tempfile
import threading
import time

import numpy as np
import tensorflow as tf

import smdist_tf as sd
from tests.mp.process_set_setup import DISJOINT, my_sets

RANK, SIZE = sd.rank(), sd.size()
HANG_S = 90  # a test still running after this is hung (each takes seconds): end the job with the stack instead
SLOW_S = 2.0  # how long the members of one set stay away while another set works


class OverlappingSetsTest(tf.test.TestCase):
    def test_every_set_and_the_global_set_in_one_tf_function(self):
        mine = my_sets()

        # Named: each rank traces a graph of its own sets, and an unnamed op in a graph goes by its node
        # name ("SmdistAllreduce_2"), which differs between graphs of different sizes.
        @tf.function
        def step(x):
            per_set = [sd.allreduce(x * float(ps.process_set_id), op=sd.Sum, name=f"ps.step.{ps.process_set_id}",
                                    process_set=ps) for ps in mine]
            gathered = [sd.allgather(tf.reshape(x[:1], [1]), name=f"ps.step.gather.{ps.process_set_id}", process_set=ps)
                        for ps in mine]
            return per_set, gathered, sd.allreduce(x, op=sd.Sum, name="ps.step.global")

        for _ in range(2):
            per_set, gathered, everyone = step(tf.fill([3], float(RANK + 1)))
            for ps, out, got in zip(mine, per_set, gathered):
                self.assertAllClose(out, [ps.process_set_id * sum(r + 1 for r in ps.ranks)] * 3)
                self.assertAllClose(got, [r + 1 for r in ps.ranks])
            self.assertAllClose(everyone, [SIZE * (SIZE + 1) / 2] * 3)

    def test_every_set_from_its_own_thread_while_the_main_thread_runs_global_collectives(self):
        # At 4 ranks rank 1 runs odd, low and high at the same time, rank 3 odd, high, top and solo.
        rounds = 5
        results, errors = {}, []

        def work(ps):
            try:
                for k in range(rounds):
                    x = tf.fill([1000], float(RANK + k))
                    results[(ps.process_set_id, k)] = (
                        sd.allreduce(x, op=sd.Sum, name=f"ps.thread.{k}", process_set=ps).numpy(),
                        sd.allgather(tf.constant([RANK]), name=f"ps.thread.gather.{k}", process_set=ps).numpy(),
                    )
            except Exception as e:  # reported below, on the main thread
                errors.append(e)

        threads = [threading.Thread(target=work, args=(ps,)) for ps in my_sets()]
        for t in threads:
            t.start()
        for k in range(rounds):
            self.assertAllClose(sd.allreduce(tf.constant([float(k)]), op=sd.Sum, name=f"ps.main.{k}"), [SIZE * k])
        for t in threads:
            t.join(timeout=60)
        self.assertEqual(errors, [])
        for ps in my_sets():
            for k in range(rounds):
                summed, gathered = results[(ps.process_set_id, k)]
                self.assertAllClose(summed, np.full([1000], sum(r + k for r in ps.ranks)))
                self.assertAllEqual(gathered, ps.ranks)


class ConcurrentSetsTest(tf.test.TestCase):
    def test_disjoint_sets_run_large_allreduces_at_the_same_time(self):
        n = 1 << 20  # 4 MiB
        sd.barrier()
        ps = DISJOINT[0] if DISJOINT[0].included() else DISJOINT[1]
        loop = tf.function(lambda x, ps=ps: sd.allreduce(sd.allreduce(x, op=sd.Sum, process_set=ps), op=sd.Average,
                                                         process_set=ps))
        for it in range(4):
            x = tf.fill([n], float(RANK + it))
            total = sum(r + it for r in ps.ranks)
            self.assertAllEqual(sd.allreduce(x, op=sd.Sum, process_set=ps), np.full([n], total, np.float32))
            self.assertAllEqual(loop(x), np.full([n], total, np.float32))
            gathered = sd.allgather(tf.fill([n // 4], float(RANK + it)), process_set=ps).numpy()
            self.assertAllEqual(gathered, np.repeat(np.array([r + it for r in ps.ranks], np.float32), n // 4))
        sd.barrier()

    def test_a_set_does_not_wait_for_another_sets_members(self):
        # The slow set's members come SLOW_S late (at 4 ranks its first member waits inside a
        # collective on it meanwhile): the fast set must be done before any of them comes.
        fast, slow = DISJOINT
        sd.barrier()
        fast_done = slow_came = slow_done = 0.0
        if fast.included():
            for _ in range(3):
                self.assertAllClose(sd.allreduce(tf.constant([float(RANK)]), op=sd.Sum, process_set=fast), [sum(fast.ranks)])
                self.assertAllEqual(sd.allgather(tf.constant([RANK]), process_set=fast), fast.ranks)
                self.assertAllEqual(sd.broadcast(tf.constant([RANK]), fast.ranks[-1], process_set=fast), [fast.ranks[-1]])
                sd.barrier(process_set=fast)
            fast_done = time.time()
        else:
            late = slow.size() == 1 or RANK != slow.ranks[0]
            if late:
                time.sleep(SLOW_S)
                slow_came = time.time()
            self.assertAllEqual(sd.allgather(tf.constant([RANK]), process_set=slow), slow.ranks)
            slow_done = time.time()
        times = sd.allgather(tf.constant([[fast_done, slow_came, slow_done]], tf.float64)).numpy()
        last_fast = max(times[r, 0] for r in fast.ranks)
        first_slow = min(times[r, 1] for r in slow.ranks if times[r, 1] > 0)
        self.assertLess(last_fast, first_slow, f"set {fast.ranks} waited for set {slow.ranks}")
        # The slow set's collective ended only once its last member came: at 4 ranks its first member waited
        # in it. Ordered by one host's clock, not by a duration a descheduled rank would shorten.
        last_slow = max(times[r, 1] for r in slow.ranks)
        for r in slow.ranks:
            self.assertGreaterEqual(times[r, 2], last_slow, f"rank {r}'s allgather ended before its set was there")


class TimelineTest(tf.test.TestCase):
    def test_set_events_name_their_process_set(self):
        template = os.path.join(tempfile.mkdtemp(), "timeline.{rank}.json")
        sd.start_timeline(template)
        for ps in my_sets():
            sd.allgather(tf.ones([2]), name=f"ps.timeline.gather.{ps.process_set_id}", process_set=ps)
            if ps.size() > 1:  # a one-rank allreduce never reaches the engine
                sd.allreduce(tf.ones([3]), op=sd.Sum, name=f"ps.timeline.reduce.{ps.process_set_id}", process_set=ps)
        sd.allreduce(tf.ones([3]), op=sd.Sum, name="ps.timeline.global")
        sd.stop_timeline()
        with open(template.format(rank=RANK)) as f:
            events = json.load(f)
        rows = {e["tid"]: e["args"]["name"] for e in events if e["ph"] == "M"}
        spans = [e for e in events if e["ph"] == "X"]
        for ps in my_sets():
            pid = ps.process_set_id
            names = [f"ps.timeline.gather.{pid}"] + ([f"ps.timeline.reduce.{pid}"] if ps.size() > 1 else [])
            for name in names:
                label = f"{name} [process set {pid}]"
                mine = [e for e in spans if rows[e["tid"]] == label]
                self.assertTrue(mine, f"no events in row {label!r}; rows: {sorted(rows.values())}")
                self.assertTrue(all(e["args"].get("process_set") == pid for e in mine), mine)
        global_spans = [e for e in spans if rows[e["tid"]] == "ps.timeline.global"]
        self.assertTrue(global_spans)
        self.assertTrue(all("process_set" not in e["args"] for e in global_spans), global_spans)


if __name__ == "__main__":
    tf.test.main()
