"""Turns tuning flags into the environment variables the engine reads at ``init()``.

Every knob is set under our name and the Horovod name, so a script (or a
library) that reads either sees the same value.
"""

from __future__ import annotations

from smdist_tf.run.args import LaunchSettings


def _number(value: float) -> str:
    # 5.0 -> "5", 2.5 -> "2.5": what a user would have typed.
    return f"{value:g}" if isinstance(value, float) else str(value)


def tuning_env(s: LaunchSettings) -> dict[str, str]:
    """The environment variables (ours and ``HOROVOD_*``) for the flags that are set."""
    env: dict[str, str] = {}

    def both(ours: str, horovod: str, value: str) -> None:
        env[ours] = value
        env[horovod] = value

    if s.fusion_threshold_mb is not None:
        # The engine takes bytes; the flag is in MiB, as horovodrun's is.
        both("SMDIST_FUSION_THRESHOLD", "HOROVOD_FUSION_THRESHOLD", str(int(s.fusion_threshold_mb * 1024 * 1024)))
    if s.cycle_time_ms is not None:
        both("SMDIST_CYCLE_TIME", "HOROVOD_CYCLE_TIME", _number(s.cycle_time_ms))
    if s.cache_capacity is not None:
        both("SMDIST_CACHE_CAPACITY", "HOROVOD_CACHE_CAPACITY", str(s.cache_capacity))
    if s.hierarchical_allreduce is not None:
        both("SMDIST_HIERARCHICAL_ALLREDUCE", "HOROVOD_HIERARCHICAL_ALLREDUCE", "1" if s.hierarchical_allreduce else "0")
    if s.timeline_filename is not None:
        both("SMDIST_TIMELINE", "HOROVOD_TIMELINE", s.timeline_filename)
    if s.timeline_mark_cycles is not None:
        both("SMDIST_TIMELINE_MARK_CYCLES", "HOROVOD_TIMELINE_MARK_CYCLES", "1" if s.timeline_mark_cycles else "0")
    if s.timeline_sample_every is not None:
        env["SMDIST_TIMELINE_SAMPLE_EVERY"] = str(s.timeline_sample_every)  # Horovod has no such setting
    if s.stall_check_warning_time_seconds is not None:
        both("SMDIST_STALL_CHECK_TIME", "HOROVOD_STALL_CHECK_TIME_SECONDS", _number(s.stall_check_warning_time_seconds))
    if s.stall_check_shutdown_time_seconds is not None:
        both("SMDIST_STALL_SHUTDOWN_TIME", "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", _number(s.stall_check_shutdown_time_seconds))
    if s.no_stall_check:
        env["HOROVOD_STALL_CHECK_DISABLE"] = "1"  # what horovodrun sets; the engine reads it (no SMDIST_ name)
    if s.log_level is not None:
        both("SMDIST_LOG_LEVEL", "HOROVOD_LOG_LEVEL", s.log_level)
    if s.autotune is not None:
        both("SMDIST_AUTOTUNE", "HOROVOD_AUTOTUNE", "1" if s.autotune else "0")
    if s.autotune_log_file is not None:
        both("SMDIST_AUTOTUNE_LOG", "HOROVOD_AUTOTUNE_LOG", s.autotune_log_file)
    if s.autotune_warmup_samples is not None:
        both("SMDIST_AUTOTUNE_WARMUP_SAMPLES", "HOROVOD_AUTOTUNE_WARMUP_SAMPLES", str(s.autotune_warmup_samples))
    if s.autotune_steps_per_sample is not None:
        both("SMDIST_AUTOTUNE_STEPS_PER_SAMPLE", "HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE", str(s.autotune_steps_per_sample))
    if s.tcp:
        # horovodrun's --tcp keeps MPI off InfiniBand; NCCL's sockets are the TCP way for GPU tensors.
        env["NCCL_IB_DISABLE"] = "1"
    if s.network_interfaces:
        # NCCL picks its own sockets: the interfaces MPI is told to use bind NCCL too, as horovodrun does.
        env["NCCL_SOCKET_IFNAME"] = ",".join(s.network_interfaces)
    return env
