"""smdistrun's parsing and command building, without starting mpirun (fast).

Real launches are in test_launcher_multiprocess.py.
"""

from __future__ import annotations

import os
import sys

import pytest

import smdist_tf
from smdist_tf.run import cluster, hosts
from smdist_tf.run.args import parse_args
from smdist_tf.run.config_file import parse_config_text
from smdist_tf.run.errors import UsageError
from smdist_tf.run.launcher import _NotLeader, main, plan
from smdist_tf.run.mpi_command import (
    MpiFlavour, MpiJob, build_command, exported_names, parse_version_output,
)
from smdist_tf.run.supervisor import Outcome, RankExit, Supervisor
from smdist_tf.run.tuning_env import tuning_env

OMPI5 = MpiFlavour("openmpi", 5, "5.0.11")
OMPI4 = MpiFlavour("openmpi", 4, "4.1.6")
MPICH = MpiFlavour("mpich", 0, "4.2.0")


# ---------------------------------------------------------------- the callable module

def test_run_is_both_package_and_function():
    import smdist_tf.run.launcher as launcher_module

    assert callable(smdist_tf.run)
    assert smdist_tf.run.launcher is launcher_module
    assert smdist_tf.run.main is launcher_module.main
    assert "run" in smdist_tf.__all__


# ---------------------------------------------------------------- hosts

def test_host_string():
    assert hosts.parse_host_string("a:2,b:4,c") == [hosts.Host("a", 2), hosts.Host("b", 4), hosts.Host("c", 1)]
    assert hosts.parse_host_string("a:2,a:3") == [hosts.Host("a", 5)]  # duplicates add up
    assert hosts.parse_host_string("10.0.0.1:8") == [hosts.Host("10.0.0.1", 8)]


@pytest.mark.parametrize("spec", ["a:x", "a:0", "a:2,,b", "bad host:2", ""])
def test_bad_host_string(spec):
    with pytest.raises(UsageError):
        hosts.parse_host_string(spec)


def test_hostfile(tmp_path):
    path = tmp_path / "hosts"
    path.write_text("# cluster\nnode1 slots=4\n\nnode2:2   # trailing comment\nnode3\nnode1 slots=1\n")
    assert hosts.parse_hostfile(str(path)) == [hosts.Host("node1", 5), hosts.Host("node2", 2), hosts.Host("node3", 1)]


@pytest.mark.parametrize("line", ["node1 slots", "node1 4", "node1 slots=x", "node1 slots=4 extra"])
def test_bad_hostfile_line_names_the_line(tmp_path, line):
    path = tmp_path / "hosts"
    path.write_text(f"good slots=1\n{line}\n")
    with pytest.raises(UsageError, match="line 2"):
        hosts.parse_hostfile(str(path))


def test_missing_hostfile(tmp_path):
    with pytest.raises(UsageError, match="cannot read hostfile"):
        hosts.parse_hostfile(str(tmp_path / "nope"))


def test_local_host_detection():
    assert hosts.is_local("localhost") and hosts.is_local("127.0.0.1")
    assert not hosts.is_local("192.0.2.77")  # TEST-NET-1: never one of ours
    with pytest.raises(UsageError, match="unknown host 'no-such-host.invalid'"):
        hosts.check_resolvable([hosts.Host("localhost", 1), hosts.Host("no-such-host.invalid", 1)])


# ---------------------------------------------------------------- cluster detection

def test_slurm_nodelist_expansion():
    assert cluster.expand_nodelist("n[1-3,07],gpu-a[01-02]-ib,login") == [
        "n1", "n2", "n3", "n07", "gpu-a01-ib", "gpu-a02-ib", "login"]
    assert cluster.expand_nodelist("r[1-2]c[08-09]") == ["r1c08", "r1c09", "r2c08", "r2c09"]
    assert cluster.expand_tasks_per_node("2(x3),1", 4) == [2, 2, 2, 1]
    for bad in ("n[1-3", "n1-3]", "n[a-b]"):
        with pytest.raises(UsageError):
            cluster.expand_nodelist(bad)


