"""The ``smdistrun`` command line (horovodrun's flags) and ``--config-file`` merging."""

from __future__ import annotations

import argparse
import math
import os
import shlex
import sys
from dataclasses import dataclass, field
from typing import Any, NoReturn

from smdist_tf.run import checks
from smdist_tf.run.config_file import load_config_file
from smdist_tf.run.errors import UsageError
from smdist_tf.run.horovod_flags import flag_warnings

LOG_LEVELS = ("TRACE", "DEBUG", "INFO", "WARNING", "ERROR", "FATAL")
DEFAULT_START_TIMEOUT_S = 30.0
DEFAULT_ELASTIC_TIMEOUT_S = 600.0  # horovodrun's
# Restarts when --host-discovery-script is given without --max-restarts. horovodrun
# has no limit there; a script that fails every time would then restart forever.
DEFAULT_DISCOVERY_RESTARTS = 3


@dataclass
class LaunchSettings:
    """Everything one launch needs, after the command line and config file are merged."""

    command: list[str] = field(default_factory=list)
    np: int | None = None
    hosts: str | None = None
    hostfile: str | None = None
    ssh_port: int | None = None
    ssh_identity_file: str | None = None
    start_timeout: float = DEFAULT_START_TIMEOUT_S
    network_interfaces: list[str] = field(default_factory=list)
    output_filename: str | None = None
    verbose: bool = False
    log_level: str | None = None
    mpi_args: list[str] = field(default_factory=list)
    fusion_threshold_mb: float | None = None
    cycle_time_ms: float | None = None
    cache_capacity: int | None = None
    hierarchical_allreduce: bool | None = None
    timeline_filename: str | None = None
    timeline_mark_cycles: bool | None = None
    timeline_sample_every: int | None = None
    stall_check_warning_time_seconds: float | None = None
    stall_check_shutdown_time_seconds: float | None = None
    autotune: bool | None = None
    autotune_log_file: str | None = None
    autotune_warmup_samples: int | None = None
    autotune_steps_per_sample: int | None = None
    check_build: bool = False
    show_version: bool = False
    config_file: str | None = None
    max_restarts: int | None = None  # None: see effective_max_restarts()
    elastic_dir: str | None = None
    host_discovery_script: str | None = None
    min_np: int | None = None
    max_np: int | None = None
    slots_per_host: int = 1
    elastic_timeout: float = DEFAULT_ELASTIC_TIMEOUT_S
    # Config-file entries we accept but do not act on, reported under --verbose.
    ignored_config: list[str] = field(default_factory=list)
    # horovodrun's flags that work here by other means.
    no_stall_check: bool | None = None
    tcp: bool = False
    binding_args: str | None = None
    prefix_output_with_timestamp: bool = False
    disable_cache: bool = False  # horovodrun's cache of its ssh checks; smdistrun keeps none
    # horovodrun's flags that change nothing here (horovod_flags.py): accepted, one warning each.
    hierarchical_allgather: bool | None = None
    autotune_bayes_opt_max_samples: int | None = None
    autotune_gaussian_process_noise: float | None = None
    blacklist_cooldown_range: list[int] | None = None
    mpi_threads_disable: bool | None = None
    num_nccl_streams: int | None = None
    thread_affinity: int | None = None
    gloo_timeout_seconds: int | None = None
    log_with_timestamp: bool | None = None
    jsrun: bool = False
    warnings: list[str] = field(default_factory=list)  # one line per such flag given


