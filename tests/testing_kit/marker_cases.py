"""pytest functions marked to run on several ranks (run by tests/test_testing_kit.py)."""

import time

import pytest
import tensorflow as tf

import smdist_tf as sd

RAN_HERE = []  # the tests of this job's settings that ran in this process before


@pytest.mark.distributed(np=2)
def test_allreduce_sum():
    assert sd.size() == 2
    out = sd.allreduce(tf.constant([float(sd.rank() + 1)]), op=sd.Sum, name="kit.marker.sum")
    assert out.numpy().tolist() == [3.0]
    RAN_HERE.append("test_allreduce_sum")


# docs/testing.md's example runs marked functions at 4 ranks.
@pytest.mark.distributed(np=2, env={"KIT_FLAG": "on"})
@pytest.mark.parametrize("root", [0, 1])
def test_broadcast_parametrized(root):
    import os

    assert os.environ["KIT_FLAG"] == "on"
    out = sd.broadcast(tf.constant([float(sd.rank())]), root_rank=root, name=f"kit.marker.bcast.{root}")
    assert out.numpy().tolist() == [float(root)]


@pytest.mark.distributed(np=2)
def test_fails_on_rank_one(tmp_path):
    assert sd.rank() == 0, f"rank {sd.rank()} was not meant to get here"


@pytest.mark.distributed(np=2)
def test_shares_the_job_of_the_earlier_tests_with_its_settings():
    # test_allreduce_sum ran in this process: marked tests of a module asking the same share one job.
    assert sd.allreduce(tf.constant([1.0]), op=sd.Sum, name="kit.marker.sum").numpy().tolist() == [2.0]
    assert RAN_HERE == ["test_allreduce_sum"], RAN_HERE


@pytest.mark.distributed(np=2, timeout=8)
def test_hangs_on_rank_one():
    if sd.rank() == 1:
        time.sleep(120)  # its watchdog ends it after 8 s, and with it the job


@pytest.mark.distributed(np=2, timeout=8)
def test_after_the_hang_in_the_same_job():
    pass
