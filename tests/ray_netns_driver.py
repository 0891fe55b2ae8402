"""The driver of tests/test_ray_cluster.py's two-host test: run inside the network namespace "hosta".

``python tests/ray_netns_driver.py ADDRESS`` joins the Ray cluster at ADDRESS (head on hosta, a worker
node on hostb), waits for both nodes, runs ``topology_and_sum`` on one rank per host and prints
``RESULT <json>`` per rank and ``ACTORS <json>`` (each rank's actor's host name).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import ray  # noqa: E402

from smdist_tf.ray import RayExecutor  # noqa: E402
from tests import ray_rank_fns as fns  # noqa: E402

ray.init(address=sys.argv[1], log_to_driver=False)
deadline = time.monotonic() + 60
while len([n for n in ray.nodes() if n["Alive"]]) < 2:
    if time.monotonic() > deadline:
        sys.exit("the worker node on hostb did not join")
    time.sleep(0.2)
executor = RayExecutor(RayExecutor.create_settings(timeout_s=60), num_hosts=2, num_workers_per_host=1)
executor.start()
try:
    print("ACTORS", json.dumps([n["hostname"] for n in executor._nodes]), flush=True)
    for result in executor.run(fns.topology_and_sum):
        print("RESULT", json.dumps(result), flush=True)
finally:
    executor.shutdown()
