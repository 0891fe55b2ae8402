"""Data-parallel training throughput against the machine's ceiling (issue #26, item 1).

One run measures, side by side and interleaved per repeat:

* ``ceiling``: N independent processes (no communication) training the same model on the
  same per-process batch, started together; their samples/s summed. This is what N
  processes can do on this machine at all.
* ``smdist_tape``: a custom loop with ``smdist_tf.DistributedGradientTape`` in a tf.function.
* ``smdist_fit_optimizer``: ``smdist_tf.keras.DistributedOptimizer`` + ``model.fit``.
* ``smdist_fit_strategy``: ``smdist_tf.DataParallelStrategy()`` + ``model.fit``.
* ``horovod_tape`` (when ``horovod.tensorflow`` imports): Horovod's tape in the same loop.
* ``mwms``: ``tf.distribute.MultiWorkerMirroredStrategy`` with ``strategy.run`` in a loop.
* ``ceiling_fit`` (only when asked for with ``--systems``): the ceiling with ``model.fit``.

``--bucket-caps 64 4 1`` runs every smdist_tf path once per gradient-bucket size
(``SMDIST_BUCKET_CAP_MB``, in MiB), interleaved, labelled ``smdist_tape[4MiB]`` and so on:
64 MiB (the fusion threshold) is one bucket a step, no overlap.

``--xla`` runs the ceiling and every smdist_tf path twice, interleaved: as above and with XLA
(``jit_compile=True`` for the step, or for ``fit``), labelled ``smdist_tape[xla]`` and so on.
An XLA path's ratio is to the XLA ceiling; the summary adds each path's samples/s with XLA
over without (``xla_over_graph``).

``--autotune`` runs every smdist_tf path twice, interleaved: with the default settings and with
``SMDIST_AUTOTUNE=1`` (labelled ``[autotune]``). Such a job trains until tuning has ended on every
rank before it starts timing, and reports what was chosen. The summary adds each path's samples/s
with autotuning over without (``autotune_over_default``).

Every process runs with one TensorFlow intra-op and one inter-op thread, so N processes
share the cores alike in every system. Weak scaling: the per-process batch is fixed.

    python benchmarks/scaling.py [--np 2 4] [--models mlp conv] [--repeats 3] [--quick]

Prints one JSON line per measurement and a final ``"summary": true`` line (see
benchmarks/README.md, "Scaling"). Run it directly, not under mpirun: it launches the jobs.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

from synthetic import free_ports  # benchmarks/, this script's own directory

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = Path(__file__).resolve()

SMDIST_PATHS = ["smdist_tape", "smdist_fit_optimizer", "smdist_fit_strategy"]
PEERS = ["horovod_tape", "mwms"]
ALL_SYSTEMS = ["ceiling", *SMDIST_PATHS, *PEERS, "ceiling_fit"]
DEFAULT_SYSTEMS = ["ceiling", *SMDIST_PATHS, *PEERS]
GOAL_RATIO = 0.90
BUSBW_ITERS = 5

# Model shapes: (default, --quick).
MODEL_SPECS = {
    "mlp": ({"layers": 24, "width": 512}, {"layers": 2, "width": 64}),
    "conv": ({"filters": [16, 32, 64], "dense": 128}, {"filters": [4], "dense": 16}),
}


# ---------------------------------------------------------------------------------------------
# Worker side: runs inside each benchmark process.


def model_spec(name: str, quick: bool) -> dict:
    return MODEL_SPECS[name][1 if quick else 0]


def build_model(name: str, quick: bool):
    """The benchmark model and a fresh SGD optimizer. Same seed everywhere: every system starts alike."""
    import keras

    keras.utils.set_random_seed(0)
    spec = model_spec(name, quick)
    if name == "mlp":
        layers = [keras.Input((spec["width"],))]
        layers += [keras.layers.Dense(spec["width"], activation="relu") for _ in range(spec["layers"])]
    else:
        layers = [keras.Input((32, 32, 3))]
        for i, filters in enumerate(spec["filters"]):
            layers.append(keras.layers.Conv2D(filters, 3, padding="same", activation="relu"))
            if i > 0 or len(spec["filters"]) == 1:
                layers.append(keras.layers.MaxPooling2D(2))
        layers += [keras.layers.Flatten(), keras.layers.Dense(spec["dense"], activation="relu")]
    model = keras.Sequential(layers + [keras.layers.Dense(10)])
    return model, keras.optimizers.SGD(0.01)


def synthetic_data(name: str, quick: bool, rows: int):
    import numpy as np

    rng = np.random.default_rng(0)
    shape = (rows, model_spec(name, quick)["width"]) if name == "mlp" else (rows, 32, 32, 3)
    return rng.normal(size=shape).astype(np.float32), rng.integers(0, 10, size=(rows,)).astype(np.int64)


def dataset(args: argparse.Namespace, batch: int):
    """An endless in-memory dataset of ``batch``-sized batches (4 distinct batches, repeated)."""
    import tensorflow as tf

    x, y = synthetic_data(args.model, args.quick, 4 * batch)
    return tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(batch, drop_remainder=True).prefetch(2)


def loss_fn():
    import keras

    return keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def one_thread_tf():
    """TensorFlow with one intra-op and one inter-op thread; must run before any TF op."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    return tf


