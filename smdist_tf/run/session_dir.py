"""A private session-directory base for each Open MPI job started on this machine.

Open MPI 5's mpirun keeps its PMIx rendezvous files in ``$TMPDIR/ompi.<pid>/``
and removes them only on a clean exit. A job that was killed (a timeout, an OOM
kill, a stopped launcher) leaves the directory behind; when a later mpirun is
given the same pid (pids wrap at 32768 on many machines) its PMIx listener finds
the old files and the job dies at start with "The PMIx server's listener thread
failed to start". A fresh base directory per job makes that collision
impossible, and removing it afterwards leaves nothing behind even after a kill.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from typing import Iterator, Mapping

from smdist_tf.run.mpi_command import MpiFlavour

# PRRTE's MCA parameter, as an environment variable, naming the session-directory base.
BASE_VARIABLE = "PRTE_MCA_prte_tmpdir_base"


def session_base_variable(flavour: MpiFlavour, environ: Mapping[str, str], remote: bool) -> str | None:
    """The variable to point at a private base, or None where we leave the choice to MPI.

    None for MPICH and Open MPI before 5 (no PRRTE), for jobs reaching other hosts (the
    directory would be created there too, and only this machine's could be removed), and
    when the user chose a base already.
    """
    if flavour.name != "openmpi" or flavour.major < 5 or remote or BASE_VARIABLE in environ:
        return None
    return BASE_VARIABLE


@contextlib.contextmanager
def private_session_base(variable: str | None, env: Mapping[str, str]) -> Iterator[dict[str, str]]:
    """Yields ``env`` with ``variable`` set to a new empty directory, removed on exit."""
    if variable is None:
        yield dict(env)
        return
    base = tempfile.mkdtemp(prefix="smdist-mpi-", dir=env.get("TMPDIR") or None)
    try:
        yield {**env, variable: base}
    finally:
        shutil.rmtree(base, ignore_errors=True)
