"""Sharding (ZeRO stage 1, 2 with ``--stage 2``, 3 with ``--stage 3``): memory and step time against unsharded.

For each rank count, each repeat runs two ``mpirun`` jobs, one per mode, in alternating
order (unsharded first in even repeats, sharded first in odd ones) so the machine's drift
hits both alike:

* ``unsharded``: ``smdist_tf.DataParallelStrategy()``;
* ``sharded``: ``smdist_tf.DataParallelStrategy(shard_optimizer_state=True)``, with
  ``shard_gradients=True`` too under ``--stage 2``; under ``--stage 3``
  ``DataParallelStrategy(shard_parameters=True)``, and each round also runs ``stage1``,
  ``stage2`` and ``stage3_overlap`` (stage 3 with ``ParameterSharding(overlap_backward=True)``:
  each layer's backward overlaps the next one's) jobs (five modes, rotated from round to round),
  so stage 3 is compared with stages 0, 1 and 2, and with its faster, larger variant, in one
  interleaved run.

Both train the same dense MLP (29.4 M float32 parameters, 235 MB of Adam state) with Keras
``fit`` and Adam, one TensorFlow intra-op and one inter-op thread per process. Every rank
reports its optimizer-state bytes (``model.optimizer.variables``), its peak resident memory
(``ru_maxrss``, after training; it only grows, hence one job per configuration), TensorFlow's
allocator pool (``tf.config.experimental.get_memory_info``: bytes in use between steps, after
the warm-up, and the timed steps' peak) and the median of its timed step times; each job's
line takes the largest over the ranks.

    python benchmarks/sharded.py [--np 2,4] [--repeat 2] [--stage 1] [--quick] [--timeout 600]

Prints one JSON line per job and then one ``"summary": true`` line per rank count with
the issue's three targets (see benchmarks/README.md). Run it directly, not under mpirun.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Optional

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = Path(__file__).resolve()
MODES = ("unsharded", "sharded")
STAGE3_MODES = ("unsharded", "stage1", "stage2", "sharded", "stage3_overlap")  # "sharded" is stage 3 there

# Dense MLP shapes: (full run, --quick). Full: 7 x (2048 x 2048 + 2048) + 2048 x 10 + 10 parameters.
MODEL_SPECS = ({"inputs": 2048, "width": 2048, "layers": 7, "classes": 10},
               {"inputs": 64, "width": 64, "layers": 2, "classes": 10})

STATE_SLACK = 0.05  # state per rank <= 1/N + 5 % of unsharded
STEP_TIME_LIMIT = 1.10  # sharded step <= 1.10 x unsharded
RSS_SHARE_OF_STATE = 0.40  # peak RSS down by >= 40 % of the state saved
STAGE3_STEP_TIME_LIMIT = 1.30  # issue 42: stage-3 step <= 1.3 x unsharded


def model_spec(quick: bool) -> dict:
    return MODEL_SPECS[1 if quick else 0]


def parameter_count(spec: dict) -> int:
    width, layers = spec["width"], spec["layers"]
    hidden = (spec["inputs"] * width + width) + (layers - 1) * (width * width + width)
    return hidden + width * spec["classes"] + spec["classes"]


# ---------------------------------------------------------------------------------------------
# Worker side: runs in every rank of a job.


def current_rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


def rss_after_malloc_trim() -> int:
    """Resident bytes after ``malloc_trim(0)`` returns every arena's free pages to the OS."""
    import ctypes

    ctypes.CDLL("libc.so.6").malloc_trim(0)
    return current_rss_bytes()


def variable_bytes(variables: list) -> int:
    """Bytes of ``variables`` from their shapes: reading them (``.numpy()``) would allocate, raising the peak."""
    import numpy as np

    return sum(int(np.prod(v.shape, dtype=np.int64)) * np.dtype(v.dtype).itemsize for v in variables)


def held_bytes(variables: list) -> int:
    """Bytes ``variables`` hold on this rank: a stage-3 weight holds its piece only."""
    from smdist_tf.sharding.piece_optimizer import sharded_parameter

    total = 0
    for variable in variables:
        parameter = sharded_parameter(variable)
        if parameter is None:
            total += variable_bytes([variable])
        else:  # the piece is a tf.Variable: its dtype is a tf.DType
            total += int(parameter.piece.shape.num_elements()) * parameter.piece.dtype.size
    return total


