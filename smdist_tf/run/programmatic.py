"""``smdist_tf.run(fn, args=(), np=2, hosts=None)``: run a function on every rank, get the results."""

from __future__ import annotations

import os
import pickle
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable, Sequence

from smdist_tf.run.args import LaunchSettings, split_interfaces, validate
from smdist_tf.run.checks import check_environment
from smdist_tf.run.errors import UsageError
from smdist_tf.run.restarts import run_with_restarts

RANK_ENTRY = str(Path(__file__).resolve().parent / "rank_entry.py")


class RunError(RuntimeError):
    """A rank of ``smdist_tf.run`` failed; the message holds that rank's traceback."""

    def __init__(self, message: str, exit_code: int, failed_rank: int | None):
        super().__init__(message)
        self.exit_code = exit_code
        self.failed_rank = failed_rank


def run(
    fn: Callable[..., Any],
    args: Sequence[Any] = (),
    kwargs: dict[str, Any] | None = None,
    np: int = 2,
    hosts: str | None = None,
    hostfile: str | None = None,
    env: dict[str, str] | None = None,
    verbose: bool = False,
    start_timeout: float = 30.0,
    tmp_dir: str | None = None,
    **tuning: Any,
) -> list[Any]:
    """Runs ``fn(*args, **kwargs)`` on ``np`` ranks started by mpirun; returns the results by rank.

    ``fn`` and its arguments travel to the ranks with the standard ``pickle``, so
    ``fn`` must be importable by name on every rank: a module-level function of an
    importable module, or of the calling script (which is then re-imported on each
    rank without running its ``if __name__ == "__main__":`` block, as with
    ``multiprocessing``). Lambdas and nested functions cannot be pickled. The caller's
    ``sys.path`` is prepended on the ranks. ``fn`` calls ``smdist_tf.init()`` itself if
    it uses collectives. Results must be picklable.

    Results come back through files in a temporary directory, so with remote hosts
    ``tmp_dir`` must be a directory every host shares (e.g. on NFS).

    Args:
        fn: the function every rank calls.
        args: positional arguments for ``fn``.
        kwargs: keyword arguments for ``fn``.
        np: number of ranks.
        hosts: ``host:slots,...`` as for ``smdistrun -H``; this machine when None.
        hostfile: a hostfile instead of ``hosts``.
        env: extra environment variables for the ranks (names must be identifiers).
        verbose: print the mpirun command.
        start_timeout: seconds for all ranks to start.
        tmp_dir: where the job directory is created (default: the system temp dir).
        **tuning: any other ``smdistrun`` setting by its long-flag name, e.g.
            ``fusion_threshold_mb=32``, ``hierarchical_allreduce=True``, ``mpi_args="..."``,
            ``max_restarts=2`` (``fn`` then runs again on every rank after a rank failed;
            the results are those of the last attempt).

    Returns:
        ``[result of rank 0, result of rank 1, ...]``.

    Raises:
        UsageError: bad settings (nothing was started).
        RunError: a rank failed; its traceback is in the message.
    """
    settings = LaunchSettings(np=np, hosts=hosts, hostfile=hostfile, verbose=verbose, start_timeout=start_timeout)
    for name, value in tuning.items():
        if not hasattr(settings, name) or name in ("command", "check_build", "show_version", "warnings"):
            raise UsageError(f"smdist_tf.run: unknown setting {name!r}")
        if name == "mpi_args" and isinstance(value, str):
            import shlex  # noqa: PLC0415

            value = shlex.split(value)
        elif name == "network_interfaces" and isinstance(value, str):
            value = split_interfaces(value)  # as the command line does: "eth0,eth1"
        setattr(settings, name, value)
    settings.command = [sys.executable, RANK_ENTRY]
    validate(settings)
    check_environment(env or {}, "smdist_tf.run env")

    job_dir = tempfile.mkdtemp(prefix="smdist_run_", dir=tmp_dir)
    try:
        main_file = None
        if getattr(fn, "__module__", None) == "__main__":
            main_file = getattr(sys.modules["__main__"], "__file__", None)
            if not main_file:
                raise UsageError("smdist_tf.run: fn is defined in an interactive session; move it to a module")
        with open(os.path.join(job_dir, "call.pkl"), "wb") as f:
            pickle.dump({"sys_path": [p or os.getcwd() for p in sys.path], "main_file": main_file}, f)
            try:
                pickle.dump((fn, tuple(args), dict(kwargs or {})), f)
            except (pickle.PicklingError, AttributeError, TypeError) as e:
                raise UsageError(f"smdist_tf.run: cannot pickle fn or its arguments ({e}); "
                                 "fn must be a module-level function") from None

        def forget_last_attempt(_restarts: int) -> None:
            # A restarted job must not report an earlier attempt's results or tracebacks.
            for stale in Path(job_dir).glob("result.*.pkl"):
                stale.unlink()
            for stale in Path(job_dir).glob("error.*.txt"):
                stale.unlink()

        environ = {**os.environ, **(env or {})}
        job = run_with_restarts(settings, environ, rank_command=[sys.executable, RANK_ENTRY, job_dir],
                                before_attempt=forget_last_attempt)
        outcome = job.outcome
        if outcome.exit_code != 0 or job.plan is None:
            failed = outcome.failed_rank.rank if outcome.failed_rank else None
            detail = ""
            if failed is not None:
                err = Path(job_dir, f"error.{failed}.txt")
                detail = f":\n{err.read_text()}" if err.exists() else ""
            what = outcome.failed_rank.describe() if outcome.failed_rank else (outcome.reason or "the job failed")
            raise RunError(f"smdist_tf.run: {what}{detail}", outcome.exit_code, failed)
        results = []
        for rank in range(job.plan.np):
            path = Path(job_dir, f"result.{rank}.pkl")
            if not path.exists():
                raise RunError(f"smdist_tf.run: rank {rank} left no result in {job_dir} "
                               "(with remote hosts, tmp_dir must be shared)", 1, rank)
            results.append(pickle.loads(path.read_bytes()))
        return results
    finally:
        shutil.rmtree(job_dir, ignore_errors=True)
