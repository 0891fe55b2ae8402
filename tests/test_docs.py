"""The documentation runs: every runnable code block of README.md and docs/*.md, at 2 ranks.

Blocks are read from the Markdown (tests/doc_blocks.py says how a block is marked as
skipped, with a reason, or completed). The files' Python blocks run in one job under
``smdistrun -np 2`` (tests/doc_session.py), file after file, each file's blocks in order in
a namespace of their own with a fresh temporary directory as the working directory; a block marked ``launch: python`` runs as a script of
its own. Bash blocks run one by one with ``bash -euo pipefail`` from the repository root,
with every ``-np N`` changed to ``-np 2``. Everything has a timeout.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.doc_blocks import ROOT, documentation_files, read_blocks
from tests.mpi_harness import mpi_env, run_process_group

pytestmark = pytest.mark.optional_packages  # the docs' code loads scikit-learn's digits

NP = 2
SESSION_TIMEOUT_S = 900  # every file's blocks, one after another
BLOCK_TIMEOUT_S = 300
SESSION = str(ROOT / "tests" / "doc_session.py")
BLOCKS = {path: read_blocks(path) for path in documentation_files()}


def _runnable(language: str, launch: str) -> list:
    """pytest parameters (path, blocks) of the files with such blocks, named by the file."""
    found = []
    for path, blocks in BLOCKS.items():
        chosen = [b for b in blocks if b.runs and b.language == language and b.launch == launch]
        if chosen:
            found.append(pytest.param(path, chosen, id=path.name))
    return found


def _env() -> dict:
    env = mpi_env()
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"  # smdistrun, mpirun, python
    return env


def _run(argv: list[str], cwd: Path, timeout: float) -> tuple[int, str]:
    return run_process_group(argv, cwd, _env(), timeout)


def at_two_ranks(command: str) -> str:
    """A documented launch line run at this suite's rank count: ``-np 4`` becomes ``-np 2``."""
    return re.sub(r"(?<!\S)-np\s+\d+", f"-np {NP}", command)


def test_every_block_runs_or_says_why():
    """Markers are well-formed and still apply, and every runnable block is valid Python or bash."""
    runnable = 0
    for blocks in BLOCKS.values():
        for block in blocks:
            if not block.runs:
                continue
            runnable += 1
            assert block.language == "python" or block.launch == "session", f"{block.where}: launch is for Python"
            before, code, after = block.completed()
            if block.language == "python":
                for part in (before, code, after):
                    compile(part, block.where, "exec")
            else:
                script = at_two_ranks("\n".join((before, code, after)))
                check = subprocess.run(["bash", "-n", "-c", script], capture_output=True, text=True, timeout=30)
                assert check.returncode == 0, f"{block.where}: {check.stderr}"
    assert runnable >= 20, f"only {runnable} runnable blocks found: is the extraction broken?"


PYTHON_SESSIONS = _runnable("python", "session")


@pytest.fixture(scope="module")
def python_session(request, tmp_path_factory) -> tuple[int, str]:
    """One ``smdistrun -np 2`` job runs every selected file's Python blocks (exit code, output)."""
    selected = {item.callspec.params["path"] for item in request.session.items
                if item.originalname == "test_python_blocks_run_at_two_ranks"}
    files = [{"name": param.values[0].name, "blocks": [
        dict(zip(("before", "code", "after"), block.completed()), where=block.where) for block in param.values[1]]}
        for param in PYTHON_SESSIONS if param.values[0] in selected]
    workdir = tmp_path_factory.mktemp("doc_session")
    session_file = workdir / "session.json"
    session_file.write_text(json.dumps(files))
    return _run([sys.executable, "-m", "smdist_tf.run", "-np", str(NP), sys.executable, SESSION, str(session_file)],
                workdir, SESSION_TIMEOUT_S)


@pytest.mark.parametrize("path,blocks", PYTHON_SESSIONS)
def test_python_blocks_run_at_two_ranks(path, blocks, python_session):
    code, out = python_session
    if f"doc-test: file {path.name} ok" in out:
        for block in blocks:
            for rank in range(NP):
                assert f"[{rank}]<stdout>:doc-test: {block.where} ok" in out, f"{block.where} did not run:\n{out[-5000:]}"
        return
    failed = re.search(r"doc-test: (\S+):\d+ FAILED", out)
    if failed and Path(failed.group(1)).name != path.name:
        pytest.fail(f"{path.name} did not run: {failed.group(0)} ended the session before it (exit {code})")
    pytest.fail(f"{path.name}: a block failed (exit {code}):\n{out[-15000:]}")


@pytest.mark.parametrize("block", [b for param in _runnable("python", "python") for b in param.values[1]],
                         ids=lambda b: b.where)
def test_python_script_blocks_run(block, tmp_path):
    before, code, after = block.completed()
    script = tmp_path / "doc_block.py"
    script.write_text("\n".join((before, code, after)))
    exit_code, out = _run([sys.executable, str(script)], tmp_path, BLOCK_TIMEOUT_S)
    assert exit_code == 0, f"{block.where} failed (exit {exit_code}):\n{out[-15000:]}"


@pytest.mark.parametrize("path,blocks", _runnable("bash", "session"))
def test_bash_blocks_run_at_two_ranks(path, blocks):
    for block in blocks:
        before, code, after = block.completed()
        script = at_two_ranks("\n".join((before, code, after)))
        exit_code, out = _run(["bash", "-euo", "pipefail", "-c", script], ROOT, BLOCK_TIMEOUT_S)
        assert exit_code == 0, f"{block.where} failed (exit {exit_code}):\n{script}\n---\n{out[-15000:]}"
