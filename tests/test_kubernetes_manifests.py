"""The Kubernetes example (examples/kubernetes/, docs/kubernetes.md): the MPIJob manifests parse, and they and
the image name only what exists. No cluster runs here: tests/test_launcher_multiprocess.py replays a launcher
pod on two network-namespace hosts."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import yaml

from smdist_tf.run.args import parse_args
from tests.doc_blocks import read_blocks

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "kubernetes"
MANIFESTS = sorted(EXAMPLE.glob("mpijob-*.yaml"))
IMAGE_ROOT = "/opt/smdist_tf"  # where the Dockerfile puts this project


def containers(job: dict, replica: str) -> list[dict]:
    return job["spec"]["mpiReplicaSpecs"][replica]["template"]["spec"]["containers"]


def test_there_are_cpu_and_gpu_manifests():
    assert [m.name for m in MANIFESTS] == ["mpijob-cpu.yaml", "mpijob-gpu.yaml"]


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
def test_manifest_is_an_mpijob_the_launcher_can_run(path):
    job = yaml.safe_load(path.read_text())
    assert (job["apiVersion"], job["kind"]) == ("kubeflow.org/v2beta1", "MPIJob")
    spec = job["spec"]
    assert spec["mpiImplementation"] == "OpenMPI" and spec["sshAuthMountPath"] == "/root/.ssh"
    assert spec["launcherCreationPolicy"] == "WaitForWorkersReady"
    assert spec["mpiReplicaSpecs"]["Launcher"]["replicas"] == 1 and spec["mpiReplicaSpecs"]["Worker"]["replicas"] >= 1
    (launcher,), (worker,) = containers(job, "Launcher"), containers(job, "Worker")
    assert launcher["image"] == worker["image"], "one image serves both pods"
    assert worker["command"] == ["/usr/sbin/sshd", "-De"]
    # The launcher's command is smdistrun with flags it takes, no -H or -np (the hostfile gives them),
    # running a script that exists in the image.
    command = launcher["command"]
    assert command[0] == "smdistrun"
    settings = parse_args(command[1:], environ={})
    assert settings.hosts is None and settings.hostfile is None and settings.np is None
    assert settings.command[0] == "python"
    script = settings.command[1]
    assert script.startswith(IMAGE_ROOT + "/") and (ROOT / script[len(IMAGE_ROOT) + 1:]).is_file(), script
    gpus = worker["resources"]["limits"].get("nvidia.com/gpu")
    if gpus is not None:
        assert gpus == spec["slotsPerWorker"], "one rank per GPU"
        assert "local_rank()" in (ROOT / script[len(IMAGE_ROOT) + 1:]).read_text(), "the script pins a GPU per rank"


def test_dockerfile_names_only_what_exists():
    text = (EXAMPLE / "Dockerfile").read_text()
    assert re.search(rf"^WORKDIR {IMAGE_ROOT}$", text, re.M) and re.search(r"^COPY \. \.$", text, re.M)
    assert f"PATH={IMAGE_ROOT}/.venv/bin:" in text  # bootstrap.sh builds into .venv
    assert "openssh-server" in text  # /usr/sbin/sshd, the workers' command
    for path in re.findall(r"\b((?:scripts|examples)/[\w./-]+)", text):
        assert (ROOT / path).exists(), path
    # The build argument picks bootstrap.sh's variant.
    assert "SMDIST_GPU=${SMDIST_GPU} PYTHON=python3.11 bash scripts/bootstrap.sh" in text
    assert 'gpu="${SMDIST_GPU:-' in (ROOT / "scripts" / "bootstrap.sh").read_text()
    build = re.search(r"docker build -f (\S+)", text)
    assert build and (ROOT / build.group(1)).is_file()


def test_the_docs_show_these_very_files():
    blocks = {b.language: [] for b in read_blocks(ROOT / "docs" / "kubernetes.md")}
    for b in read_blocks(ROOT / "docs" / "kubernetes.md"):
        blocks[b.language].append(b.code)
    assert blocks["dockerfile"] == [(EXAMPLE / "Dockerfile").read_text()]
    assert blocks["yaml"] == [m.read_text() for m in MANIFESTS]
    # The elastic launch line takes flags smdistrun has.
    (elastic,) = blocks["bash"]
    argv = shlex.split(elastic.replace("\\\n", " "))
    assert argv[0] == "smdistrun"
    assert "/etc/mpi/discover_hosts.sh" in argv
    flags = {a for a in argv if a.startswith("--")}
    assert flags <= {"--min-np", "--max-np", "--host-discovery-script", "--elastic-dir"}
