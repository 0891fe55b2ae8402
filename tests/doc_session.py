"""Runs the Markdown files' Python blocks on every rank, one file after another (started by tests/test_docs.py).

``python tests/doc_session.py SESSION.json`` under ``smdistrun``: one job for all the files,
since each job costs a TensorFlow start-up per rank. A file's blocks share one namespace, as a
reader's session would (a page's later examples use the names its earlier ones define); each
file gets a fresh namespace and working directory, and the engine is shut down after it, so
the next file's ``init()`` starts it as a fresh process would. Each block is compiled under
its place in the Markdown, so a traceback names the file and line of the block. The first
failing block ends the session with exit code 1: its collectives may be left unmatched on the
other ranks.
"""

from __future__ import annotations

import json
import os
import sys
import traceback


def run_file(name: str, blocks: list[dict]) -> bool:
    namespace: dict = {"__name__": "__doc_session__"}
    for block in blocks:
        where = block["where"]
        try:
            for part, label in ((block["before"], "doc-test before"), (block["code"], None),
                                (block["after"], "doc-test after")):
                if part.strip():
                    exec(compile(part, f"{where} ({label})" if label else where, "exec"), namespace)  # noqa: S102
        except BaseException:  # noqa: BLE001 - reported with the block's place, then the session ends
            print(f"doc-test: {where} FAILED", file=sys.stderr, flush=True)
            traceback.print_exc()
            return False
        print(f"doc-test: {where} ok", flush=True)
    print(f"doc-test: file {name} ok", flush=True)
    return True


def main(session_file: str) -> int:
    with open(session_file) as f:
        files = json.load(f)
    top = os.getcwd()
    for entry in files:
        workdir = os.path.join(top, entry["name"])
        os.makedirs(workdir, exist_ok=True)
        os.chdir(workdir)
        if not run_file(entry["name"], entry["blocks"]):
            return 1
        import smdist_tf as sd  # the blocks have imported it; a file that did not start the engine leaves it down

        if sd.is_initialized():
            # A rank may still be running the file's last collectives on a process set that leaves
            # this one out; shutdown() stops the engine on every rank, so wait for all of them first.
            sd.barrier()
            sd.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