class _Parser(argparse.ArgumentParser):
    """Raises UsageError instead of printing usage and exiting, so every error is one line."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(message)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser; exposed for ``--help`` and the docs."""
    p = _Parser(
        prog="smdistrun",
        description="Start a smdist_tf job over mpirun (horovodrun-compatible flags).",
        usage="smdistrun [options] -np N command [args ...]",
        epilog="TensorFlow's logs: unless you set TF_CPP_MIN_LOG_LEVEL, the ranks get TF_CPP_MIN_LOG_LEVEL=2 "
               "(errors only) and TensorFlow's start-up lines are left out on every rank; set "
               "TF_CPP_MIN_LOG_LEVEL=0 to see them (rank 0's start-up lines), or --verbose for every rank's.",
        allow_abbrev=False,  # a typo must not silently pick another flag
    )
    # Defaults are None so we can tell "not given" from "given", and let the
    # config file fill only what the command line left out.
    p.add_argument("-v", "--version", action="store_true", default=None, help="print the version and exit")
    p.add_argument("-np", "--num-proc", dest="np", type=int, help="number of ranks (default: all slots of -H/--hostfile)")
    p.add_argument("-H", "--hosts", help="host:slots,host:slots,... (a host without :slots has one); host names or IP addresses")
    p.add_argument("-hostfile", "--hostfile", help="file with one 'hostname slots=N' per line")
    p.add_argument("-p", "--ssh-port", type=int, help="ssh port on the remote hosts")
    p.add_argument("-i", "--ssh-identity-file", help="ssh private key for the remote hosts: an existing file, no whitespace, quotes or shell characters in its path")
    p.add_argument("--start-timeout", type=float, help=f"seconds for all ranks to start (default {DEFAULT_START_TIMEOUT_S:g}; env HOROVOD_START_TIMEOUT)")
    p.add_argument("--network-interface", "--network-interfaces", dest="network_interfaces", action="append",
                   help="comma-separated interface names MPI may use, e.g. eth0,eth1 (may be given several times)")
    p.add_argument("--output-filename", help="also write each rank's output to DIR/rank.N/{stdout,stderr}")
    p.add_argument("--verbose", action="store_true", default=None,
                   help="print the exact mpirun command and launcher decisions, and every rank's TensorFlow logs")
    p.add_argument("--log-level", type=str.upper, choices=LOG_LEVELS, help="engine log level")
    p.add_argument("--mpi-args", help="extra arguments for mpirun, as one quoted string; passed on unchecked, as your own mpirun options")
    p.add_argument("--fusion-threshold-mb", type=float, help="fusion buffer size in MB (0 disables fusion)")
    p.add_argument("--cycle-time-ms", type=float, help="engine cycle time in milliseconds")
    p.add_argument("--cache-capacity", type=int, help="response cache capacity (entries)")
    p.add_argument("--hierarchical-allreduce", action=argparse.BooleanOptionalAction, default=None, help="reduce inside each host, then across hosts, then broadcast inside")
    p.add_argument("--timeline-filename", help="write the engine timeline (Chrome trace JSON) here")
    p.add_argument("--timeline-mark-cycles", action="store_true", default=None, help="mark engine cycles in the timeline")
    p.add_argument("--timeline-sample-every", type=int, metavar="N",
                   help="record only every N-th engine cycle that ran collectives in the timeline (default 1: all)")
    p.add_argument("--stall-check-warning-time-seconds", type=float, help="warn when a collective waits this long for some ranks")
    p.add_argument("--stall-check-shutdown-time-seconds", type=float, help="fail the job when a collective waits this long")
    p.add_argument("--autotune", action="store_true", default=None,
                   help="tune the fusion threshold, cycle time and intra-host thresholds during the first steps")
    p.add_argument("--autotune-log-file", help="rank 0 writes a CSV line per autotuning sample here")
    p.add_argument("--autotune-warmup-samples", type=int, help="autotuning samples discarded first (default 3)")
    p.add_argument("--autotune-steps-per-sample", type=int,
                   help="working engine cycles per warm-up sample (default 10)")
    p.add_argument("-cb", "--check-build", action="store_true", default=None, help="print what smdist_tf was built with and exit")
    p.add_argument("--config-file", help="YAML file with defaults for these flags (the command line wins)")
    p.add_argument("--mpi", action="store_true", default=None, help="use MPI to start the ranks (the only controller; accepted for compatibility)")
    restarts = p.add_argument_group("restarts and elastic training")
    restarts.add_argument("--max-restarts", "--reset-limit", dest="max_restarts", type=int, metavar="N",
                          help="start the whole job again, up to N times, when a rank fails (default 0; "
                               f"{DEFAULT_DISCOVERY_RESTARTS} with --host-discovery-script)")
    restarts.add_argument("--elastic-dir", metavar="DIR",
                          help="directory for smdist_tf.elastic commits, seen by the ranks as SMDIST_ELASTIC_DIR "
                               "(default with restarts: a temporary one, removed at the end)")
    restarts.add_argument("--host-discovery-script", metavar="FILE",
                          help="executable printing one 'host:slots' line per available host; run before every start")
    restarts.add_argument("--min-np", "--min-num-proc", dest="min_np", type=int, metavar="N",
                          help="fewest ranks to start (default -np, else 1); wait for that many slots")
    restarts.add_argument("--max-np", "--max-num-proc", dest="max_np", type=int, metavar="N",
                          help="most ranks to start (default: every discovered slot)")
    restarts.add_argument("--slots-per-host", "--slots", dest="slots_per_host", type=int, metavar="N",
                          help="slots of a discovered host printed without ':slots' (default 1)")
    restarts.add_argument("--elastic-timeout", type=float, metavar="S",
                          help=f"seconds to wait for --min-np slots (default {DEFAULT_ELASTIC_TIMEOUT_S:g}; "
                               "env HOROVOD_ELASTIC_TIMEOUT)")
    horovod = p.add_argument_group(
        "horovodrun's other flags",
        "accepted so that a horovodrun line runs unchanged; those marked 'no effect' print one warning "
        "(docs/migrate-from-horovod.md)")
    horovod.add_argument("--disable-cache", action="store_true", default=None,
                         help="accepted: smdistrun keeps no cache of its checks, it runs them every time")
    horovod.add_argument("--no-stall-check", dest="no_stall_check", action="store_true", default=None,
                         help="no stall warning and no stall shutdown (HOROVOD_STALL_CHECK_DISABLE=1)")
    horovod.add_argument("--stall-check", dest="no_stall_check", action="store_false", default=None, help=argparse.SUPPRESS)
    horovod.add_argument("--no-timeline-mark-cycles", dest="timeline_mark_cycles", action="store_false", default=None,
                         help=argparse.SUPPRESS)
    horovod.add_argument("--no-autotune", dest="autotune", action="store_false", default=None, help=argparse.SUPPRESS)
    horovod.add_argument("--tcp", action="store_true", default=None,
                         help="MPI over TCP only (Open MPI: pml ob1, btl self,sm,tcp) and NCCL without InfiniBand")
    horovod.add_argument("--binding-args", help="process binding arguments for mpirun, e.g. \"--bind-to core\" "
                                                "(they replace smdistrun's --bind-to none --map-by slot)")
    horovod.add_argument("-prefix-timestamp", "--prefix-output-with-timestamp", dest="prefix_output_with_timestamp",
                         action="store_true", default=None, help="put the time before each line of the ranks' output")
    horovod.add_argument("--log-without-timestamp", "--log-hide-timestamp", dest="log_with_timestamp",
                         action="store_false", default=None, help="accepted: the engine's log lines carry no time")
    horovod.add_argument("--log-with-timestamp", "--no-log-hide-timestamp", dest="log_with_timestamp",
                         action="store_true", default=None, help="no effect")
    horovod.add_argument("--hierarchical-allgather", dest="hierarchical_allgather", action="store_true",
                         default=None, help="no effect")
    horovod.add_argument("--no-hierarchical-allgather", dest="hierarchical_allgather", action="store_false", default=None,
                         help="accepted: allgather is not hierarchical here")
    horovod.add_argument("--autotune-bayes-opt-max-samples", type=int, help="no effect")
    horovod.add_argument("--autotune-gaussian-process-noise", type=float, help="no effect")
    horovod.add_argument("--blacklist-cooldown-range", type=int, nargs=2, metavar=("MIN", "MAX"), help="no effect")
    horovod.add_argument("--mpi-threads-disable", dest="mpi_threads_disable", action="store_true", default=None,
                         help="no effect")
    horovod.add_argument("--no-mpi-threads-disable", dest="mpi_threads_disable", action="store_false", default=None,
                         help=argparse.SUPPRESS)
    horovod.add_argument("--num-nccl-streams", type=int, help="no effect")
    horovod.add_argument("--thread-affinity", type=int, help="no effect")
    horovod.add_argument("--gloo-timeout-seconds", type=int, help="no effect")
    horovod.add_argument("--jsrun", action="store_true", default=None, help="no effect: the ranks start with mpirun")
    p.add_argument("--gloo", action="store_true", default=None, help=argparse.SUPPRESS)
    p.add_argument("command", nargs=argparse.REMAINDER, help="the command every rank runs")
    return p