def strategy_options(mode: str, stage: int) -> dict:
    """``DataParallelStrategy`` keywords of a job's mode."""
    if mode == "unsharded":
        return {}
    if mode == "stage1" or (mode == "sharded" and stage == 1):
        return {"shard_optimizer_state": True}
    if mode == "stage2" or stage == 2:
        return {"shard_optimizer_state": True, "shard_gradients": True}
    if mode == "stage3_overlap":
        import smdist_tf as sd

        return {"shard_parameters": sd.sharding.ParameterSharding(overlap_backward=True)}
    return {"shard_parameters": True}


def worker(args: argparse.Namespace) -> None:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    # One thread each, so N processes share the cores alike in both modes.
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    import keras
    import numpy as np

    import smdist_tf as sd

    spec = model_spec(args.quick)
    strategy = sd.DataParallelStrategy(**strategy_options(args.worker, args.stage))
    keras.utils.set_random_seed(0)
    with strategy.scope():
        layers = [keras.Input((spec["inputs"],))]
        layers += [keras.layers.Dense(spec["width"], activation="relu") for _ in range(spec["layers"])]
        model = keras.Sequential(layers + [keras.layers.Dense(spec["classes"])])
        model.compile(optimizer=keras.optimizers.Adam(1e-4),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), jit_compile=False)

    global_batch = args.batch * sd.size()  # fit takes the global batch; each rank gets args.batch
    rng = np.random.default_rng(0)
    x = rng.normal(size=(4 * global_batch, spec["inputs"])).astype(np.float32)
    y = rng.integers(0, spec["classes"], size=(4 * global_batch,)).astype(np.int64)
    data = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(global_batch, drop_remainder=True)

    class StepTimer(keras.callbacks.Callback):
        """Seconds of each batch. Not async-safe, so Keras turns the logs into floats first: the step has finished."""

        def __init__(self) -> None:
            super().__init__()
            self.seconds: list[float] = []
            self.start = 0.0
            self.pool_between_steps = 0

        def on_train_batch_begin(self, batch: int, logs: Optional[dict] = None) -> None:
            if batch == args.warmup:  # the timed steps' peak, from what the warm-up left in use
                tf.config.experimental.reset_memory_stats("CPU:0")
                self.pool_between_steps = tf.config.experimental.get_memory_info("CPU:0")["current"]
            self.start = time.perf_counter()

        def on_train_batch_end(self, batch: int, logs: Optional[dict] = None) -> None:
            self.seconds.append(time.perf_counter() - self.start)

    rss_before_fit, peak_before_fit = current_rss_bytes(), peak_rss_bytes()
    timer = StepTimer()
    sd.barrier()
    model.fit(data, epochs=1, steps_per_epoch=args.warmup + args.steps, verbose=0, callbacks=[timer])
    peak = peak_rss_bytes()  # before anything else allocates
    pool_peak = tf.config.experimental.get_memory_info("CPU:0")["peak"]
    timed = timer.seconds[args.warmup:]
    sharded = sd.sharding.sharded_optimizers(model)
    record = {
        "rank": sd.rank(),
        "state_bytes": variable_bytes(model.optimizer.variables),
        # The weights as this rank holds them between steps (stage 3: its pieces); the largest layer's in full.
        "param_bytes": held_bytes(model.trainable_variables),
        "largest_layer_bytes": max(variable_bytes(layer.trainable_variables) for layer in model.layers),
        # The sharded update's copies of this rank's pieces of the weights (kept between steps): memory the
        # sharded mode adds that optimizer.variables does not list. Read from the optimizer, not derived, so it
        # reports what exists.
        "shard_copy_bytes": sum(variable_bytes(o._smdist_shards.shards) for o in sharded),
        "peak_rss_bytes": peak,
        # TensorFlow's allocator pool (chunks handed out, so a request's rounding up counts).
        "pool_between_steps_bytes": timer.pool_between_steps,
        "pool_step_peak_bytes": pool_peak,
        "peak_rss_before_fit_bytes": peak_before_fit,
        "rss_before_fit_bytes": rss_before_fit,
        "rss_end_bytes": current_rss_bytes(),
        # Resident once glibc hands back its free pages: the rest of rss_end is not glibc's slack (TensorFlow's
        # BFC pool keeps its own pages; see benchmarks/README.md, "What the resident memory is").
        "rss_end_after_malloc_trim_bytes": rss_after_malloc_trim(),
        "step_s": round(statistics.median(timed), 6),
        "step_s_min": round(min(timed), 6),
        "optimizer_class": type(model.optimizer).__name__,  # the sharded class keeps its base's name
        "sharded": bool(sharded) or args.worker != "unsharded",
    }
    every = sd.allgather_object(record)
    if sd.rank() == 0:
        print("RESULT " + json.dumps({"ranks": every, "params": model.count_params()}), flush=True)


