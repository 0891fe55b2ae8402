"""horovodrun's flags and Horovod's variables under smdistrun: each works, or is accepted with one warning.

The flags are those of Horovod 0.28's ``horovod/runner/launch.py``; docs/migrate-from-horovod.md has the
table. Argument parsing and the built command or environment are checked in this process; one real launch
(standard-library ranks, no TensorFlow) shows the warnings, timestamps and ``--tcp`` on the way to the ranks.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys

import pytest

from smdist_tf.run.args import parse_args
from smdist_tf.run.attempt import plan
from smdist_tf.run.errors import UsageError
from smdist_tf.run.horovod_flags import FLAGS_WITHOUT_EFFECT, VARIABLES_WITHOUT_EFFECT, variable_warnings
from smdist_tf.run.launcher import main
from smdist_tf.run.mpi_command import MpiFlavour, MpiJob, build_command
from smdist_tf.run.tuning_env import tuning_env
from tests.mpi_harness import ROOT

RANKS = str(ROOT / "tests" / "mp" / "launcher_ranks.py")

# Every flag of horovodrun 0.28 (runner/launch.py), with a value where it takes one.
HOROVODRUN_FLAGS = [
    ["-np", "2"], ["--num-proc", "2"], ["--disable-cache"], ["--start-timeout", "30"],
    ["--network-interfaces", "lo"], ["--network-interface", "lo"], ["--output-filename", "out"], ["--verbose"],
    ["-p", "22"], ["--ssh-port", "22"], ["--fusion-threshold-mb", "64"], ["--cycle-time-ms", "5"],
    ["--cache-capacity", "1024"], ["--hierarchical-allreduce"], ["--no-hierarchical-allreduce"],
    ["--hierarchical-allgather"], ["--no-hierarchical-allgather"], ["--autotune"], ["--no-autotune"],
    ["--autotune-log-file", "a.csv"], ["--autotune-warmup-samples", "3"], ["--autotune-steps-per-sample", "10"],
    ["--autotune-bayes-opt-max-samples", "20"], ["--autotune-gaussian-process-noise", "0.8"],
    ["--min-np", "1", "--host-discovery-script", "SCRIPT"], ["--max-np", "2", "--host-discovery-script", "SCRIPT"],
    ["--slots-per-host", "2", "--host-discovery-script", "SCRIPT"], ["--elastic-timeout", "60"],
    ["--reset-limit", "2"], ["--blacklist-cooldown-range", "10", "100"], ["--timeline-filename", "t.json"],
    ["--timeline-mark-cycles"], ["--no-timeline-mark-cycles"], ["--no-stall-check"], ["--stall-check"],
    ["--stall-check-warning-time-seconds", "60"], ["--stall-check-shutdown-time-seconds", "120"],
    ["--mpi-threads-disable"], ["--no-mpi-threads-disable"], ["--mpi-args=--report-bindings"], ["--tcp"],
    ["--binding-args=--bind-to core"], ["--num-nccl-streams", "2"], ["--thread-affinity", "0"],
    ["--gloo-timeout-seconds", "30"], ["--log-level", "INFO"], ["--log-with-timestamp"],
    ["--log-without-timestamp"], ["-prefix-timestamp"], ["--prefix-output-with-timestamp"],
    ["--log-hide-timestamp"], ["--no-log-hide-timestamp"], ["-H", "localhost:2"], ["--hosts", "localhost:2"],
    ["--mpi"], ["--jsrun"], ["-cb"], ["--check-build"], ["--config-file", "CONFIG"], ["-v"], ["--version"],
]
# Taking them for granted, with a value, and warning once: argv for each flag of FLAGS_WITHOUT_EFFECT.
NO_EFFECT_ARGV = {
    "hierarchical_allgather": ["--hierarchical-allgather"],
    "autotune_bayes_opt_max_samples": ["--autotune-bayes-opt-max-samples", "20"],
    "autotune_gaussian_process_noise": ["--autotune-gaussian-process-noise", "0.8"],
    "blacklist_cooldown_range": ["--blacklist-cooldown-range", "10", "100"],
    "mpi_threads_disable": ["--mpi-threads-disable"],
    "num_nccl_streams": ["--num-nccl-streams", "2"],
    "thread_affinity": ["--thread-affinity", "0"],
    "gloo_timeout_seconds": ["--gloo-timeout-seconds", "30"],
    "log_with_timestamp": ["--log-with-timestamp"],
    "jsrun": ["--jsrun"],
}
OPEN_MPI_5 = MpiFlavour("openmpi", 5, "5.0.11")


def command_of(argv: list[str], flavour: MpiFlavour = OPEN_MPI_5) -> list[str]:
    s = parse_args(["-np", "2", *argv, "python", "x.py"])
    job = MpiJob(mpirun="mpirun", flavour=flavour, np=2, rank_command=["python", "x.py"],
                 mpi_args=shlex.split(s.binding_args or "") + s.mpi_args, tcp_only=s.tcp)
    return build_command(job)


@pytest.mark.parametrize("argv", HOROVODRUN_FLAGS, ids=lambda a: a[0])
def test_every_horovodrun_flag_is_taken(argv, tmp_path):
    script = tmp_path / "discover.sh"
    script.write_text("#!/bin/sh\necho localhost:2\n")
    script.chmod(0o755)
    config = tmp_path / "c.yaml"
    config.write_text("verbose: true\n")
    argv = [{"SCRIPT": str(script), "CONFIG": str(config)}.get(a, a) for a in argv]
    parse_args([*argv, "python", "x.py"], environ={})


def test_the_table_lists_every_flag_without_effect():
    assert set(NO_EFFECT_ARGV) == set(FLAGS_WITHOUT_EFFECT)


@pytest.mark.parametrize("field", sorted(FLAGS_WITHOUT_EFFECT))
def test_a_flag_without_effect_warns_once_and_changes_nothing(field):
    argv = NO_EFFECT_ARGV[field]
    s = parse_args(["-np", "2", *argv, "python", "x.py"])
    (warning,) = s.warnings
    assert warning.startswith(f"{FLAGS_WITHOUT_EFFECT[field][0]} has no effect with smdist_tf: ")
    assert tuning_env(s) == {}
    assert command_of(argv) == command_of([])


@pytest.mark.parametrize("argv", [["--disable-cache"], ["--no-hierarchical-allgather"], ["--no-mpi-threads-disable"],
                                  ["--log-without-timestamp"], ["--log-hide-timestamp"], ["--stall-check"]],
                         ids=lambda a: a[0])
def test_flags_that_say_what_smdist_tf_does_anyway_are_silent(argv):
    s = parse_args(["-np", "2", *argv, "python", "x.py"])
    assert s.warnings == [] and tuning_env(s) == {} and command_of(argv) == command_of([])


@pytest.mark.parametrize("name", sorted(VARIABLES_WITHOUT_EFFECT))
def test_a_variable_without_effect_warns_once(name):
    (warning,) = variable_warnings({name: "1", "HOROVOD_CYCLE_TIME": "5"})
    assert warning.startswith(f"{name}=1 has no effect with smdist_tf: ")


def test_controller_and_cpu_operations_warn_unless_mpi():
    assert variable_warnings({"HOROVOD_CONTROLLER": "mpi", "HOROVOD_CPU_OPERATIONS": "MPI"}) == []
    warnings = variable_warnings({"HOROVOD_CONTROLLER": "gloo", "HOROVOD_CPU_OPERATIONS": "ccl"})
    assert [w.split("=")[0] for w in warnings] == ["HOROVOD_CONTROLLER", "HOROVOD_CPU_OPERATIONS"]


def test_no_stall_check_turns_the_engines_stall_inspector_off():
    env = tuning_env(parse_args(["-np", "2", "--no-stall-check", "true"]))
    assert env == {"HOROVOD_STALL_CHECK_DISABLE": "1"}
    # The engine reads it (with no TensorFlow: the runtime module alone, a job of one).
    probe = ("import sys; sys.modules['tensorflow'] = None\n"
             "from smdist_tf import _runtime as rt\n"
             "rt.init(); c = rt.config(); print(c['stall_check_seconds'], c['stall_shutdown_seconds']); rt.shutdown()")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, cwd=ROOT,
                          env={**os.environ, **env, "SMDIST_STALL_SHUTDOWN_TIME": "30"})
    assert done.returncode == 0 and done.stdout.split() == ["0.0", "0.0"], done.stdout + done.stderr


def test_no_timeline_mark_cycles_and_no_autotune_turn_them_off():
    env = tuning_env(parse_args(["-np", "2", "--no-timeline-mark-cycles", "--no-autotune", "true"]))
    assert env["SMDIST_TIMELINE_MARK_CYCLES"] == "0" and env["SMDIST_AUTOTUNE"] == "0"


def test_tcp_keeps_open_mpi_and_nccl_on_tcp():
    cmd = command_of(["--tcp"])
    assert cmd[cmd.index("pml") - 1:cmd.index("pml") + 4] == ["--mca", "pml", "ob1", "--mca", "btl"]
    assert cmd[cmd.index("btl") + 1] == "self,sm,tcp"
    v4 = command_of(["--tcp"], MpiFlavour("openmpi", 4, "4.1.5"))
    assert v4[v4.index("btl") + 1] == "self,vader,tcp"
    # The user's own transport choice wins.
    mine = command_of(["--tcp", "--mpi-args=--mca btl self,tcp"])
    assert mine.count("btl") == 1 and "pml" not in mine
    assert tuning_env(parse_args(["-np", "2", "--tcp", "true"])) == {"NCCL_IB_DISABLE": "1"}


def test_binding_args_replace_the_default_binding():
    p = plan(parse_args(["-np", "2", "--binding-args=--bind-to core --map-by socket", "python", "x.py"]))
    cmd = p.command
    assert cmd[cmd.index("--bind-to") + 1] == "core" and cmd[cmd.index("--map-by") + 1] == "socket"
    assert cmd.count("--bind-to") == 1 and cmd.count("--map-by") == 1
    with pytest.raises(UsageError, match="--binding-args"):
        parse_args(["-np", "2", "--binding-args", "--bind-to 'core", "true"])


def test_network_interface_may_be_given_once_per_interface():
    s = parse_args(["-np", "2", "--network-interface", "eth0", "--network-interface", "eth1,ib0", "true"])
    assert s.network_interfaces == ["eth0", "eth1", "ib0"]


def test_prefix_timestamp_reaches_the_rank_agent():
    for flag in ("-prefix-timestamp", "--prefix-output-with-timestamp"):
        p = plan(parse_args(["-np", "2", flag, "python", "x.py"]))
        assert "--timestamp-output" in p.command[:p.command.index("--")]  # the agent's options, before the rank's
    assert "--timestamp-output" not in plan(parse_args(["-np", "2", "python", "x.py"])).command


def test_a_horovodrun_line_runs_with_one_warning_each(monkeypatch, capfd):
    """The real launch: flags and a variable with no effect warn once each; --tcp, timestamps and
    --no-stall-check reach the ranks."""
    monkeypatch.setenv("HOROVOD_ENABLE_ASYNC_COMPLETION", "1")
    code = main(["-np", "2", "--tcp", "-prefix-timestamp", "--thread-affinity", "0", "--no-stall-check",
                 "--disable-cache", sys.executable, RANKS, "echo", "horovodrun-line"])
    out, err = capfd.readouterr()
    assert code == 0, err
    warnings = [line for line in err.splitlines() if line.startswith("smdistrun: warning: ")]
    assert len(warnings) == 2, err
    assert warnings[0].startswith("smdistrun: warning: --thread-affinity has no effect")
    assert warnings[1].startswith("smdistrun: warning: HOROVOD_ENABLE_ASYNC_COMPLETION=1 has no effect")
    stamp = r"\w{3} \w{3} [ \d]\d \d\d:\d\d:\d\d \d{4}"
    for r in range(2):
        assert re.search(rf"^{stamp}\[{r}\]<stdout>:hello {r} horovodrun-line$", out, re.M), out
        assert re.search(rf"^{stamp}\[{r}\]<stderr>:problem {r}$", err, re.M), err