def time_loop(step, iterator, steps: int, warmup: int, before=None) -> float:
    """Seconds per step of ``step(iterator)`` over ``steps`` steps after ``warmup`` untimed ones."""
    for _ in range(warmup):
        step(iterator)
    if before is not None:
        before()
    start = time.perf_counter()
    for _ in range(steps):
        loss = step(iterator)
    float(loss)  # the last step has finished
    return (time.perf_counter() - start) / steps


def file_barrier(directory: str, tag: str, index: int, count: int, limit_s: float, keep_busy=None) -> None:
    """Marks ``tag`` done for ``index`` and waits (running ``keep_busy`` meanwhile) until all ``count`` did."""
    Path(directory, f"{tag}.{index}").touch()
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if all(Path(directory, f"{tag}.{i}").exists() for i in range(count)):
            return
        if keep_busy is not None:
            keep_busy()
        else:
            time.sleep(0.001)


def result(payload: dict) -> None:
    print("RESULT " + json.dumps(payload), flush=True)


def custom_step(model, optimizer, wrap_tape=None, jit_compile: bool = False):
    import tensorflow as tf

    lossf = loss_fn()

    def train(x, y):
        with tf.GradientTape() as tape:
            loss = lossf(y, model(x, training=True))
        if wrap_tape is not None:
            tape = wrap_tape(tape)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    if jit_compile:  # XLA compiles the step; reading the dataset iterator stays outside it
        train = tf.function(train, jit_compile=True)

    @tf.function
    def step(iterator):
        x, y = next(iterator)
        return train(x, y)

    return step


class StepTimer:
    """A Keras callback factory: times ``fit`` from the start of batch ``warmup`` to the end of the epoch."""

    @staticmethod
    def make(warmup: int, before=None):
        import keras

        class _Timer(keras.callbacks.Callback):
            start = end = None

            def on_train_batch_begin(self, batch, logs=None):
                if batch == warmup:
                    if before is not None:
                        before()
                    self.start = time.perf_counter()

            def on_epoch_end(self, epoch, logs=None):
                self.end = time.perf_counter()

        return _Timer()


def finish_autotune(sd, train_a_while) -> Optional[dict]:
    """With SMDIST_AUTOTUNE=1: calls ``train_a_while()`` until tuning has ended on every rank; the choice."""
    if not sd.engine_config()["autotune"]:
        return None
    for _ in range(200):
        if all(sd.allgather_object(sd.engine_config()["autotune_finished"])):
            config = sd.engine_config()
            return {k: config[k] for k in ("fusion_threshold_bytes", "cycle_time_ms", "shm_min_bytes",
                                           "cross_memory_min_bytes")}
        train_a_while()
    raise RuntimeError("autotuning did not finish within 200 rounds of training")