# ---------------------------------------------------------------------------------------------
# Driver side.


def emit(record: dict) -> None:
    print(json.dumps(record), flush=True)


def job_env() -> dict:
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", PYTHONUNBUFFERED="1",
               OMP_NUM_THREADS="1", TF_CPP_MIN_LOG_LEVEL=os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2"),
               PYTHONPATH=os.pathsep.join(p for p in [str(ROOT), os.environ.get("PYTHONPATH", "")] if p))
    env.pop("TF_CONFIG", None)
    return env


def mpirun() -> str:
    local = Path(sys.executable).parent / "mpirun"
    return str(local) if local.exists() else (shutil.which("mpirun") or "mpirun")


def run_job(args: argparse.Namespace, mode: str, np_: int) -> tuple[Optional[dict], Optional[str], float]:
    """One ``mpirun`` job; returns (rank 0's RESULT payload, error text, wall seconds)."""
    from smdist_tf.run.session_dir import BASE_VARIABLE, private_session_base  # imports no TensorFlow

    cmd = [mpirun(), "-np", str(np_), "--oversubscribe", "--bind-to", "none", sys.executable, str(SCRIPT),
           "--worker", mode, "--batch", str(args.batch), "--steps", str(args.steps), "--warmup", str(args.warmup),
           "--stage", str(args.stage)]
    cmd += ["--quick"] if args.quick else []
    start = time.monotonic()
    # A private PMIx session directory: a killed job's leftovers cannot break the next one.
    with private_session_base(BASE_VARIABLE, job_env()) as env:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True)
        try:
            out, _ = proc.communicate(timeout=args.timeout)
            error = None if proc.returncode == 0 else f"exit {proc.returncode}"
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
            error = f"timed out after {args.timeout:g} s"
    wall = time.monotonic() - start
    found = [json.loads(m.group(1)) for m in re.finditer(r"RESULT (\{.*\})", out)]
    if error is None and not found:
        error = "no result"
    if error is not None:
        return None, f"{error}: {out[-3000:]}", wall
    return found[0], None, wall


def job_line(mode: str, np_: int, repeat: int, payload: dict, wall: float) -> dict:
    """A job's figures: for each, the largest over its ranks."""
    ranks = sorted(payload["ranks"], key=lambda r: r["rank"])
    top = {k: max(r[k] for r in ranks) for k in ("state_bytes", "param_bytes", "largest_layer_bytes",
                                                  "shard_copy_bytes", "peak_rss_bytes", "pool_between_steps_bytes",
                                                  "pool_step_peak_bytes",
                                                  "peak_rss_before_fit_bytes", "rss_before_fit_bytes",
                                                  "rss_end_bytes", "rss_end_after_malloc_trim_bytes", "step_s",
                                                  "step_s_min")}
    return {"mode": mode, "np": np_, "repeat": repeat, "params": payload["params"],
            "optimizer": ranks[0]["optimizer_class"], "sharded": all(r["sharded"] for r in ranks), **top,
            "peak_rss_growth_in_fit_bytes": max(r["peak_rss_bytes"] - r["peak_rss_before_fit_bytes"] for r in ranks),
            "per_rank_peak_rss_bytes": [r["peak_rss_bytes"] for r in ranks],
            "per_rank_state_bytes": [r["state_bytes"] for r in ranks],
            "job_wall_s": round(wall, 1)}


def median_of(lines: list, key: str) -> Optional[float]:
    """The median of ``key`` over ``lines``; bytes as whole numbers."""
    values = [line[key] for line in lines]
    if not values:
        return None
    value = statistics.median(values)
    return int(value) if key.endswith("_bytes") else round(value, 6)


def ratio(a: Optional[float], b: Optional[float]) -> Optional[float]:
    return None if a is None or not b else round(a / b, 4)


