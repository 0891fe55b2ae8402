"""One rank of ``smdist_tf.run(fn, ...)`` (started by path, standard library only).

Reads ``call.pkl`` from the job directory given as the only argument, calls the
function, and writes ``result.<rank>.pkl`` (or ``error.<rank>.txt`` with the
traceback, exiting 1, or with the code ``fn`` passed to ``sys.exit``).
"""

from __future__ import annotations

import os
import pickle
import runpy
import sys
import traceback


def _rank() -> int:
    for var in ("OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK"):
        if os.environ.get(var, "").isdigit():
            return int(os.environ[var])
    return 0


def _write_atomically(path: str, data: bytes) -> None:
    # The launcher must never read a half-written result.
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def main(job_dir: str) -> int:
    rank = _rank()
    try:
        with open(os.path.join(job_dir, "call.pkl"), "rb") as f:
            header = pickle.load(f)  # plain data: paths to import from first
            for entry in reversed(header["sys_path"]):
                if entry not in sys.path:
                    sys.path.insert(0, entry)
            if header.get("main_file"):
                # fn lives in the caller's script: load it the way multiprocessing's
                # spawn does, as a module that is not __main__ (its main block stays off).
                main_module = type(sys)("__mp_main__")
                main_module.__dict__.update(runpy.run_path(header["main_file"], run_name="__mp_main__"))
                sys.modules["__main__"] = sys.modules["__mp_main__"] = main_module
            fn, args, kwargs = pickle.load(f)
        result = fn(*args, **kwargs)
        _write_atomically(os.path.join(job_dir, f"result.{rank}.pkl"), pickle.dumps(result))
    except BaseException as e:  # noqa: BLE001 - report everything, including SystemExit
        _write_atomically(os.path.join(job_dir, f"error.{rank}.txt"), traceback.format_exc().encode())
        if isinstance(e, SystemExit):
            # fn called sys.exit(code): the rank exits with that code (no result to return).
            return e.code if isinstance(e.code, int) and e.code != 0 else 1
        # The hook, not print_exc: smdist_tf's shortens a failure that only echoes another rank's.
        sys.excepthook(*sys.exc_info())
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