# Config file: section -> key -> settings field. Top-level keys named like the
# long flags (with '_' or '-') are accepted too.
_SECTION_KEYS = {
    "params": {
        "fusion_threshold_mb": "fusion_threshold_mb",
        "cycle_time_ms": "cycle_time_ms",
        "cache_capacity": "cache_capacity",
        "hierarchical_allreduce": "hierarchical_allreduce",
    },
    "timeline": {"filename": "timeline_filename", "mark_cycles": "timeline_mark_cycles",
                 "sample_every": "timeline_sample_every"},
    "stall_check": {
        "warning_time_seconds": "stall_check_warning_time_seconds",
        "shutdown_time_seconds": "stall_check_shutdown_time_seconds",
    },
    "logging": {"level": "log_level"},
    "autotune": {
        "enabled": "autotune",
        "log_file": "autotune_log_file",
        "warmup_samples": "autotune_warmup_samples",
        "steps_per_sample": "autotune_steps_per_sample",
    },
}
_FLAT_KEYS = {
    "np", "num_proc", "hosts", "hostfile", "ssh_port", "ssh_identity_file", "start_timeout",
    "network_interface", "network_interfaces", "output_filename", "verbose", "log_level", "mpi_args",
    "fusion_threshold_mb", "cycle_time_ms", "cache_capacity", "hierarchical_allreduce",
    "timeline_filename", "timeline_mark_cycles", "timeline_sample_every", "stall_check_warning_time_seconds",
    "stall_check_shutdown_time_seconds", "max_restarts", "reset_limit", "elastic_dir", "host_discovery_script",
    "min_np", "min_num_proc", "max_np", "max_num_proc", "slots_per_host", "slots", "elastic_timeout",
    "autotune", "autotune_log_file", "autotune_warmup_samples", "autotune_steps_per_sample",
}
_ALIASES = {"num_proc": "np", "network_interface": "network_interfaces", "reset_limit": "max_restarts",
            "min_num_proc": "min_np", "max_num_proc": "max_np", "slots": "slots_per_host"}