def test_slurm_detection_slot_sources():
    env = {"SLURM_JOB_NODELIST": "n[1-2]", "SLURM_NTASKS_PER_NODE": "4", "SLURMD_NODENAME": "n1"}
    info = cluster.detect(env)
    assert info.kind == "slurm" and info.hosts == [hosts.Host("n1", 4), hosts.Host("n2", 4)] and info.is_leader
    info = cluster.detect({"SLURM_JOB_NODELIST": "n[1-3]", "SLURM_TASKS_PER_NODE": "2(x2),1"})
    assert [h.slots for h in info.hosts] == [2, 2, 1]
    info = cluster.detect({"SLURM_JOB_NODELIST": "n[1-2]", "SLURM_NTASKS": "3"})
    assert [h.slots for h in info.hosts] == [2, 1]
    assert cluster.detect({}) is None


def test_sagemaker_detection():
    env = {"SM_HOSTS": '["algo-2", "algo-1"]', "SM_CURRENT_HOST": "algo-1", "SM_NUM_GPUS": "8"}
    info = cluster.detect(env)
    assert info.kind == "sagemaker" and info.hosts == [hosts.Host("algo-1", 8), hosts.Host("algo-2", 8)]
    assert info.is_leader
    env.update(SM_NUM_GPUS="0", SM_NUM_CPUS="4", SM_CURRENT_HOST="algo-2")
    info = cluster.detect(env)
    assert info.hosts[0].slots == 4 and not info.is_leader
    env.update(SM_NUM_CPUS="")
    assert cluster.detect(env).hosts[0].slots == os.cpu_count()
    with pytest.raises(UsageError, match="SM_HOSTS"):
        cluster.detect({"SM_HOSTS": "algo-1"})


def test_plan_uses_cluster_hosts_when_no_H():
    base = {k: v for k, v in os.environ.items() if not k.startswith(("SM_", "SLURM"))}
    s = parse_args(["python", "x.py"])
    p = plan(s, {**base, "SM_HOSTS": '["localhost"]', "SM_CURRENT_HOST": "localhost", "SM_NUM_GPUS": "0",
                 "SM_NUM_CPUS": "3"})
    assert p.np == 3 and p.command[p.command.index("-H") + 1] == "localhost:3"
    p = plan(s, {**base, "SLURM_JOB_NODELIST": "localhost", "SLURM_NTASKS_PER_NODE": "2"})
    assert p.np == 2 and "localhost:2" in p.command
    with pytest.raises(_NotLeader):
        plan(s, {**base, "SM_HOSTS": '["localhost", "other"]', "SM_CURRENT_HOST": "other"})
    # -H wins over the cluster's view.
    p = plan(parse_args(["-H", "127.0.0.1:1", "python", "x.py"]), {**base, "SLURM_JOB_NODELIST": "localhost"})
    assert "127.0.0.1:1" in p.command


# ---------------------------------------------------------------- config file

HOROVOD_STYLE = """
# a horovodrun-style config
controller: mpi
verbose: true
params:
  fusion_threshold_mb: 32
  cycle_time_ms: 2.5
  cache_capacity: 2048
  hierarchical_allreduce: yes
  hierarchical_allgather: false
timeline:
  filename: '/tmp/tl.json'   # quoted
  mark_cycles: true
stall_check:
  warning_time_seconds: 120
  shutdown_time_seconds: 240
logging:
  level: warning
autotune:
  enabled: true
"""


