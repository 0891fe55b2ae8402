"""smdistrun's parsing and command building, without starting mpirun (fast).

Real launches are in test_launcher_multiprocess.py.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import smdist_tf
from smdist_tf.run import cluster, hosts
from smdist_tf.run.args import DEFAULT_DISCOVERY_RESTARTS, effective_max_restarts, min_np, parse_args
from smdist_tf.run.attempt import NotLeader, plan
from smdist_tf.run.checks import check_environment
from smdist_tf.run.config_file import parse_config_text
from smdist_tf.run.errors import UsageError
from smdist_tf.run.exit_banner import ExitBannerFilter
from smdist_tf.run.host_discovery import DiscoveryError, choose_np, parse_output
from smdist_tf.run.launcher import main
from smdist_tf.run.mpi_command import (
    MpiFlavour, MpiJob, build_command, exported_names, launcher_env, parse_version_output,
)
from smdist_tf.run.rank_agent import TensorFlowStartupFilter
from smdist_tf.run.restarts import backoff_s, restart_cause
from smdist_tf.run.supervisor import Outcome, RankExit, Supervisor
from smdist_tf.run.tuning_env import tuning_env
from tests.mpi_harness import ROOT, mpi_env

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


def test_run_shows_its_real_signature():
    import inspect
    import pydoc

    from smdist_tf.run.programmatic import run

    signature = inspect.signature(smdist_tf.run)
    assert signature == inspect.signature(run)
    assert list(signature.parameters)[:5] == ["fn", "args", "kwargs", "np", "hosts"]
    assert "Calling it: ``smdist_tf.run(fn" in pydoc.render_doc(smdist_tf.run)

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


def test_slurm_heterogeneous_node_and_task_lists():
    env = {"SLURM_JOB_NODELIST": "node[01-04,07]", "SLURM_TASKS_PER_NODE": "2(x3),1,1", "SLURM_NTASKS": "8"}
    info = cluster.detect(env)
    assert [str(h) for h in info.hosts] == ["node01:2", "node02:2", "node03:2", "node04:1", "node07:1"]
    with pytest.raises(UsageError, match="gives 4 nodes, the node list has 5"):
        cluster.detect({**env, "SLURM_TASKS_PER_NODE": "2(x3),1"})
    with pytest.raises(UsageError, match="bad SLURM_TASKS_PER_NODE"):
        cluster.detect({**env, "SLURM_TASKS_PER_NODE": "2(3),1"})


def test_slurm_gpus_per_node_give_one_rank_per_gpu_unless_tasks_were_asked_for():
    # sbatch --nodes=2 --gpus-per-node=a100:4: Slurm still says one task per node.
    gpu_job = {"SLURM_JOB_NODELIST": "gpu[1-2]", "SLURM_TASKS_PER_NODE": "1(x2)", "SLURM_GPUS_PER_NODE": "a100:4"}
    assert [h.slots for h in cluster.detect(gpu_job).hosts] == [4, 4]
    assert [h.slots for h in cluster.detect({**gpu_job, "SLURM_GPUS_PER_NODE": "a100:2,v100:1"}).hosts] == [3, 3]
    assert [h.slots for h in cluster.detect({**gpu_job, "SLURM_GPUS_PER_NODE": "8"}).hosts] == [8, 8]
    # --gres=gpu:2 says it in SLURM_GPUS_ON_NODE.
    gres = {k: v for k, v in gpu_job.items() if k != "SLURM_GPUS_PER_NODE"}
    assert [h.slots for h in cluster.detect({**gres, "SLURM_GPUS_ON_NODE": "2"}).hosts] == [2, 2]
    # --ntasks-per-node or -n win: the user placed the ranks.
    assert [h.slots for h in cluster.detect({**gpu_job, "SLURM_NTASKS_PER_NODE": "2"}).hosts] == [2, 2]
    tasks = {**gpu_job, "SLURM_NTASKS": "3", "SLURM_TASKS_PER_NODE": "2,1"}
    assert [h.slots for h in cluster.detect(tasks).hosts] == [2, 1]
    with pytest.raises(UsageError, match="SLURM_GPUS_PER_NODE"):
        cluster.detect({**gpu_job, "SLURM_GPUS_PER_NODE": "four"})


def test_mpi_operator_hostfile_is_read_from_the_variable_mpirun_reads(tmp_path):
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("job-worker-0.job-worker.default.svc slots=4\njob-worker-1.job-worker.default.svc slots=4\n")
    launcher_pod = {"K_MPI_JOB_ROLE": "launcher", "OMPI_MCA_orte_default_hostfile": str(hostfile)}
    info = cluster.detect(launcher_pod)
    assert info.kind == "kubernetes" and info.is_leader
    assert [str(h) for h in info.hosts] == ["job-worker-0.job-worker.default.svc:4", "job-worker-1.job-worker.default.svc:4"]
    # Intel MPI's and MPICH's form (name:slots), named by their variables.
    hostfile.write_text("w-0.w.ns.svc:2\nw-1.w.ns.svc:2\n")
    for variable in ("I_MPI_HYDRA_HOST_FILE", "HYDRA_HOST_FILE", "PRTE_MCA_prte_default_hostfile"):
        info = cluster.detect({variable: str(hostfile)})
        assert info.kind == "hostfile" and [h.slots for h in info.hosts] == [2, 2]
    # SageMaker's variables come first; the hostfile before Slurm's.
    assert cluster.detect({**launcher_pod, "SLURM_JOB_NODELIST": "n1"}).kind == "kubernetes"
    with pytest.raises(UsageError, match="cannot read hostfile"):
        cluster.detect({"OMPI_MCA_orte_default_hostfile": str(tmp_path / "missing")})
    with pytest.raises(UsageError, match="line 1"):
        hostfile.write_text("w-0 slots=two\n")
        cluster.detect(launcher_pod)


def test_mpi_operator_slots_per_worker_reach_the_discovery_script(tmp_path):
    script = tmp_path / "discover_hosts.sh"
    script.write_text("#!/bin/sh\necho w-0.w.ns.svc\n")
    script.chmod(0o755)
    argv = ["--host-discovery-script", str(script), "python", "x.py"]
    assert parse_args(argv, {"OMPI_MCA_orte_set_default_slots": "4"}).slots_per_host == 4
    assert parse_args(argv, {"I_MPI_PERHOST": "2"}).slots_per_host == 2
    assert parse_args(["--slots-per-host", "3", *argv], {"OMPI_MCA_orte_set_default_slots": "4"}).slots_per_host == 3
    assert parse_args(argv, {}).slots_per_host == 1
    # Without a discovery script the operator's slots are the hostfile's business.
    assert parse_args(["-np", "2", "python", "x.py"], {"OMPI_MCA_orte_set_default_slots": "4"}).slots_per_host == 1


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


def test_plan_uses_cluster_hosts_when_no_H(tmp_path):
    base = {k: v for k, v in os.environ.items()
            if not k.startswith(("SM_", "SLURM")) and k not in cluster.HOSTFILE_VARIABLES}
    s = parse_args(["python", "x.py"])
    p = plan(s, {**base, "SM_HOSTS": '["localhost"]', "SM_CURRENT_HOST": "localhost", "SM_NUM_GPUS": "0",
                 "SM_NUM_CPUS": "3"})
    assert p.np == 3 and p.command[p.command.index("-H") + 1] == "localhost:3"
    p = plan(s, {**base, "SLURM_JOB_NODELIST": "localhost", "SLURM_NTASKS_PER_NODE": "2"})
    assert p.np == 2 and "localhost:2" in p.command
    with pytest.raises(NotLeader):
        plan(s, {**base, "SM_HOSTS": '["localhost", "other"]', "SM_CURRENT_HOST": "other"})
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("localhost slots=3\n")
    p = plan(s, {**base, "K_MPI_JOB_ROLE": "launcher", "OMPI_MCA_orte_default_hostfile": str(hostfile)})
    assert p.np == 3 and p.command[p.command.index("-H") + 1] == "localhost:3"
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
  log_file: /tmp/tune.csv
  gaussian_process_noise: 0.8
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
    assert s.autotune is True and s.autotune_log_file == "/tmp/tune.csv"
    assert set(s.ignored_config) == {"params.hierarchical_allgather", "autotune.gaussian_process_noise"}


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


def test_config_is_read_with_yaml_safe_rules():
    # Plain YAML the old subset parser refused or misread now reads as YAML says; tags that would
    # build Python objects are refused (safe_load), with the line.
    assert parse_config_text("params: # a comment\n  fusion_threshold_mb: 0x20\n  x: 'it''s'\n") == {
        "params": {"fusion_threshold_mb": 32, "x": "it's"}}
    with pytest.raises(UsageError, match="line 2: could not determine a constructor"):
        parse_config_text("np: 2\nhosts: !!python/name:os.system ''\n")


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


def test_timeline_sampling_flag_and_config_entry(tmp_path):
    s = parse_args(["-np", "2", "--timeline-filename", "tl.json", "--timeline-sample-every", "50", "true"])
    assert tuning_env(s)["SMDIST_TIMELINE_SAMPLE_EVERY"] == "50"
    config = tmp_path / "c.yaml"
    config.write_text("timeline:\n  filename: tl.json\n  sample_every: 10\n")
    assert parse_args(["-np", "2", "--config-file", str(config), "true"]).timeline_sample_every == 10
    for bad in ("0", "-3"):
        with pytest.raises(UsageError, match="--timeline-sample-every must be an integer of at least 1"):
            parse_args(["-np", "2", "--timeline-sample-every", bad, "true"])


def test_network_interfaces_bind_nccl_too():
    env = tuning_env(parse_args(["-np", "2", "--network-interfaces", "eth0,ib0", "true"]))
    assert env == {"NCCL_SOCKET_IFNAME": "eth0,ib0"}
    tuned = parse_args(["-np", "2", "--autotune", "--autotune-log-file", "tune.csv", "--autotune-warmup-samples", "0",
                        "--autotune-steps-per-sample", "5", "true"])
    assert tuning_env(tuned) == {
        "SMDIST_AUTOTUNE": "1", "HOROVOD_AUTOTUNE": "1",
        "SMDIST_AUTOTUNE_LOG": "tune.csv", "HOROVOD_AUTOTUNE_LOG": "tune.csv",
        "SMDIST_AUTOTUNE_WARMUP_SAMPLES": "0", "HOROVOD_AUTOTUNE_WARMUP_SAMPLES": "0",
        "SMDIST_AUTOTUNE_STEPS_PER_SAMPLE": "5", "HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE": "5",
    }
    with pytest.raises(UsageError, match="--autotune-steps-per-sample must be an integer of at least 1"):
        parse_args(["-np", "2", "--autotune-steps-per-sample", "0", "true"])


def test_other_flags_parse(tmp_path):
    key = tmp_path / "key"
    key.touch()
    s = parse_args(["-np", "4", "-H", "a:2,b:2", "-p", "2222", "-i", str(key), "--start-timeout", "5",
                    "--network-interfaces", "eth0, ib0", "--output-filename", "logs", "--verbose",
                    "--mpi-args", "--mca btl ^openib -x FOO", "--mpi", "python", "t.py"])
    assert (s.np, s.hosts, s.ssh_port, s.ssh_identity_file, s.start_timeout) == (4, "a:2,b:2", 2222, str(key), 5.0)
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
    # Hydra's -launcher-exec is the ssh executable alone: the options go in its environment.
    assert "-launcher ssh" in text and "-launcher-exec" not in cmd and "-iface eth0" in text
    assert "-genv SMDIST_CYCLE_TIME 5" in text
    assert "--oversubscribe" not in text and "-x" not in cmd and "--allow-run-as-root" not in text


def test_exported_environment():
    env = {"PATH": "/bin", "OMPI_COMM_WORLD_RANK": "0", "HOSTNAME": "h", "MY_VAR": "1", "BAD-NAME": "x"}
    assert exported_names(env, remote=False, always=["SMDIST_CYCLE_TIME"]) == ["SMDIST_CYCLE_TIME"]
    names = exported_names(env, remote=True, always=["SMDIST_CYCLE_TIME"])
    assert names == ["SMDIST_CYCLE_TIME", "MY_VAR", "PATH"]


@pytest.mark.parametrize("name,value,says", [
    ("SMDIST_CYCLE_TIME", "fast", "SMDIST_CYCLE_TIME='fast' is not valid"),
    ("HOROVOD_FUSION_THRESHOLD", "-3", "HOROVOD_FUSION_THRESHOLD='-3' is not valid"),
    ("SMDIST_AUTOTUNE", "maybe", "SMDIST_AUTOTUNE='maybe' is not valid"),
    ("SMDIST_BUCKET_CAP_MB", "0", "SMDIST_BUCKET_CAP_MB must be a positive number"),
    ("SMDIST_TIMELINE_SAMPLE_EVERY", "0", "SMDIST_TIMELINE_SAMPLE_EVERY='0' is not valid"),
])
@pytest.mark.wall_clock
def test_malformed_engine_settings_are_refused_before_any_rank_starts(name, value, says, monkeypatch, capsys):
    before = dict(os.environ)
    with pytest.raises(UsageError, match=re.escape(says)):
        plan(parse_args(["-np", "2", "python", "t.py"]), dict(os.environ, **{name: value}))
    assert dict(os.environ) == before  # the check borrowed this process's environment and gave it back
    monkeypatch.setenv(name, value)
    started = time.monotonic()
    assert main(["-np", "2", sys.executable, "-c", "import tensorflow"]) == 2
    assert time.monotonic() - started < 10  # no rank imported TensorFlow first
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and says in err[0], err


def test_well_formed_settings_pass_the_check():
    env = dict(os.environ, SMDIST_CYCLE_TIME="2.5", HOROVOD_FUSION_THRESHOLD="1048576", SMDIST_BUCKET_CAP_MB="0.5")
    assert plan(parse_args(["-np", "2", "python", "t.py"]), env).env["SMDIST_CYCLE_TIME"] == "2.5"


def test_exit_banners_of_open_mpi_5_and_4_are_left_out_and_other_lines_kept():
    rule = b"-" * 74 + b"\n"
    v5 = [rule, b"prterun detected that one or more processes exited with non-zero status,\n",
          b"thus causing the job to be terminated. The first process to do so was:\n", b"\n",
          b"   Process name: [prterun-vm-30258@1,0]\n", b"   Exit code:    1\n", rule]
    v4 = [rule, b"Primary job  terminated normally, but 1 process returned\n",
          b"a non-zero exit code. Per user-direction, the job has been aborted.\n", rule,
          rule, b"mpirun detected that one or more processes exited with non-zero status, thus causing\n",
          b"the job to be terminated. The first process to do so was:\n", b"  Process name: [[1,1],0]\n",
          b"  Exit code:    3\n", rule]
    other_box = [rule, b"WARNING: There was an error initializing an OpenFabrics device.\n", rule]
    kept = [b"[0]<stderr>:Traceback (most recent call last):\n", *other_box, b"smdistrun: rank 0 exited\n"]
    lines = [kept[0], *v5, *other_box, *v4, kept[-1], rule]  # a rule at the very end is kept too
    banner = ExitBannerFilter()
    out = [kept_line for line in lines for kept_line in banner.feed(line)] + banner.flush()
    assert out == kept + [rule]


def test_open_mpi_ranks_skip_the_ucx_one_sided_component_unless_the_user_chose():
    mine = plan(parse_args(["-np", "1", "python", "t.py"]), dict(os.environ, OMPI_MCA_osc="sm"))
    ours = plan(parse_args(["-np", "1", "python", "t.py"]), {k: v for k, v in os.environ.items() if k != "OMPI_MCA_osc"})
    assert ours.env["OMPI_MCA_osc"] == "^ucx" and mine.env["OMPI_MCA_osc"] == "sm"


def test_mpi4py_windows_under_smdistrun_print_no_ucx_error():
    code = "from mpi4py import MPI; w = MPI.Win.Allocate(8, comm=MPI.COMM_WORLD); w.Free(); print('window ok')"
    env = {k: v for k, v in mpi_env().items() if k != "OMPI_MCA_osc"}
    done = subprocess.run([sys.executable, "-m", "smdist_tf.run", "-np", "2", sys.executable, "-c", code],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    out = done.stdout + done.stderr
    assert done.returncode == 0 and out.count("window ok") == 2, out[-3000:]
    assert "osc_ucx" not in out and "Error" not in out, out[-3000:]


def test_local_plan_oversubscribes_only_past_the_cores():
    cores = os.cpu_count() or 1
    few = plan(parse_args(["-np", "1", "python", "t.py"]), dict(os.environ))
    many = plan(parse_args(["-np", str(cores + 1), "--cycle-time-ms", "4", "python", "t.py"]), dict(os.environ))
    assert "--oversubscribe" not in few.command and "--oversubscribe" in many.command
    assert many.env["SMDIST_CYCLE_TIME"] == "4" and "SMDIST_CYCLE_TIME" in many.command
    assert many.command[-3:] == ["--", "python", "t.py"]
    assert sys.executable in many.command


def test_agent_quiets_tensorflow_start_up_lines_unless_verbose():
    unset = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    quiet = plan(parse_args(["-np", "2", "python", "t.py"]), unset)
    users = plan(parse_args(["-np", "2", "python", "t.py"]), dict(unset, TF_CPP_MIN_LOG_LEVEL="0"))
    verbose = plan(parse_args(["-np", "2", "--verbose", "python", "t.py"]), unset)
    # By default none of them, and no INFO or WARNING lines; the user's TF_CPP_MIN_LOG_LEVEL: rank 0's, as they set it.
    assert quiet.command[-4:] == ["--quiet-tf-startup-all", "--", "python", "t.py"]
    assert quiet.env["TF_CPP_MIN_LOG_LEVEL"] == "2" and "TF_CPP_MIN_LOG_LEVEL" in quiet.command
    assert users.command[-4:] == ["--quiet-tf-startup", "--", "python", "t.py"]
    assert users.env["TF_CPP_MIN_LOG_LEVEL"] == "0"
    assert not any(a.startswith("--quiet-tf-startup") for a in verbose.command)
    assert "TF_CPP_MIN_LOG_LEVEL" not in verbose.env


def test_tensorflow_start_up_filter_takes_only_start_up_lines():
    # As TensorFlow 2.21 prints them (TF_CPP_MIN_LOG_LEVEL=0), then lines that must stay.
    start_up = [
        b"WARNING: All log messages before absl::InitializeLog() is called are written to STDERR",
        b"I0000 00:00:1795613081.366050   20408 port.cc:153] oneDNN custom operations are on. You may see "
        b"slightly different numerical results due to floating-point round-off errors.",
        b"I0000 00:00:1795613081.406146   20408 cpu_feature_guard.cc:227] This TensorFlow binary is optimized to "
        b"use available CPU instructions in performance-critical operations.",
        b"To enable the following instructions: AVX2 FMA, in other operations, rebuild TensorFlow with the "
        b"appropriate compiler flags.",
        b"E0000 00:00:1700000000.000000    1 cuda_dnn.cc:8310] Unable to register cuDNN factory: Attempting to "
        b"register factory for plugin cuDNN when one has already been registered",
    ]
    kept = [
        b"To enable the following instructions: only right after the CPU-feature line",
        b"W0000 00:00:1795613081.5   20408 op_kernel.cc:1841] OP_REQUIRES failed at allreduce",
        b"[smdist_tf rank 1] WARNING: stall: 1 collective(s) waiting",
        b"Traceback (most recent call last):",
    ]
    hide = TensorFlowStartupFilter()
    assert [hide(line) for line in start_up + kept] == [True] * len(start_up) + [False] * len(kept)


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


# ---------------------------------------------------------------- option injection (issue #21 item 6)
# Each user-supplied value that reaches mpirun or ssh is checked: a malicious one is refused
# with exit code 2 before anything starts, a legitimate one still gives the expected argv.

SMDISTRUN = str(Path(sys.executable).parent / "smdistrun")
NOT_LOCAL = "192.0.2.1"  # TEST-NET-1: resolves (it is an address) and is never this machine


def _script(path: Path, body: str) -> str:
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return str(path)


def _refused(argv: list[str], capsys, message: str) -> None:
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1 and err.startswith("smdistrun: error: ")
    assert message in err, err


@pytest.fixture
def key(tmp_path) -> str:
    path = tmp_path / "id_key"
    path.write_text("not really a key\n")
    return str(path)


def _value_after(cmd: list[str], flag: str) -> str:
    return cmd[cmd.index(flag) + 1]


@pytest.mark.parametrize("spec", [
    "-oProxyCommand=x:1", "localhost:1,-v:1", "user@host:1", "a;touch x:1", "$(id):1", "a`id`:1",
    "host name:1", "[::1:1", "fe80::1%$(id)", "a\nb:1", "'a':1",
])
def test_hosts_flag_refuses_non_host_names(spec, capsys):
    with pytest.raises(UsageError, match="bad host name"):
        hosts.parse_host_string(spec)
    _refused(["-np", "1", f"--hosts={spec}", "true"], capsys, "bad host name")


def test_hosts_flag_accepts_names_and_addresses():
    parsed = hosts.parse_host_string("node-01.cluster:4,gpu_a1,10.0.0.1:2,[::1]:2,fe80::1")
    assert [h.name for h in parsed] == ["node-01.cluster", "gpu_a1", "10.0.0.1", "[::1]", "fe80::1"]
    p = plan(parse_args(["-H", "localhost:1,127.0.0.1:1", "true"]), dict(os.environ))
    assert _value_after(p.command, "-H") == "localhost:1,127.0.0.1:1"


@pytest.mark.parametrize("line", ["-oProxyCommand=x slots=1", "user@host slots=2", "a$(id) slots=1", "a;b:1"])
def test_hostfile_refuses_non_host_names(tmp_path, line, capsys):
    path = tmp_path / "hosts"
    path.write_text(f"localhost slots=1\n{line}\n")
    with pytest.raises(UsageError, match="line 2"):
        hosts.parse_hostfile(str(path))
    _refused(["-np", "1", "--hostfile", str(path), "true"], capsys, "bad host name")


def test_cluster_host_names_are_checked():
    with pytest.raises(UsageError, match="SM_HOSTS"):
        cluster.detect({"SM_HOSTS": '["algo-1", "-oProxyCommand=x"]'})
    with pytest.raises(UsageError, match="SM_HOSTS"):
        cluster.detect({"SM_HOSTS": '["algo-1", "a b"]'})
    for nodelist in ("n[1-2],-oProxyCommand=x", "user@n1", "n$(id)"):
        with pytest.raises(UsageError, match="SLURM_JOB_NODELIST"):
            cluster.detect({"SLURM_JOB_NODELIST": nodelist})
    assert [h.name for h in cluster.detect({"SLURM_JOB_NODELIST": "gpu-[01-02]-ib"}).hosts] == ["gpu-01-ib", "gpu-02-ib"]


@pytest.mark.parametrize("name", [
    "x -oProxyCommand=touch marker", "x$(id)", "x`id`", "x'q", 'x"q', "x;y", "x\\y", "x%h", "x|y", "x\ny",
])
def test_identity_file_refuses_shell_and_split_characters(tmp_path, name, capsys):
    path = tmp_path / name
    path.write_text("")  # it exists: refused for its name alone
    _refused(["-np", "1", "-i", str(path), "true"], capsys, "--ssh-identity-file")


def test_identity_file_must_be_an_existing_regular_file(tmp_path, capsys):
    _refused(["-np", "1", "-i", str(tmp_path / "missing"), "true"], capsys, "not an existing file")
    _refused(["-np", "1", "-i", str(tmp_path), "true"], capsys, "not an existing file")  # a directory
    _refused(["-np", "1", "-i=-oProxyCommand=x", "true"], capsys, "must not start with '-'")


def test_identity_file_reaches_ssh_as_one_word(key, tmp_path, monkeypatch):
    p = plan(parse_args(["-H", "localhost:1", "-i", key, "true"]), dict(os.environ))
    assert _value_after(p.command, "plm_ssh_args") == f"-i {key}"
    monkeypatch.chdir(tmp_path)  # a relative path becomes the absolute one ssh is given
    assert parse_args(["-np", "1", "-i", "id_key", "true"]).ssh_identity_file == key


@pytest.mark.parametrize("argv, message", [
    (["-p", "0"], "1..65535"),
    (["-p", "65536"], "1..65535"),
    (["-p", "22 -oProxyCommand=x"], "invalid int"),
    (["-p=-22"], "1..65535"),
])
def test_ssh_port_must_be_a_port_number(argv, message, capsys):
    _refused(["-np", "1", *argv, "true"], capsys, message)


def test_ssh_port_and_key_give_separate_ssh_words(key):
    p = plan(parse_args(["-H", "localhost:1", "-p", "2222", "-i", key, "true"]), dict(os.environ))
    assert _value_after(p.command, "--prtemca") == "plm_ssh_args"
    assert _value_after(p.command, "plm_ssh_args") == f"-p 2222 -i {key}"


@pytest.mark.parametrize("interfaces", ["eth0;touch x", "eth0 -x", "$(id)", "-eth0", "e" * 16, "eth0`id`", 'eth"0', "eth0/24"])
def test_network_interfaces_refuse_unsafe_names(interfaces, capsys):
    _refused(["-np", "1", f"--network-interfaces={interfaces}", "true"], capsys, "bad network interface")


def test_network_interfaces_reach_mpi_as_given():
    p = plan(parse_args(["-np", "1", "--network-interfaces", "eth0, ib0,enp1s0f0", "true"]), dict(os.environ))
    assert _value_after(p.command, "btl_tcp_if_include") == "eth0,ib0,enp1s0f0"
    assert _value_after(p.command, "oob_tcp_if_include") == "eth0,ib0,enp1s0f0"


def test_environment_names_are_identifiers():
    env = {"PATH": "/bin", "MY_VAR": "1", "A=B": "x", "X;touch y": "1", "-x": "1", "2X": "1", "OK_2": "a b"}
    assert exported_names(env, remote=True, always=[]) == ["MY_VAR", "OK_2", "PATH"]
    check_environment({"MY_VAR": "1", "_X2": "a b"}, "test")
    for bad in ({"A=B": "1"}, {"-x": "1"}, {"A B": "1"}, {"X": "a\0b"}, {"X": 1}):
        with pytest.raises(UsageError, match="smdist_tf.run env"):
            check_environment(bad, "smdist_tf.run env")
    with pytest.raises(UsageError, match="bad environment variable name 'A=B'"):
        smdist_tf.run(print, np=1, env={"A=B": "1"})


@pytest.mark.parametrize("line, message", [
    ('ssh_identity_file: "/tmp/x -oProxyCommand=touch /tmp/m"', "--ssh-identity-file"),
    ('hosts: "-oProxyCommand=x:1"', "bad host name"),
    ('hosts: "a@b:1"', "bad host name"),
    ('network_interfaces: "eth0;id"', "bad network interface"),
    ("ssh_port: 0", "1..65535"),
    ("ssh_port: true", "ssh_port must be int"),
    ('ssh_port: "22 -oX"', "ssh_port must be int"),
    ('hostfile: "-x"', "must not start with '-'"),
    ('output_filename: "-x"', "must not start with '-'"),
    ('timeline:\n  filename: "-x"', "must not start with '-'"),
    ("start_timeout: nan", "--start-timeout must be positive"),
])
def test_config_file_values_get_the_same_checks(tmp_path, line, message, capsys):
    path = tmp_path / "c.yaml"
    path.write_text(line + "\n")
    _refused(["--config-file", str(path), "-np", "1", "true"], capsys, message)


def test_config_file_ssh_settings_reach_ssh(tmp_path, key):
    path = tmp_path / "c.yaml"
    path.write_text(f'ssh_port: 2222\nssh_identity_file: "{key}"\nhosts: localhost:1\nnetwork_interfaces: lo\n')
    p = plan(parse_args(["--config-file", str(path), "true"]), dict(os.environ))
    assert _value_after(p.command, "plm_ssh_args") == f"-p 2222 -i {key}"
    assert _value_after(p.command, "btl_tcp_if_include") == "lo"


@pytest.mark.parametrize("argv, message", [
    (["--config-file=-x"], "must not start with '-'"),
    (["--output-filename=-x"], "must not start with '-'"),
    (["--timeline-filename", "a\nb"], "control characters"),
    (["--start-timeout", "nan"], "--start-timeout"),
    (["--fusion-threshold-mb", "inf"], "finite"),
])
def test_other_values_are_checked(argv, message, capsys):
    _refused([*argv, "-np", "1", "true"], capsys, message)


def test_command_builders_refuse_unchecked_values():
    # Whoever builds an MpiJob, nothing unsafe lands in a string MPI splits.
    for flavour in (OMPI5, MPICH):
        with pytest.raises(UsageError):
            build_command(_job(flavour, ssh_identity_file="/k -oProxyCommand=x"))
        with pytest.raises(UsageError):
            build_command(_job(flavour, network_interfaces=["eth0 -x"]))


def test_mpich_ssh_options_go_to_hydra_environment():
    job = _job(MPICH, ssh_port=2222, ssh_identity_file="/k")
    assert launcher_env(job) == {"HYDRA_LAUNCHER_EXTRA_ARGS": "-p 2222 -i /k",
                                 "I_MPI_HYDRA_BOOTSTRAP_EXEC_EXTRA_ARGS": "-p 2222 -i /k"}
    assert launcher_env(_job(MPICH)) == {} and launcher_env(_job(OMPI5, ssh_port=2222)) == {}


def test_programmatic_settings_are_checked(key):
    with pytest.raises(UsageError, match="ssh-port"):
        smdist_tf.run(print, np=1, ssh_port="22 -oProxyCommand=x")
    with pytest.raises(UsageError, match="--ssh-identity-file"):
        smdist_tf.run(print, np=1, ssh_identity_file=key + " -oProxyCommand=x")
    with pytest.raises(UsageError, match="bad network interface"):
        smdist_tf.run(print, np=1, network_interfaces="eth0,$(id)")


def test_identity_file_cannot_smuggle_ssh_options(tmp_path):
    # The real console script and mpirun. Before the fix, Open MPI split
    # "-i KEY -oProxyCommand=CMD" on whitespace and ssh ran CMD on this machine.
    marker = tmp_path / "proxy_command_ran"
    proxy = _script(tmp_path / "proxy", f"touch {marker}\n")
    smuggling_key = Path(f"{tmp_path}/x -oProxyCommand={proxy}")
    smuggling_key.parent.mkdir(parents=True)
    smuggling_key.touch()  # it exists: refused for its name alone
    done = subprocess.run(
        [SMDISTRUN, "--start-timeout", "10", "-np", "2", "-i", str(smuggling_key),
         "-H", f"localhost:1,{NOT_LOCAL}:1", "true"],
        capture_output=True, text=True, timeout=60)
    assert not marker.exists()
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("smdistrun: error: --ssh-identity-file") and len(done.stderr.splitlines()) == 1


def test_ssh_receives_port_and_key_as_separate_arguments(tmp_path, key):
    # A stand-in for ssh records the argv Open MPI gives it for the remote host, then fails.
    argv_file = tmp_path / "argv"
    agent = _script(tmp_path / "agent", f'printf "%s\\n" "$@" > {argv_file}\nexit 1\n')
    done = subprocess.run(
        [SMDISTRUN, "--start-timeout", "10", "-np", "2", "-p", "2222", "-i", key,
         "-H", f"localhost:1,{NOT_LOCAL}:1", f"--mpi-args=--prtemca plm_ssh_agent {agent}", "true"],
        capture_output=True, text=True, timeout=60)
    assert done.returncode not in (0, 2), done.stderr
    assert argv_file.read_text().splitlines()[:5] == ["-p", "2222", "-i", key, NOT_LOCAL]


# ---------------------------------------------------------------- restarts and elastic flags

def test_restart_flags_and_their_defaults(tmp_path):
    s = parse_args(["-np", "2", "true"], environ={})
    assert (s.max_restarts, s.elastic_dir, s.host_discovery_script) == (None, None, None)
    assert effective_max_restarts(s) == 0 and s.elastic_timeout == 600
    s = parse_args(["-np", "2", "--max-restarts", "3", "--elastic-dir", "rel/dir", "true"], environ={})
    assert effective_max_restarts(s) == 3 and s.elastic_dir == os.path.abspath("rel/dir")
    assert parse_args(["-np", "2", "--reset-limit", "4", "true"], environ={}).max_restarts == 4  # horovodrun's name

    script = _script(tmp_path / "discover", "echo localhost:2\n")
    s = parse_args(["--min-np", "2", "--max-np", "4", "--slots-per-host", "2", "--host-discovery-script", script,
                    "true"], environ={"HOROVOD_ELASTIC_TIMEOUT": "30"})
    assert (s.min_np, s.max_np, s.slots_per_host, s.elastic_timeout) == (2, 4, 2, 30.0)
    assert effective_max_restarts(s) == DEFAULT_DISCOVERY_RESTARTS == 3  # discovery without --max-restarts
    assert effective_max_restarts(parse_args(["--max-restarts", "0", "--host-discovery-script", script, "true"])) == 0
    assert min_np(parse_args(["-np", "3", "--host-discovery-script", script, "true"])) == 3  # -np is the minimum
    assert min_np(parse_args(["--host-discovery-script", script, "true"])) == 1


def test_restart_settings_from_a_config_file(tmp_path):
    script = _script(tmp_path / "discover", "echo localhost:2\n")
    path = tmp_path / "c.yaml"
    path.write_text(f"max-restarts: 2\nelastic_dir: {tmp_path}/commits\nhost_discovery_script: {script}\n"
                    "min_np: 2\nmax_num_proc: 3\nelastic_timeout: 5\n")
    s = parse_args(["--config-file", str(path), "--max-np", "4", "true"], environ={})
    assert (s.max_restarts, s.elastic_dir, s.host_discovery_script) == (2, f"{tmp_path}/commits", script)
    assert (s.min_np, s.max_np, s.elastic_timeout) == (2, 4, 5.0)  # the command line wins


@pytest.mark.parametrize("make_argv, message", [
    (lambda script: ["-np", "2", "--max-restarts", "-1"], "--max-restarts must be an integer of at least 0"),
    (lambda script: ["-np", "2", "--min-np", "2"], "--min-np needs --host-discovery-script"),
    (lambda script: ["-np", "2", "--max-np", "2", "--slots-per-host", "2"],
     "--max-np and --slots-per-host need --host-discovery-script"),
    (lambda script: ["--host-discovery-script", script, "-H", "localhost:2"],
     "either --host-discovery-script or -H/--hostfile"),
    (lambda script: ["--host-discovery-script", script, "--min-np", "3", "--max-np", "2"],
     "--min-np 3 is larger than --max-np 2"),
    (lambda script: ["--host-discovery-script", script, "-np", "4", "--max-np", "2"], "-np 4 is larger than --max-np 2"),
    (lambda script: ["--host-discovery-script", script, "--min-np", "0"], "--min-np must be an integer of at least 1"),
    (lambda script: ["--host-discovery-script", script, "--slots-per-host", "0"], "--slots-per-host must be"),
    (lambda script: ["--host-discovery-script", script, "--elastic-timeout", "0"], "--elastic-timeout must be positive"),
    (lambda script: ["--host-discovery-script", script, "--elastic-timeout", "nan"], "--elastic-timeout must be positive"),
    (lambda script: ["--host-discovery-script", script + ".missing"], "is not an executable file"),
    (lambda script: ["--host-discovery-script=-x"], "must not start with '-'"),
    (lambda script: ["-np", "2", "--elastic-dir", "a\nb"], "control characters"),
])
def test_restart_and_elastic_values_are_checked(make_argv, message, tmp_path, capsys):
    script = _script(tmp_path / "discover", "echo localhost:2\n")
    _refused([*make_argv(script), "true"], capsys, message)


def test_discovery_script_must_be_executable(tmp_path, capsys):
    script = tmp_path / "discover"
    script.write_text("echo localhost:2\n")  # not executable
    _refused(["--host-discovery-script", str(script), "true"], capsys, "is not an executable file")


def test_programmatic_restart_settings_are_checked():
    with pytest.raises(UsageError, match="--max-restarts must be an integer"):
        smdist_tf.run(print, np=1, max_restarts="2")
    with pytest.raises(UsageError, match="--min-np needs --host-discovery-script"):
        smdist_tf.run(print, np=1, min_np=1)


def test_discovery_output_is_read_like_a_host_list():
    hosts_found = parse_output("node1:4\n\n  node2  \n10.0.0.7:2\nnode1:2\n[fe80::1]:3\n", 2, "d")
    assert hosts_found == [hosts.Host("node1", 6), hosts.Host("node2", 2), hosts.Host("10.0.0.7", 2),
                           hosts.Host("[fe80::1]", 3)]
    assert parse_output("", 1, "d") == []
    for bad in ("node1:x", "-oProxyCommand=x:1", "a:1,b:1", "user@node:1", "node:0"):
        with pytest.raises(DiscoveryError, match="printed a bad line 2"):
            parse_output(f"ok:1\n{bad}\n", 1, "d")


def test_np_is_the_discovered_slots_within_min_and_max():
    found = [hosts.Host("a", 2), hosts.Host("b", 3)]
    assert choose_np(found, 1, None) == 5
    assert choose_np(found, 2, 4) == 4
    assert choose_np(found, 6, None) is None and choose_np([], 1, None) is None


def test_restart_backoff_doubles_up_to_a_cap():
    assert [backoff_s(n) for n in range(1, 8)] == [1, 2, 4, 8, 16, 30, 30]


def test_only_rank_failures_are_restarted():
    failed = RankExit(rank=1, code=137, signal=9, stopped=False)
    assert restart_cause(Outcome(0)) is None
    assert restart_cause(Outcome(137, failed_rank=failed, started={1: "node7"})) == (
        "rank 1 (on node7) was killed by SIGKILL (exit code 137)")
    assert restart_cause(Outcome(3, reason="mpirun exited with code 3")) == "mpirun exited with code 3"
    assert restart_cause(Outcome(130, failed_rank=failed, interrupted_by=signal.SIGINT)) is None  # Ctrl-C
    assert restart_cause(Outcome(143, interrupted_by=signal.SIGTERM)) is None
    assert restart_cause(Outcome(1, reason="only 1 of 2 ranks started", start_timed_out=True)) is None


def test_plan_exports_the_restart_variables_to_every_rank():
    s = parse_args(["-np", "2", "-H", f"localhost:1,{NOT_LOCAL}:1", "true"], environ={})
    p = plan(s, dict(os.environ), rank_env={"SMDIST_RESTART_COUNT": "1", "SMDIST_ELASTIC_DIR": "/shared/commits"})
    exported = [p.command[i + 1] for i, word in enumerate(p.command) if word == "-x"]
    assert "SMDIST_RESTART_COUNT" in exported and "SMDIST_ELASTIC_DIR" in exported
    assert p.env["SMDIST_RESTART_COUNT"] == "1" and p.env["SMDIST_ELASTIC_DIR"] == "/shared/commits"