def fit_seconds_per_step(model, data, args: argparse.Namespace, callbacks: list, before=None) -> float:
    timer = StepTimer.make(args.warmup, before)
    model.fit(data, epochs=1, steps_per_epoch=args.warmup + args.steps, verbose=0, callbacks=[*callbacks, timer])
    return (timer.end - timer.start) / args.steps


def worker_ceiling(args: argparse.Namespace) -> None:
    """One of N independent processes. They start timing together and keep training until all are done."""
    one_thread_tf()
    model, optimizer = build_model(args.model, args.quick)
    iterator = iter(dataset(args, args.batch))
    if args.worker == "ceiling_fit":
        model.compile(optimizer=optimizer, loss=loss_fn(), jit_compile=False)
        step_s = fit_seconds_per_step(model, dataset(args, args.batch), args, [],
                                      before=lambda: file_barrier(args.sync_dir, "ready", args.index, args.count, args.timeout))
        step = custom_step(*build_model(args.model, args.quick))  # to keep the cores busy below
    else:
        step = custom_step(model, optimizer, jit_compile=args.jit_compile)
        step_s = time_loop(step, iterator, args.steps, args.warmup,
                           before=lambda: file_barrier(args.sync_dir, "ready", args.index, args.count, args.timeout))
    # Keep loading the machine until every process has finished timing, so none runs alone at the end.
    file_barrier(args.sync_dir, "done", args.index, args.count, args.timeout, keep_busy=lambda: float(step(iterator)))
    result({"index": args.index, "step_s": step_s})


def gradient_busbw(sd, variables, size: int) -> dict:
    """Median seconds of a fused Sum allreduce of zeros shaped like ``variables`` (slowest rank), and busbw."""
    import tensorflow as tf

    zeros = [tf.zeros(v.shape, v.dtype) for v in variables]
    nbytes = sum(int(z.shape.num_elements()) * z.dtype.size for z in zeros)

    @tf.function
    def reduce(tensors):
        return sd.grouped_allreduce(tensors, op=sd.Sum, name="scaling.busbw")

    for _ in range(2):
        reduce(zeros)[0].numpy()
    times = []
    for _ in range(BUSBW_ITERS):
        sd.barrier()
        start = time.perf_counter()
        reduce(zeros)[0].numpy()
        times.append(time.perf_counter() - start)
    per_rank = sd.allgather_object(times)
    seconds = statistics.median(max(rank[i] for rank in per_rank) for i in range(BUSBW_ITERS))
    bus_bytes = nbytes * 2 * (size - 1) / size
    return {"grad_bytes": nbytes, "allreduce_s": seconds, "busbw": bus_bytes / seconds if seconds > 0 else None}