def test_config_file_maps_to_settings(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(HOROVOD_STYLE)
    s = parse_args(["--config-file", str(path), "-np", "2", "--cycle-time-ms", "7", "python", "x.py"])
    assert s.fusion_threshold_mb == 32 and s.cache_capacity == 2048 and s.hierarchical_allreduce is True
    assert s.cycle_time_ms == 7  # the command line wins
    assert s.timeline_filename == "/tmp/tl.json" and s.timeline_mark_cycles is True
    assert s.stall_check_warning_time_seconds == 120 and s.stall_check_shutdown_time_seconds == 240
    assert s.log_level == "WARNING" and s.verbose is True
    assert set(s.ignored_config) == {"params.hierarchical_allgather", "autotune.enabled"}


def test_config_flat_keys(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text('np: 3\nhosts: "localhost:3"\nmpi-args: "--report-bindings"\nnetwork_interfaces: eth0,eth1\n')
    s = parse_args(["--config-file", str(path), "python", "x.py"])
    assert s.np == 3 and s.hosts == "localhost:3" and s.mpi_args == ["--report-bindings"]
    assert s.network_interfaces == ["eth0", "eth1"]


@pytest.mark.parametrize("text, where", [
    ("params:\n  - a\n", "line 2"),
    ("params: {a: 1}\n", "line 1"),
    ("params:\n  a:\n    b: 1\n", "line 2"),
    ("params:\n\ta: 1\n", "line 2"),
    ("just text\n", "line 1"),
    ("a: 1\na: 2\n", "line 2"),
])
def test_config_outside_the_subset_is_rejected(text, where):
    with pytest.raises(UsageError, match=where):
        parse_config_text(text)


def test_config_bad_values(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("controller: gloo\n")
    with pytest.raises(UsageError, match="gloo"):
        parse_args(["--config-file", str(path), "-np", "1", "true"])
    path.write_text("params:\n  cache_capacity: lots\n")
    with pytest.raises(UsageError, match="cache_capacity"):
        parse_args(["--config-file", str(path), "-np", "1", "true"])


# ---------------------------------------------------------------- flags

def test_tuning_flags_set_both_names():
    s = parse_args(["-np", "2", "--fusion-threshold-mb", "32", "--cycle-time-ms", "3.5", "--cache-capacity", "100",
                    "--hierarchical-allreduce", "--timeline-filename", "tl.json", "--timeline-mark-cycles",
                    "--log-level", "debug", "--stall-check-warning-time-seconds", "30",
                    "--stall-check-shutdown-time-seconds", "90", "python", "train.py", "--lr", "0.1"])
    assert s.command == ["python", "train.py", "--lr", "0.1"]
    assert tuning_env(s) == {
        "SMDIST_FUSION_THRESHOLD": "33554432", "HOROVOD_FUSION_THRESHOLD": "33554432",
        "SMDIST_CYCLE_TIME": "3.5", "HOROVOD_CYCLE_TIME": "3.5",
        "SMDIST_CACHE_CAPACITY": "100", "HOROVOD_CACHE_CAPACITY": "100",
        "SMDIST_HIERARCHICAL_ALLREDUCE": "1", "HOROVOD_HIERARCHICAL_ALLREDUCE": "1",
        "SMDIST_TIMELINE": "tl.json", "HOROVOD_TIMELINE": "tl.json",
        "SMDIST_TIMELINE_MARK_CYCLES": "1", "HOROVOD_TIMELINE_MARK_CYCLES": "1",
        "SMDIST_STALL_CHECK_TIME": "30", "HOROVOD_STALL_CHECK_TIME_SECONDS": "30",
        "SMDIST_STALL_SHUTDOWN_TIME": "90", "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "90",
        "SMDIST_LOG_LEVEL": "DEBUG", "HOROVOD_LOG_LEVEL": "DEBUG",
    }
    off = parse_args(["-np", "2", "--no-hierarchical-allreduce", "--fusion-threshold-mb", "0", "true"])
    assert tuning_env(off) == {"SMDIST_HIERARCHICAL_ALLREDUCE": "0", "HOROVOD_HIERARCHICAL_ALLREDUCE": "0",
                               "SMDIST_FUSION_THRESHOLD": "0", "HOROVOD_FUSION_THRESHOLD": "0"}
    assert tuning_env(parse_args(["-np", "2", "true"])) == {}


def test_other_flags_parse():
    s = parse_args(["-np", "4", "-H", "a:2,b:2", "-p", "2222", "-i", "/k", "--start-timeout", "5",
                    "--network-interfaces", "eth0, ib0", "--output-filename", "logs", "--verbose",
                    "--mpi-args", "--mca btl ^openib -x FOO", "--mpi", "python", "t.py"])
    assert (s.np, s.hosts, s.ssh_port, s.ssh_identity_file, s.start_timeout) == (4, "a:2,b:2", 2222, "/k", 5.0)
    assert s.network_interfaces == ["eth0", "ib0"] and s.output_filename == "logs" and s.verbose
    assert s.mpi_args == ["--mca", "btl", "^openib", "-x", "FOO"]
    assert parse_args(["--network-interface", "eth1", "-np", "1", "true"]).network_interfaces == ["eth1"]
    assert parse_args(["-np", "1", "true"], environ={"HOROVOD_START_TIMEOUT": "12"}).start_timeout == 12
    assert parse_args(["--check-build"]).check_build


@pytest.mark.parametrize("argv, message", [
    (["-np", "2"], "missing command"),
    (["-np", "0", "true"], "at least 1"),
    (["--frobnicate", "-np", "2", "true"], "unrecognized"),
    (["--fusion-thresh", "3", "-np", "2", "true"], "unrecognized"),  # no abbreviations
    (["-np", "2", "-H", "a", "--hostfile", "f", "true"], "not both"),
    (["-np", "2", "--gloo", "true"], "--gloo"),
    (["-np", "2", "--log-level", "LOUD", "true"], "invalid choice"),
    (["-np", "2", "-p", "70000", "true"], "ssh-port"),
    (["-np", "2", "--cycle-time-ms", "-1", "true"], "negative"),
    (["-np", "x", "true"], "invalid int"),
])
def test_bad_arguments(argv, message):
    with pytest.raises(UsageError, match=message):
        parse_args(argv)


@pytest.mark.parametrize("argv", [
    ["-np", "2"],
    ["-np", "2", "-H", "no-such-host.invalid:2", "true"],
    ["-np", "4", "-H", "localhost:2", "true"],
    ["--bogus", "true"],
    ["true"],  # no -np and no hosts
])
def test_main_usage_errors_are_one_line_exit_2(argv, capsys):
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1 and err.startswith("smdistrun: error: ")


def test_version_and_check_build(capsys):
    assert main(["--version"]) == 0
    assert "smdist_tf" in capsys.readouterr().out
    assert main(["--check-build"]) == 0
    out = capsys.readouterr().out
    assert "[X] MPI" in out and "TensorFlow" in out and "[ ] NCCL" in out and "mpirun:" in out


# ---------------------------------------------------------------- MPI detection and commands

def test_version_output_detection():
    assert parse_version_output("mpirun (Open MPI) 5.0.11\n\nReport bugs to ...") == OMPI5
    assert parse_version_output("mpirun (Open MPI) 4.1.6\n").major == 4
    assert parse_version_output("HYDRA build details:\n    Version:  4.2.0\n").name == "mpich"
    assert parse_version_output("Intel(R) MPI Library for Linux* OS, Version 2021.10").name == "mpich"
    with pytest.raises(UsageError, match="cannot tell"):
        parse_version_output("something else 1.0")


def _job(flavour, **kw) -> MpiJob:
    defaults = dict(mpirun="mpirun", flavour=flavour, np=4, rank_command=["python", "agent.py", "--", "python", "t.py"])
    return MpiJob(**{**defaults, **kw})


def test_openmpi5_command():
    cmd = build_command(_job(OMPI5, hosts=[hosts.Host("a", 2), hosts.Host("b", 2)], ssh_port=2222,
                             ssh_identity_file="/k", network_interfaces=["eth0", "eth1"], export=["X", "Y"],
                             as_root=True, mpi_args=["--report-bindings"]))
    assert cmd[:4] == ["mpirun", "--allow-run-as-root", "-np", "4"]
    text = " ".join(cmd)
    assert "-H a:2,b:2" in text and "--bind-to none" in text and "--map-by slot" in text
    assert "--prtemca plm_ssh_args -p 2222 -i /k" in text
    assert "--mca btl_tcp_if_include eth0,eth1" in text and "--prtemca oob_tcp_if_include eth0,eth1" in text
    assert "-x X -x Y" in text and "--oversubscribe" not in text
    assert cmd[-6:] == ["--report-bindings", "python", "agent.py", "--", "python", "t.py"]


def test_openmpi_oversubscribe_binding_and_v4():
    cmd = build_command(_job(OMPI5, oversubscribe=True, mpi_args=["--bind-to", "core"]))
    assert "--oversubscribe" in cmd and cmd.count("--bind-to") == 1 and "--allow-run-as-root" not in cmd
    cmd = " ".join(build_command(_job(OMPI4, ssh_port=22, network_interfaces=["ib0"])))
    assert "--mca plm_rsh_args -p 22" in cmd and "--mca oob_tcp_if_include ib0" in cmd and "prtemca" not in cmd


def test_mpich_command():
    cmd = build_command(_job(MPICH, hosts=[hosts.Host("a", 2), hosts.Host("b", 2)], ssh_port=2222,
                             network_interfaces=["eth0"], env={"SMDIST_CYCLE_TIME": "5"},
                             export=["SMDIST_CYCLE_TIME"], oversubscribe=True))
    text = " ".join(cmd)
    assert cmd[:3] == ["mpirun", "-n", "4"] and "-hosts a:2,b:2" in text
    assert "-launcher ssh -launcher-exec ssh -p 2222" in text and "-iface eth0" in text
    assert "-genv SMDIST_CYCLE_TIME 5" in text
    assert "--oversubscribe" not in text and "-x" not in cmd and "--allow-run-as-root" not in text


def test_exported_environment():
    env = {"PATH": "/bin", "OMPI_COMM_WORLD_RANK": "0", "HOSTNAME": "h", "MY_VAR": "1", "BAD-NAME": "x"}
    assert exported_names(env, remote=False, always=["SMDIST_CYCLE_TIME"]) == ["SMDIST_CYCLE_TIME"]
    names = exported_names(env, remote=True, always=["SMDIST_CYCLE_TIME"])
    assert names == ["SMDIST_CYCLE_TIME", "MY_VAR", "PATH"]


def test_local_plan_oversubscribes_only_past_the_cores():
    cores = os.cpu_count() or 1
    few = plan(parse_args(["-np", "1", "python", "t.py"]), dict(os.environ))
    many = plan(parse_args(["-np", str(cores + 1), "--cycle-time-ms", "4", "python", "t.py"]), dict(os.environ))
    assert "--oversubscribe" not in few.command and "--oversubscribe" in many.command
    assert many.env["SMDIST_CYCLE_TIME"] == "4" and "SMDIST_CYCLE_TIME" in many.command
    assert many.command[-3:] == ["--", "python", "t.py"]
    assert sys.executable in many.command


# ---------------------------------------------------------------- supervisor bookkeeping

def test_first_unprompted_failure_is_the_cause():
    outcome = Outcome(exit_code=0)
    Supervisor._record(["start", "0", "h0"], outcome)
    Supervisor._record(["exit", "0", "143", "15", "1"], outcome)  # stopped by the launcher: not the cause
    Supervisor._record(["exit", "2", "7", "0", "0"], outcome)
    Supervisor._record(["exit", "1", "9", "0", "0"], outcome)
    Supervisor._record(["garbage"], outcome)
    assert outcome.failed_rank == RankExit(2, 7, 0, False) and outcome.started == {0: "h0"}
    assert RankExit(1, 137, 9, False).describe("n1") == "rank 1 (on n1) was killed by SIGKILL (exit code 137)"


def test_programmatic_run_rejects_unpicklable_fn():
    with pytest.raises(UsageError, match="module-level"):
        smdist_tf.run(lambda: 1, np=1)
    with pytest.raises(UsageError, match="unknown setting"):
        smdist_tf.run(print, np=1, colour="blue")