def config_values(config: dict[str, Any], path: str) -> tuple[dict[str, Any], list[str]]:
    """Maps a parsed config file to settings fields; returns (values, ignored entries).

    Raises:
        UsageError: for ``controller: gloo`` (only MPI is available).
    """
    values: dict[str, Any] = {}
    ignored: list[str] = []
    for key, value in config.items():
        if isinstance(value, dict):
            known = _SECTION_KEYS.get(key, {})
            for sub, sub_value in value.items():
                if sub in known:
                    values[known[sub]] = sub_value
                else:
                    ignored.append(f"{key}.{sub}")
        elif key == "controller":
            if str(value).lower() != "mpi":
                raise UsageError(f"config file {path}: controller {value!r} is not available (only 'mpi')")
        elif key in _FLAT_KEYS:
            values[_ALIASES.get(key, key)] = value
        else:
            ignored.append(key)
    return values, ignored


def _coerce(name: str, value: Any, kind: type, where: str) -> Any:
    if value is None:
        return None
    if kind is bool:
        if isinstance(value, bool):
            return value
        raise UsageError(f"{where}: {name} must be true or false, got {value!r}")
    if isinstance(value, bool):  # int(True) is 1 and str(True) "True": neither is what was meant
        raise UsageError(f"{where}: {name} must be {kind.__name__}, got {value!r}")
    try:
        if kind is int and isinstance(value, float) and not value.is_integer():
            raise ValueError
        return kind(value)
    except (TypeError, ValueError):
        raise UsageError(f"{where}: {name} must be {kind.__name__}, got {value!r}") from None


_FIELD_TYPES: dict[str, type] = {
    "np": int, "ssh_port": int, "cache_capacity": int,
    "max_restarts": int, "min_np": int, "max_np": int, "slots_per_host": int, "elastic_timeout": float,
    "elastic_dir": str, "host_discovery_script": str,
    "start_timeout": float, "fusion_threshold_mb": float, "cycle_time_ms": float,
    "stall_check_warning_time_seconds": float, "stall_check_shutdown_time_seconds": float,
    "verbose": bool, "hierarchical_allreduce": bool, "timeline_mark_cycles": bool, "timeline_sample_every": int,
    "hosts": str, "hostfile": str, "ssh_identity_file": str, "network_interfaces": str,
    "output_filename": str, "log_level": str, "mpi_args": str, "timeline_filename": str,
    "autotune": bool, "autotune_log_file": str, "autotune_warmup_samples": int, "autotune_steps_per_sample": int,
}


def split_interfaces(value: str) -> list[str]:
    """``"eth0, ib0"`` -> ``["eth0", "ib0"]`` (each is checked by :func:`validate`)."""
    return [name.strip() for name in value.split(",") if name.strip()]


