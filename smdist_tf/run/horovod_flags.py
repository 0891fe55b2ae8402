"""horovodrun's flags and Horovod's variables that have no effect here, and why.

``smdistrun`` accepts them, so a Horovod launch line or job environment runs unchanged, and
warns once for each that is given: one line ``smdistrun: warning: ...`` naming it and the
reason. The flags and variables that do work are mapped in args.py and tuning_env.py
(docs/migrate-from-horovod.md has the whole table).
"""

from __future__ import annotations

from typing import Any, Mapping

# Settings field -> (the flag as horovodrun spells it, why it changes nothing here).
FLAGS_WITHOUT_EFFECT = {
    "hierarchical_allgather": (
        "--hierarchical-allgather", "allgather is not done hierarchically here"),
    "autotune_bayes_opt_max_samples": (
        "--autotune-bayes-opt-max-samples", "autotuning here is a coordinate search, not Bayesian optimisation"),
    "autotune_gaussian_process_noise": (
        "--autotune-gaussian-process-noise", "autotuning here is a coordinate search, not Bayesian optimisation"),
    "blacklist_cooldown_range": (
        "--blacklist-cooldown-range", "a restart uses the hosts the discovery script prints; no host is blacklisted"),
    "mpi_threads_disable": (
        "--mpi-threads-disable", "the engine asks MPI for MPI_THREAD_MULTIPLE (process sets need it) and works with less"),
    "num_nccl_streams": ("--num-nccl-streams", "NCCL collectives run on TensorFlow's own stream"),
    "thread_affinity": ("--thread-affinity", "the engine's threads are not pinned to cores"),
    "gloo_timeout_seconds": ("--gloo-timeout-seconds", "there is no Gloo: the ranks talk over MPI"),
    "log_with_timestamp": ("--log-with-timestamp", "the engine's log lines carry no time"),
    "jsrun": ("--jsrun", "smdistrun starts the ranks with mpirun"),
}

# Variable -> why it changes nothing here. Horovod reads these at run time; the ones we read
# (HOROVOD_FUSION_THRESHOLD, HOROVOD_CYCLE_TIME, ...) are in docs/api.md.
VARIABLES_WITHOUT_EFFECT = {
    "HOROVOD_ENABLE_ASYNC_COMPLETION": "the engine has no such switch: its GPU work is queued on the op's stream",
    "HOROVOD_HIERARCHICAL_ALLGATHER": FLAGS_WITHOUT_EFFECT["hierarchical_allgather"][1],
    "HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES": FLAGS_WITHOUT_EFFECT["autotune_bayes_opt_max_samples"][1],
    "HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE": FLAGS_WITHOUT_EFFECT["autotune_gaussian_process_noise"][1],
    "HOROVOD_MPI_THREADS_DISABLE": FLAGS_WITHOUT_EFFECT["mpi_threads_disable"][1],
    "HOROVOD_NUM_NCCL_STREAMS": FLAGS_WITHOUT_EFFECT["num_nccl_streams"][1],
    "HOROVOD_THREAD_AFFINITY": FLAGS_WITHOUT_EFFECT["thread_affinity"][1],
    "HOROVOD_GLOO_TIMEOUT_SECONDS": FLAGS_WITHOUT_EFFECT["gloo_timeout_seconds"][1],
    "HOROVOD_GLOO_IFACE": "there is no Gloo: give MPI its interfaces with --network-interfaces",
    "HOROVOD_CCL_CACHE": "there is no oneCCL here",
    "HOROVOD_BATCH_D2D_MEMCOPIES": "the engine has no such switch",
    "HOROVOD_DISABLE_GROUP_FUSION": "the engine has no such switch: a group's tensors are always fused together",
    "HOROVOD_DISABLE_NVTX_RANGES": "the engine emits no NVTX ranges",
    "HOROVOD_ENABLE_XLA_OPS": "the collectives compile under XLA without it (docs/xla.md)",
    "HOROVOD_ADASUM_MPI_CHUNK_SIZE": "Adasum here has no such setting",
}
# Read by Horovod to choose among its controllers and CPU libraries: MPI is the only one here.
_MPI_ONLY = ("HOROVOD_CONTROLLER", "HOROVOD_CPU_OPERATIONS")


def _given(value: Any) -> bool:
    return value is not None and value is not False


def flag_warnings(values: Mapping[str, Any]) -> list[str]:
    """One line for each flag of ``FLAGS_WITHOUT_EFFECT`` that ``values`` (settings fields) sets."""
    return [f"{flag} has no effect with smdist_tf: {why}"
            for name, (flag, why) in FLAGS_WITHOUT_EFFECT.items() if _given(values.get(name))]


def variable_warnings(environ: Mapping[str, str]) -> list[str]:
    """One line for each Horovod variable in ``environ`` that smdist_tf does not read."""
    lines = [f"{name}={environ[name]} has no effect with smdist_tf: {why}"
             for name, why in VARIABLES_WITHOUT_EFFECT.items() if environ.get(name)]
    for name in _MPI_ONLY:
        if environ.get(name) and environ[name].upper() != "MPI":
            lines.append(f"{name}={environ[name]} has no effect with smdist_tf: MPI is the only one here")
    return lines