def worker_smdist(args: argparse.Namespace) -> None:
    one_thread_tf()
    import smdist_tf as sd

    extra: dict = {}
    if args.worker == "smdist_fit_strategy":
        strategy = sd.DataParallelStrategy()
        with strategy.scope():
            model, optimizer = build_model(args.model, args.quick)
            model.compile(optimizer=optimizer, loss=loss_fn(), jit_compile=args.jit_compile)
        data = dataset(args, args.batch * sd.size())
        extra["autotuned"] = finish_autotune(sd, lambda: model.fit(data, epochs=1, steps_per_epoch=10, verbose=0))
        step_s = fit_seconds_per_step(model, data, args, [], before=sd.barrier)
    elif args.worker == "smdist_fit_optimizer":
        sd.init()
        import smdist_tf.keras as sdk

        model, optimizer = build_model(args.model, args.quick)
        model.compile(optimizer=sdk.DistributedOptimizer(optimizer), loss=loss_fn(), jit_compile=args.jit_compile)
        data = dataset(args, args.batch)
        extra["autotuned"] = finish_autotune(sd, lambda: model.fit(data, epochs=1, steps_per_epoch=10, verbose=0))
        step_s = fit_seconds_per_step(model, data, args, [sdk.callbacks.BroadcastGlobalVariablesCallback(0)],
                                      before=sd.barrier)
    else:  # smdist_tape
        sd.init()
        model, optimizer = build_model(args.model, args.quick)
        sd.broadcast_variables(model.variables, root_rank=0)
        step = custom_step(model, optimizer, wrap_tape=sd.DistributedGradientTape, jit_compile=args.jit_compile)
        iterator = iter(dataset(args, args.batch))
        extra["autotuned"] = finish_autotune(sd, lambda: [float(step(iterator)) for _ in range(10)])
        step_s = time_loop(step, iterator, args.steps, args.warmup, before=sd.barrier)
        extra.update(gradient_busbw(sd, model.trainable_variables, sd.size()))
    slowest = max(sd.allgather_object(step_s))
    if sd.rank() == 0:
        result({"step_s": slowest, "np": sd.size(), **extra})


def worker_horovod(args: argparse.Namespace) -> None:
    tf = one_thread_tf()
    import horovod.tensorflow as hvd

    hvd.init()
    model, optimizer = build_model(args.model, args.quick)
    hvd.broadcast_variables(model.variables, root_rank=0)
    step = custom_step(model, optimizer, wrap_tape=hvd.DistributedGradientTape)
    step_s = time_loop(step, iter(dataset(args, args.batch)), args.steps, args.warmup,
                       before=lambda: hvd.allreduce(tf.constant(0.0), name="scaling.barrier").numpy())
    slowest = float(hvd.allreduce(tf.constant(step_s, tf.float64), op=hvd.Max, name="scaling.step_s").numpy())
    if hvd.rank() == 0:
        result({"step_s": slowest, "np": hvd.size()})


def worker_mwms(args: argparse.Namespace) -> None:
    tf = one_thread_tf()
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    with strategy.scope():
        model, optimizer = build_model(args.model, args.quick)
    lossf = loss_fn()
    data = dataset(args, args.batch * args.count)
    iterator = iter(strategy.experimental_distribute_dataset(data))
    global_batch = args.batch * args.count

    @tf.function
    def step(it):
        def step_fn(x, y):
            with tf.GradientTape() as tape:
                per_sample = tf.keras.losses.sparse_categorical_crossentropy(y, model(x, training=True), from_logits=True)
                loss = tf.nn.compute_average_loss(per_sample, global_batch_size=global_batch)
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables))
            return loss

        return strategy.reduce("SUM", strategy.run(step_fn, args=next(it)), axis=None)

    def barrier():
        strategy.reduce("SUM", strategy.run(lambda: tf.constant(0.0)), axis=None)

    step_s = time_loop(step, iterator, args.steps, args.warmup, before=barrier)
    # The slowest worker's time, gathered the same way.
    every = strategy.gather(strategy.run(lambda: tf.constant([step_s], tf.float64)), axis=0)
    if args.index == 0:
        result({"step_s": float(tf.reduce_max(every)), "np": args.count})


def worker(args: argparse.Namespace) -> None:
    if args.worker in ("ceiling", "ceiling_fit"):
        worker_ceiling(args)
    elif args.worker in SMDIST_PATHS:
        worker_smdist(args)
    elif args.worker == "horovod_tape":
        worker_horovod(args)
    else:
        worker_mwms(args)


# ---------------------------------------------------------------------------------------------
# Driver side.


def emit(record: dict) -> None:
    print(json.dumps(record), flush=True)