def summarize(np_: int, lines: list, errors: list, args: argparse.Namespace) -> dict:
    """The issue's three targets at ``np_``, from the medians over repeats of each mode's job lines."""
    by_mode = {m: [line for line in lines if line["mode"] == m and line["np"] == np_] for m in MODES}
    med = {m: {k: median_of(by_mode[m], k) for k in ("state_bytes", "peak_rss_bytes", "step_s",
                                                       "peak_rss_growth_in_fit_bytes")} for m in MODES}
    base, shard = med["unsharded"], med["sharded"]
    state_ratio = ratio(shard["state_bytes"], base["state_bytes"])
    step_ratio = ratio(shard["step_s"], base["step_s"])
    measured = all(by_mode[m] for m in MODES)
    state_saved = base["state_bytes"] - shard["state_bytes"] if measured else None
    rss_saved = base["peak_rss_bytes"] - shard["peak_rss_bytes"] if measured else None
    rss_fraction = ratio(rss_saved, state_saved)
    state_target = round(1 / np_ + STATE_SLACK, 4)

    return {
        "summary": True, "np": np_, "stage": args.stage, "repeats": len(by_mode["sharded"]),
        "state_bytes_unsharded": base["state_bytes"], "state_bytes_sharded": shard["state_bytes"],
        "state_bytes_ratio": state_ratio, "state_bytes_ratio_target": state_target,
        "step_s_unsharded": base["step_s"], "step_s_sharded": shard["step_s"],
        "step_time_ratio": step_ratio, "step_time_ratio_target": STEP_TIME_LIMIT,
        "peak_rss_bytes_unsharded": base["peak_rss_bytes"], "peak_rss_bytes_sharded": shard["peak_rss_bytes"],
        "rss_saved_bytes": rss_saved, "state_saved_bytes": state_saved,
        "rss_saved_fraction_of_state_saved": rss_fraction,
        "rss_saved_fraction_of_state_saved_target": RSS_SHARE_OF_STATE,
        # The same, counting only what fit added to the peak (TF import and model set-up left out).
        "rss_growth_in_fit_saved_bytes": (base["peak_rss_growth_in_fit_bytes"] - shard["peak_rss_growth_in_fit_bytes"]
                                          if measured else None),
        "target_state_bytes_met": None if state_ratio is None else state_ratio <= state_target,
        "target_step_time_met": None if step_ratio is None else step_ratio <= STEP_TIME_LIMIT,
        "target_rss_met": None if rss_fraction is None else rss_fraction >= RSS_SHARE_OF_STATE,
        "params": parameter_count(model_spec(args.quick)), "batch_per_rank": args.batch,
        "warmup": args.warmup, "steps": args.steps, "quick": args.quick,
        "errors": [e for e in errors if e.startswith(f"np={np_} ")],
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }


def summarize_stage3(np_: int, lines: list, errors: list, args: argparse.Namespace) -> dict:
    """Stage 3 against stages 0-2 at ``np_``, with issue 42's two goals, from each mode's medians over repeats.

    Memory goal: this rank's peak <= (stage 0's parameter + gradient + state bytes) / N plus
    the largest layer. Judged on the peak of TensorFlow's allocator pool during the timed
    steps (everything the step allocates: pieces, gathered weights, gradients, activations,
    the optimizer's temporaries), and on the model's own bytes from the variables (weights
    held, optimizer state, a gradient the size of the weights). Peak RSS is reported beside
    them; it also holds TensorFlow's runtime.
    """
    keys = ("state_bytes", "param_bytes", "largest_layer_bytes", "peak_rss_bytes", "peak_rss_growth_in_fit_bytes",
            "pool_between_steps_bytes", "pool_step_peak_bytes", "step_s")
    med = {m: {k: median_of([line for line in lines if line["mode"] == m and line["np"] == np_], k) for k in keys}
           for m in STAGE3_MODES}
    base, stage3 = med["unsharded"], med["sharded"]
    model_bytes = {m: None if med[m]["param_bytes"] is None else 2 * med[m]["param_bytes"] + med[m]["state_bytes"]
                   for m in STAGE3_MODES}  # weights, a gradient of their size, optimizer state
    goal = None if model_bytes["unsharded"] is None else int(model_bytes["unsharded"] / np_ + base["largest_layer_bytes"])
    step_ratio = ratio(stage3["step_s"], base["step_s"])
    return {
        "summary": True, "np": np_, "stage": 3,
        "repeats": len([line for line in lines if line["mode"] == "sharded" and line["np"] == np_]),
        "step_s": {m: med[m]["step_s"] for m in STAGE3_MODES},
        "step_time_ratio_vs_unsharded": {m: ratio(med[m]["step_s"], base["step_s"]) for m in STAGE3_MODES},
        "step_time_ratio_target": STAGE3_STEP_TIME_LIMIT,
        # Above 1 when overlapping each layer's backward with the next one's made the stage-3 step faster.
        "overlap_backward_speedup": ratio(stage3["step_s"], med["stage3_overlap"]["step_s"]),
        "param_bytes": {m: med[m]["param_bytes"] for m in STAGE3_MODES},
        "state_bytes": {m: med[m]["state_bytes"] for m in STAGE3_MODES},
        "model_bytes_params_grads_state": model_bytes,
        "model_bytes_goal": goal,
        "peak_rss_bytes": {m: med[m]["peak_rss_bytes"] for m in STAGE3_MODES},
        "peak_rss_growth_in_fit_bytes": {m: med[m]["peak_rss_growth_in_fit_bytes"] for m in STAGE3_MODES},
        "pool_between_steps_bytes": {m: med[m]["pool_between_steps_bytes"] for m in STAGE3_MODES},
        "pool_step_peak_bytes": {m: med[m]["pool_step_peak_bytes"] for m in STAGE3_MODES},
        "target_pool_step_peak_met": None if goal is None or stage3["pool_step_peak_bytes"] is None
        else stage3["pool_step_peak_bytes"] <= goal,
        "target_model_bytes_met": None if goal is None or model_bytes["sharded"] is None
        else model_bytes["sharded"] <= goal,
        "target_step_time_met": None if step_ratio is None else step_ratio <= STAGE3_STEP_TIME_LIMIT,
        "params": parameter_count(model_spec(args.quick)), "batch_per_rank": args.batch,
        "warmup": args.warmup, "steps": args.steps, "quick": args.quick,
        "errors": [e for e in errors if e.startswith(f"np={np_} ")],
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }


def parse_args(argv: Optional[list] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--np", default=None, help="comma-separated rank counts (default 2,4; --quick: 2)")
    parser.add_argument("--repeat", type=int, default=None, help="rounds of (unsharded, sharded) (default 2; --quick: 1)")
    parser.add_argument("--batch", type=int, default=16, help="per rank")
    parser.add_argument("--steps", type=int, default=None, help="timed steps per job (default 8; --quick 2)")
    parser.add_argument("--warmup", type=int, default=None, help="untimed steps first (default 3; --quick 1)")
    parser.add_argument("--timeout", type=float, default=600, help="seconds per job; its process group is killed past it")
    parser.add_argument("--stage", type=int, choices=(1, 2, 3), default=1,
                        help="ZeRO stage of the sharded jobs (2: shard_gradients=True as well; 3: shard_parameters=True, "
                             "against stages 0, 1 and 2)")
    parser.add_argument("--quick", action="store_true", help="tiny model, np 2, 1 repeat, few steps: a smoke run")
    parser.add_argument("--worker", choices=STAGE3_MODES, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.np = [int(n) for n in (args.np or ("2" if args.quick else "2,4")).split(",")]
    args.repeat = args.repeat or (1 if args.quick else 2)
    args.steps = args.steps or (2 if args.quick else 8)
    args.warmup = args.warmup if args.warmup is not None else (1 if args.quick else 3)
    return args


def main() -> int:
    args = parse_args()
    if args.worker:
        worker(args)
        return 0
    if "OMPI_COMM_WORLD_SIZE" in os.environ or "PMI_RANK" in os.environ:
        sys.exit("run benchmarks/sharded.py directly, not under mpirun: it launches its own jobs")
    lines: list[dict[str, Any]] = []
    errors: list[str] = []
    modes = STAGE3_MODES if args.stage == 3 else MODES
    for np_ in args.np:
        for repeat in range(args.repeat):
            # Each round starts with another mode, so the machine's drift hits all alike.
            for mode in modes[repeat % len(modes):] + modes[:repeat % len(modes)]:
                payload, error, wall = run_job(args, mode, np_)
                if error is not None:
                    last = [line for line in error.splitlines() if line.strip()][-1]
                    errors.append(f"np={np_} {mode} repeat={repeat}: {error.split(':')[0]}: {last[:200]}")
                    emit({"mode": mode, "np": np_, "repeat": repeat, "error": error})
                    continue
                line = job_line(mode, np_, repeat, payload, wall)
                lines.append(line)
                emit(line)
        emit(summarize_stage3(np_, lines, errors, args) if args.stage == 3 else summarize(np_, lines, errors, args))
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