def parse_args(argv: list[str] | None = None, environ: dict[str, str] | None = None) -> LaunchSettings:
    """Parses the command line (and ``--config-file``) into LaunchSettings.

    Args:
        argv: arguments without the program name; ``sys.argv[1:]`` when None.
        environ: the environment (``HOROVOD_START_TIMEOUT`` default, the MPI Operator's slots per
            worker for ``--slots-per-host``); ``os.environ`` when None.

    Raises:
        UsageError: for any bad flag, value or config entry.
    """
    environ = dict(os.environ if environ is None else environ)
    ns = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    given = {k: v for k, v in vars(ns).items() if v is not None}
    if given.pop("gloo", None):
        raise UsageError("--gloo is not available: smdist_tf starts ranks with MPI only")
    given.pop("mpi", None)

    merged: dict[str, Any] = {}
    ignored: list[str] = []
    if ns.config_file:
        checks.check_path(ns.config_file, "--config-file")
        from_file, ignored = config_values(load_config_file(ns.config_file), ns.config_file)
        for name, value in from_file.items():
            merged[name] = _coerce(name, value, _FIELD_TYPES[name], f"config file {ns.config_file}")
    merged.update(given)  # the command line wins over the file

    settings = LaunchSettings(ignored_config=ignored, config_file=ns.config_file)
    settings.command = list(merged.pop("command", []))
    if settings.command[:1] == ["--"]:
        settings.command = settings.command[1:]
    version = merged.pop("version", False)
    if "log_level" in merged and str(merged["log_level"]).upper() not in LOG_LEVELS:
        raise UsageError(f"log level must be one of {', '.join(LOG_LEVELS)}, got {merged['log_level']!r}")
    settings.warnings = flag_warnings(merged)
    for name, value in merged.items():
        if name in ("config_file",):
            continue
        if name == "network_interfaces":
            # horovodrun takes --network-interface once per interface, or a comma-separated list.
            value = split_interfaces(",".join(value) if isinstance(value, list) else str(value))
        elif name == "mpi_args":
            try:
                value = shlex.split(str(value))
            except ValueError as e:
                raise UsageError(f"--mpi-args: {e}") from None
        elif name == "log_level":
            value = str(value).upper()
        setattr(settings, name, value)
    settings.show_version = bool(version)
    if "start_timeout" not in merged and environ.get("HOROVOD_START_TIMEOUT"):
        settings.start_timeout = _coerce("HOROVOD_START_TIMEOUT", environ["HOROVOD_START_TIMEOUT"], float, "environment")
    if "elastic_timeout" not in merged and environ.get("HOROVOD_ELASTIC_TIMEOUT"):
        settings.elastic_timeout = _coerce("HOROVOD_ELASTIC_TIMEOUT", environ["HOROVOD_ELASTIC_TIMEOUT"], float, "environment")
    if "slots_per_host" not in merged and settings.host_discovery_script:
        # The MPI Operator's discover_hosts.sh prints bare pod names; its slots per worker are here.
        operator_slots = environ.get("OMPI_MCA_orte_set_default_slots") or environ.get("I_MPI_PERHOST")
        if operator_slots and operator_slots.isdigit():
            settings.slots_per_host = int(operator_slots)
    settings.verbose = bool(settings.verbose)
    settings.check_build = bool(settings.check_build)
    validate(settings)
    return settings