def job_env(extra: Optional[dict] = None) -> dict:
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", PYTHONUNBUFFERED="1",
               OMP_NUM_THREADS="1", TF_CPP_MIN_LOG_LEVEL=os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2"),
               PYTHONPATH=os.pathsep.join(p for p in [str(ROOT), os.environ.get("PYTHONPATH", "")] if p))
    env.pop("TF_CONFIG", None)
    env.update(extra or {})
    return env


def run_group(argvs: list, envs: list, timeout: float) -> tuple[list, Optional[str]]:
    """Starts every argv at once, each in its own process group; returns their outputs and an error text.

    Past ``timeout`` seconds (for all together) every group still running is killed.
    """
    procs = [subprocess.Popen(a, cwd=ROOT, env=e, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              start_new_session=True) for a, e in zip(argvs, envs)]
    deadline = time.monotonic() + timeout
    outputs, error = [], None
    try:
        for p in procs:
            try:
                out, _ = p.communicate(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                error = f"timed out after {timeout:g} s"
                for q in procs:
                    if q.poll() is None:
                        os.killpg(q.pid, signal.SIGKILL)
                out, _ = p.communicate()
            outputs.append(out)
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.communicate()
    if error is None:
        bad = [(i, p.returncode) for i, p in enumerate(procs) if p.returncode != 0]
        if bad:
            error = f"process {bad[0][0]} exited with {bad[0][1]}"
    return outputs, error


def parse_results(out: str) -> list:
    return [json.loads(m.group(1)) for m in re.finditer(r"RESULT (\{.*\})", out)]


def worker_argv(args: argparse.Namespace, system: str, model: str, extra: tuple = (), xla: bool = False) -> list:
    argv = [sys.executable, str(SCRIPT), "--worker", system, "--worker-model", model, "--batch", str(args.batch),
            "--steps", str(args.steps), "--warmup", str(args.warmup), "--timeout", str(args.timeout), *extra]
    return argv + (["--quick"] if args.quick else []) + (["--jit-compile"] if xla else [])


def launcher(name: str) -> str:
    local = Path(sys.executable).parent / name
    return str(local) if local.exists() else (shutil.which(name) or name)


def run_system(args: argparse.Namespace, system: str, model: str, np_: int, bucket_cap_mb: Optional[float] = None,
               xla: bool = False, autotune: bool = False) -> tuple[Optional[dict], Optional[str]]:
    """Runs one measurement job (smdist_tf paths with ``SMDIST_BUCKET_CAP_MB`` when given, the ceiling and
    smdist_tf paths with XLA when ``xla``, smdist_tf paths autotuned when ``autotune``); returns
    (raw result, error text)."""
    if system in ("ceiling", "ceiling_fit", "mwms"):
        sync_dir = tempfile.mkdtemp(prefix="smdist-scaling-")
        try:
            argvs, envs = [], []
            ports = free_ports(np_) if system == "mwms" else []
            for i in range(np_):
                argvs.append(worker_argv(args, system, model, ("--index", str(i), "--count", str(np_), "--sync-dir", sync_dir),
                                         xla))
                extra = {}
                if system == "mwms":
                    extra["TF_CONFIG"] = json.dumps({"cluster": {"worker": [f"localhost:{p}" for p in ports]},
                                                     "task": {"type": "worker", "index": i}})
                envs.append(job_env(extra))
            outputs, error = run_group(argvs, envs, args.timeout)
        finally:
            shutil.rmtree(sync_dir, ignore_errors=True)
        found = [parse_results(o) for o in outputs]
        if error is not None or not all(found if system != "mwms" else found[:1]):
            return None, f"{error or 'no result'}: {' | '.join(o[-1500:] for o in outputs)[-3000:]}"
        if system == "mwms":
            return found[0][0], None
        steps = [f[0]["step_s"] for f in found]
        sps = sum(args.batch / s for s in steps)
        # step_s: the step time that gives the summed rate (harmonic mean), so step_ms and samples/s agree.
        return {"step_s": np_ * args.batch / sps, "samples_per_sec": sps,
                "process_step_ms": [round(s * 1e3, 3) for s in steps]}, None
    if system == "horovod_tape":
        from smdist_tf.run.session_dir import BASE_VARIABLE, private_session_base

        cmd = [launcher("mpirun"), "-np", str(np_), "--oversubscribe", "--bind-to", "none"]
        with private_session_base(BASE_VARIABLE, job_env()) as env:
            outputs, error = run_group([cmd + worker_argv(args, system, model)], [env], args.timeout)
    else:
        cmd = [launcher("smdistrun"), "-np", str(np_)]
        extra = {} if bucket_cap_mb is None else {"SMDIST_BUCKET_CAP_MB": f"{bucket_cap_mb:g}"}
        if autotune:
            extra["SMDIST_AUTOTUNE"] = "1"
        env = job_env(extra)
        outputs, error = run_group([cmd + worker_argv(args, system, model, xla=xla)], [env], args.timeout)
    found = parse_results(outputs[0])
    if error is not None or not found:
        return None, f"{error or 'no result'}: {outputs[0][-3000:]}"
    return found[0], None


def importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def median(values: list) -> Optional[float]:
    values = [v for v in values if v is not None]
    return round(statistics.median(values), 3) if values else None


def summarize(records: list, args: argparse.Namespace, errors: list, skipped: dict, wall_s: float) -> dict:
    per_case: dict = {}
    goal: dict = {}
    for model in args.models:
        for np_ in args.np:
            rows = [r for r in records if r["model"] == model and r["np"] == np_ and "samples_per_sec" in r]
            labels = list(dict.fromkeys(r["label"] for r in rows))
            case = {
                "median_ratio_to_ceiling": {s: median([r.get("ratio_to_ceiling") for r in rows if r["label"] == s])
                                            for s in labels if s != "ceiling"},
                "median_samples_per_sec": {s: median([r["samples_per_sec"] for r in rows if r["label"] == s])
                                           for s in labels},
            }
            # The tape's step split into compute, wire and overhead: one entry per bucket size.
            for label in labels:
                tape = [r for r in rows if r["label"] == label and r["system"] == "smdist_tape"
                        and r.get("wire_ms") is not None]
                if tape:
                    key = "smdist_tape_breakdown_ms" + label[len("smdist_tape"):]
                    case[key] = {k: median([r.get(k) for r in tape])
                                 for k in ("step_ms", "compute_ms", "wire_ms", "overhead_ms")}
                    case[key]["grad_bytes"] = tape[0]["grad_bytes"]
                    case[key]["busbw_GBps"] = median([r.get("busbw_GBps") for r in tape])
            rates = case["median_samples_per_sec"]
            autotune_over_default = {label[:-len("[autotune]")]: round(rates[label] / rates[label[:-len("[autotune]")]], 3)
                                     for label in labels if label.endswith("[autotune]")
                                     and rates.get(label[:-len("[autotune]")]) and rates.get(label)}
            if autotune_over_default:
                case["autotune_over_default"] = autotune_over_default
            xla_over_graph = {label[:-len("[xla]")]: round(rates[label] / rates[label[:-len("[xla]")]], 3)
                              for label in labels if label.endswith("[xla]") and rates.get(label[:-len("[xla]")])
                              and rates.get(label)}
            if xla_over_graph:
                case["xla_over_graph"] = xla_over_graph
            per_case[f"{model}@np{np_}"] = case
            if np_ == 2:  # the goal is for the paths as users run them by default: without XLA
                ratios = [ratio for label, ratio in case["median_ratio_to_ceiling"].items()
                          if label.split("[")[0] in SMDIST_PATHS and "[xla]" not in label
                          and "[autotune]" not in label]
                goal[model] = None if not ratios or None in ratios else all(r >= GOAL_RATIO for r in ratios)
    measured = [v for v in goal.values()]
    return {
        "summary": True,
        "results": per_case,
        f"every_smdist_path_ge_{GOAL_RATIO:.2f}_of_ceiling_at_np2": (
            None if not measured or None in measured else all(measured)),
        f"every_smdist_path_ge_{GOAL_RATIO:.2f}_of_ceiling_at_np2_by_model": goal,
        "models": {m: model_spec(m, args.quick) for m in args.models},
        "batch_per_process": args.batch, "steps": args.steps, "warmup": args.warmup, "repeats": args.repeats,
        "np": args.np, "systems": args.systems, "bucket_caps_mb": args.bucket_caps, "xla": args.xla,
        "autotune": args.autotune,
        "quick": args.quick,
        "skipped": skipped, "errors": errors,
        "cpu_count": os.cpu_count(), "load_average_end": [round(x, 2) for x in os.getloadavg()],
        "wall_s": round(wall_s, 1),
    }


def measurement(args, system: str, model: str, np_: int, repeat: int, raw: dict, ceiling: Optional[dict],
                bucket_cap_mb: Optional[float] = None, xla: bool = False, autotune: bool = False) -> dict:
    step_s = raw["step_s"]
    sps = raw.get("samples_per_sec", args.batch * np_ / step_s)
    label = (system + ("" if bucket_cap_mb is None else f"[{bucket_cap_mb:g}MiB]") + ("[xla]" if xla else "")
             + ("[autotune]" if autotune else ""))
    rec = {"system": system, "label": label, "bucket_cap_mb": bucket_cap_mb, "jit_compile": xla,
           "autotuned": raw.get("autotuned"), "model": model, "np": np_,
           "repeat": repeat, "batch_per_process": args.batch,
           "samples_per_sec": round(sps, 2), "step_ms": round(step_s * 1e3, 3),
           "ratio_to_ceiling": round(sps / ceiling["samples_per_sec"], 3) if ceiling and system != "ceiling" else None}
    if system in ("ceiling", "ceiling_fit"):
        rec["process_step_ms"] = raw["process_step_ms"]  # each process's own; a wide spread: unfair sharing
    if system == "ceiling":
        rec["ratio_to_ceiling"] = 1.0
    if "grad_bytes" in raw:
        busbw = raw.get("busbw")
        bus_bytes = raw["grad_bytes"] * 2 * (np_ - 1) / np_
        wire_ms = bus_bytes / busbw * 1e3 if busbw else None
        compute_ms = ceiling["step_s"] * 1e3 if ceiling else None
        rec.update(grad_bytes=raw["grad_bytes"], busbw_GBps=round(busbw / 1e9, 3) if busbw else None,
                   wire_ms=round(wire_ms, 3) if wire_ms is not None else None,
                   compute_ms=round(compute_ms, 3) if compute_ms is not None else None,
                   overhead_ms=round(step_s * 1e3 - compute_ms - wire_ms, 3)
                   if wire_ms is not None and compute_ms is not None else None)
    return rec


def parse_args(argv: Optional[list] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--np", type=int, nargs="+", default=None, help="rank counts (default 2 4; --quick: 2)")
    parser.add_argument("--models", nargs="+", default=None, choices=sorted(MODEL_SPECS),
                        help="default mlp conv; --quick: mlp")
    parser.add_argument("--systems", nargs="+", default=None, choices=ALL_SYSTEMS,
                        help=f"default {' '.join(DEFAULT_SYSTEMS)} (ceiling is always run: ratios need it)")
    parser.add_argument("--batch", type=int, default=64, help="per process")
    parser.add_argument("--steps", type=int, default=None, help="timed steps per job (default 30; --quick 5)")
    parser.add_argument("--warmup", type=int, default=None, help="untimed steps first (default 5; --quick 2)")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--bucket-caps", type=float, nargs="+", default=None,
                        help="run each smdist_tf path once per SMDIST_BUCKET_CAP_MB value (MiB), interleaved")
    parser.add_argument("--xla", action="store_true",
                        help="run the ceiling and each smdist_tf path without and with jit_compile, interleaved")
    parser.add_argument("--jit-compile", action="store_true", help=argparse.SUPPRESS)  # a worker's XLA run
    parser.add_argument("--autotune", action="store_true",
                        help="run each smdist_tf path with the default settings and with SMDIST_AUTOTUNE=1, interleaved")
    parser.add_argument("--timeout", type=float, default=420, help="seconds per job; its process groups are killed past it")
    parser.add_argument("--quick", action="store_true", help="tiny models, few steps, np 2: a smoke run")
    parser.add_argument("--worker", choices=ALL_SYSTEMS, help=argparse.SUPPRESS)
    parser.add_argument("--worker-model", choices=sorted(MODEL_SPECS), help=argparse.SUPPRESS)
    parser.add_argument("--index", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--count", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--sync-dir", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.np = args.np or ([2] if args.quick else [2, 4])
    args.models = args.models or (["mlp"] if args.quick else ["mlp", "conv"])
    args.steps = args.steps or (5 if args.quick else 30)
    args.warmup = args.warmup if args.warmup is not None else (2 if args.quick else 5)
    systems = args.systems or DEFAULT_SYSTEMS
    args.systems = [s for s in ALL_SYSTEMS if s in systems or s == "ceiling"]
    return args


def main() -> int:
    args = parse_args()
    if args.worker:
        args.model = args.worker_model
        worker(args)
        return 0
    if "OMPI_COMM_WORLD_SIZE" in os.environ or "PMI_RANK" in os.environ:
        sys.exit("run benchmarks/scaling.py directly, not under mpirun: it launches its own jobs")
    start = time.monotonic()
    skipped: dict = {}
    if "horovod_tape" in args.systems and not importable("horovod.tensorflow"):
        skipped["horovod_tape"] = "horovod.tensorflow is not importable"
        emit({"system": "horovod_tape", "skipped": skipped["horovod_tape"]})
    systems = [s for s in args.systems if s not in skipped]
    records, errors = [], []
    for repeat in range(args.repeats):
        for model in args.models:
            for np_ in args.np:
                ceilings: dict = {}  # by XLA or not
                for system in systems:  # the ceiling first, then the smdist_tf paths, then the peers
                    caps = args.bucket_caps if args.bucket_caps and system in SMDIST_PATHS else [None]
                    # Odd repeats run the variants in the other order, so neither always goes first.
                    order = (lambda pair: pair) if repeat % 2 == 0 else (lambda pair: pair[::-1])
                    modes = order([False, True]) if args.xla and system in ("ceiling", *SMDIST_PATHS) else [False]
                    tunes = order([False, True]) if args.autotune and system in SMDIST_PATHS else [False]
                    for xla in modes:
                        for cap in caps:
                            for tune in tunes:
                                raw, error = run_system(args, system, model, np_, cap, xla, tune)
                                if error is not None:
                                    rec = {"system": system, "bucket_cap_mb": cap, "jit_compile": xla,
                                           "autotune": tune, "model": model, "np": np_, "repeat": repeat,
                                           "error": error}
                                    last = [line for line in error.splitlines() if line.strip()][-1]
                                    errors.append(f"{system}{'[xla]' if xla else ''}{'[autotune]' if tune else ''} "
                                                  f"{model} np={np_} repeat={repeat}: {error.split(':')[0]}: "
                                                  f"{last[:200]}")
                                else:
                                    if system == "ceiling":
                                        ceilings[xla] = raw
                                    rec = measurement(args, system, model, np_, repeat, raw, ceilings.get(xla), cap,
                                                      xla, tune)
                                    records.append(rec)
                                emit(rec)
    emit(summarize(records, args, errors, skipped, time.monotonic() - start))
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
