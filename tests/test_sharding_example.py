"""examples/keras_sharded.py: Keras fit with sharded optimizer state (ZeRO stages 1 and 2) at 2 ranks."""

import re

import pytest

from tests.mpi_harness import run_under_mpi

NP = 2


@pytest.mark.parametrize("stage", [1, 2])
def test_sharded_keras_example(stage):
    code, out = run_under_mpi(NP, ["examples/keras_sharded.py", "--stage", str(stage), "--epochs", "3"], timeout=300)
    assert code == 0, out[-5000:]
    for rank in range(NP):
        tag = re.escape(f"[rank {rank}]")
        losses = [float(v) for v in re.findall(rf"{tag} epoch +\d+: loss ([\d.]+)", out)]
        assert len(losses) == 3 and losses[-1] < losses[0], f"rank {rank}: {losses}\n{out[-3000:]}"

        memory = re.search(rf"{tag} stage {stage}, {NP} ranks, \d+ parameters \((\d+) bytes, on every rank\): "
                           r"optimizer state (\d+) bytes on this rank, (\d+) bytes unsharded", out)
        assert memory, out[-3000:]
        params, here, full = (int(v) for v in memory.groups())
        slots = 3 if stage == 2 else 2  # Adam's two moments (+ the gradient accumulator with stage 2's accumulation)
        assert full - slots * params < 64, (params, full)  # plus the scalars: iteration, learning rate
        # 1/NP of each variable, rounded up per variable, plus the scalars on every rank.
        assert full / NP <= here < full / NP + 1024, (here, full)

        assert f"[rank {rank}] reloaded model.weights.h5: weights equal True, this rank's optimizer state equal True" in out
        assert f"[rank {rank}] one more epoch from the original and from the reloaded model: identical True" in out
        assert f"[rank {rank}] weights identical across ranks: True" in out
    assert f"all {NP} ranks: {NP} report identical weights and a complete checkpoint" in out, out[-3000:]