def validate(s: LaunchSettings) -> None:
    """Range and safety checks that argparse cannot express; raises UsageError.

    The command line, ``--config-file`` and ``smdist_tf.run`` settings all pass here, so
    a value from a file gets the same checks as one typed on the command line. Host names
    are checked where the host list is parsed. ``ssh_identity_file`` becomes the absolute
    path passed to ssh.
    """
    if s.check_build or s.show_version:
        return
    if not s.command:
        raise UsageError("missing command: give the program every rank runs, e.g. smdistrun -np 2 python train.py")
    if s.np is not None and s.np < 1:
        raise UsageError(f"-np must be at least 1, got {s.np}")
    if s.hosts and s.hostfile:
        raise UsageError("give either -H/--hosts or --hostfile, not both")
    if s.ssh_port is not None and (type(s.ssh_port) is not int or not 0 < s.ssh_port < 65536):
        raise UsageError(f"--ssh-port must be an integer 1..65535, got {s.ssh_port!r}")
    if s.ssh_identity_file is not None:
        s.ssh_identity_file = checks.check_identity_file(s.ssh_identity_file)
    for flag, path in (("--hostfile", s.hostfile), ("--output-filename", s.output_filename),
                       ("--timeline-filename", s.timeline_filename), ("--autotune-log-file", s.autotune_log_file)):
        if path is not None:
            checks.check_path(path, flag)
    if not isinstance(s.network_interfaces, list) or not all(isinstance(n, str) for n in s.network_interfaces):
        raise UsageError(f"--network-interfaces must be a list of names, got {s.network_interfaces!r}")
    for interface in s.network_interfaces:
        checks.check_interface(interface)
    if not (math.isfinite(s.start_timeout) and s.start_timeout > 0):
        raise UsageError(f"--start-timeout must be positive, got {s.start_timeout:g}")
    for name in ("fusion_threshold_mb", "cycle_time_ms", "cache_capacity",
                 "stall_check_warning_time_seconds", "stall_check_shutdown_time_seconds"):
        value = getattr(s, name)
        if value is not None and not (math.isfinite(value) and value >= 0):
            raise UsageError(f"--{name.replace('_', '-')} must be a finite number, not negative, got {value:g}")
    if s.binding_args is not None:
        try:
            shlex.split(s.binding_args)
        except ValueError as e:
            raise UsageError(f"--binding-args: {e}") from None
    if s.timeline_sample_every is not None:
        _check_int(s.timeline_sample_every, "--timeline-sample-every", 1)
    if s.autotune_warmup_samples is not None:
        _check_int(s.autotune_warmup_samples, "--autotune-warmup-samples", 0)
    if s.autotune_steps_per_sample is not None:
        _check_int(s.autotune_steps_per_sample, "--autotune-steps-per-sample", 1)
    validate_restarts(s)


def _check_int(value: Any, flag: str, least: int) -> None:
    if type(value) is not int or value < least:
        raise UsageError(f"{flag} must be an integer of at least {least}, got {value!r}")


def validate_restarts(s: LaunchSettings) -> None:
    """Checks the restart and elastic settings; makes the paths absolute (the ranks may run elsewhere).

    Raises:
        UsageError: a negative count, --min-np above --max-np, elastic flags without a
            discovery script, a discovery script beside -H/--hostfile, or a script that
            is not an executable file.
    """
    if s.max_restarts is not None:
        _check_int(s.max_restarts, "--max-restarts", 0)
    if s.elastic_dir is not None:
        s.elastic_dir = os.path.abspath(checks.check_path(s.elastic_dir, "--elastic-dir"))
    if not (isinstance(s.elastic_timeout, (int, float)) and math.isfinite(s.elastic_timeout) and s.elastic_timeout > 0):
        raise UsageError(f"--elastic-timeout must be positive, got {s.elastic_timeout!r}")
    for flag, value in (("--min-np", s.min_np), ("--max-np", s.max_np)):
        if value is not None:
            _check_int(value, flag, 1)
    _check_int(s.slots_per_host, "--slots-per-host", 1)
    if s.host_discovery_script is None:
        given = [flag for flag, value in (("--min-np", s.min_np), ("--max-np", s.max_np)) if value is not None]
        if s.slots_per_host != 1:
            given.append("--slots-per-host")
        if given:
            raise UsageError(f"{' and '.join(given)} need{'s' if len(given) == 1 else ''} --host-discovery-script "
                             "(elastic training takes its hosts from the script)")
        return
    if s.hosts or s.hostfile:
        raise UsageError("give either --host-discovery-script or -H/--hostfile, not both")
    if s.max_np is not None and min_np(s) > s.max_np:
        raise UsageError(f"{'--min-np' if s.min_np else '-np'} {min_np(s)} is larger than --max-np {s.max_np}")
    script = os.path.abspath(checks.check_path(s.host_discovery_script, "--host-discovery-script"))
    if not (os.path.isfile(script) and os.access(script, os.X_OK)):
        raise UsageError(f"--host-discovery-script {s.host_discovery_script!r} is not an executable file")
    s.host_discovery_script = script


def min_np(s: LaunchSettings) -> int:
    """The fewest ranks an elastic start waits for: --min-np, else -np, else 1 (as horovodrun)."""
    return s.min_np or s.np or 1


def effective_max_restarts(s: LaunchSettings) -> int:
    """--max-restarts, else a few restarts with a discovery script, else none."""
    if s.max_restarts is not None:
        return s.max_restarts
    return DEFAULT_DISCOVERY_RESTARTS if s.host_discovery_script else 0
