"""Runs one Markdown file's Python blocks in order on every rank (started by tests/test_docs.py).

``python tests/doc_session.py BLOCKS.json`` under ``smdistrun``: the blocks share one
namespace, as a reader's session would (a page's later examples use the names its
earlier ones define). Each block is compiled under its place in the Markdown, so a
traceback names the file and line of the block. The first failing block ends the
session with exit code 1.
"""

from __future__ import annotations

import json
import sys
import traceback


def main(blocks_file: str) -> int:
    with open(blocks_file) as f:
        blocks = json.load(f)
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
            return 1
        print(f"doc-test: {where} ok", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
