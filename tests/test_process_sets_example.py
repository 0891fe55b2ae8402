"""examples/process_sets.py: two groups of ranks train two models at once, at 2 and 4 ranks."""

import re

import pytest

from tests.mpi_harness import run_under_mpi

pytestmark = pytest.mark.optional_packages  # the example loads scikit-learn's digits


@pytest.mark.parametrize("np,reduce", [(2, "tape"), (4, "tape"), (4, "grouped_allreduce")])
def test_process_sets_example(np, reduce):
    code, out = run_under_mpi(np, ["examples/process_sets.py", "--epochs", "4", "--reduce", reduce], timeout=300)
    assert code == 0, out[-5000:]
    for name, ranks in (("digits", list(range(0, np, 2))), ("regression", list(range(1, np, 2)))):
        losses = [float(v) for v in re.findall(rf"\[{name} group {re.escape(str(ranks))}\] epoch +\d+: loss ([\d.]+)", out)]
        assert len(losses) == 4 and losses[-1] < losses[0], f"{name} group {ranks}: {losses}\n{out[-3000:]}"
        summary = f"[{name} group {ranks}] {len(ranks)} ranks,"
        assert summary in out and "weights identical across the group: True" in out.split(summary, 1)[1].splitlines()[0], out[-3000:]
    assert f"all {np} ranks: {np} report identical weights within their group" in out, out[-3000:]


def test_benchmark_process_set_ratios():
    """benchmarks/allreduce.py --process-set: each set's busbw over the 2-rank job's and the 4-rank job's."""
    import sys

    from tests.doc_blocks import ROOT

    sys.path.insert(0, str(ROOT))
    from benchmarks import allreduce as bench

    args = bench.parse_args(["--process-set", "--sizes", "1M"])
    size = 1 << 20
    recs = [bench.record("smdist_tf", "process_set_baseline", size, "float32", 2, 1.0, 10),
            bench.record("smdist_tf", "process_set_global", size, "float32", 4, 1.0, 10),
            bench.record("smdist_tf", "process_set_concurrent", size, "float32", 2, 2.0, 10, process_set=[0, 1]),
            bench.record("smdist_tf", "process_set_concurrent", size, "float32", 2, 1.25, 10, process_set=[2, 3])]
    figures = bench.measure_pset_ratios(recs, args)
    assert figures["busbw_ratio_set_vs_2rank_job_alone"] == {"0,1": {str(size): 0.5}, "2,3": {str(size): 0.8}}
    # busbw of 4 ranks counts 2*(4-1)/4 = 1.5x the bytes of a 2-rank set
    assert figures["busbw_ratio_set_vs_4rank_job_global"] == {"0,1": {str(size): 0.333}, "2,3": {str(size): 0.533}}
    assert figures["busbw_ratio_set_vs_2rank_job_alone_best_rep"] == {"0,1": {str(size): None}, "2,3": {str(size): None}}
