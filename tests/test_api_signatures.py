"""docs/api.md shows the package's real signatures.

A signature on the page is a heading or a Python block that is just ``name(parameters)``,
or an inline code span ``name(parameters)`` whose parameters are all written as
parameters (``p``, ``p=default``, ``*args``, ``**kwargs``) and all named like the real
function's (so ``allreduce(x, op=sd.Sum)``, a call, and ``init()``, a mention, are not). Each must list the real
parameters in order, of the same kind, with the same defaults; one ending in ``...`` may
leave out the rest. Names resolve in ``smdist_tf`` (``sd.``/``smdist_tf.`` prefixes
included), in the public module the section is about, else in the one public module
defining them.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import re
from typing import Any

import pytest

import smdist_tf
from tests.doc_blocks import ROOT, read_blocks

API = ROOT / "docs" / "api.md"
PUBLIC_MODULES = ("smdist_tf", "smdist_tf.keras", "smdist_tf.keras.callbacks", "smdist_tf.elastic",
                  "smdist_tf.pipeline", "smdist_tf.distribute", "smdist_tf.compression")
_CODE_SPAN = re.compile(r"`([^`]+)`")
_SIGNATURE = re.compile(r"([A-Za-z_][\w.]*)\((.*)\)(?:\s*->.*)?", re.S)
_SECTION_MODULE = re.compile(r"^## `(smdist_tf(?:\.\w+)+)`")
_KIND = {inspect.Parameter.VAR_POSITIONAL: "*", inspect.Parameter.VAR_KEYWORD: "**"}


@dataclasses.dataclass
class DocSignature:
    """A signature as the page writes it."""

    where: str
    name: str
    params: list[tuple[str, str, str | None]]  # (kind: "", "*" or "**"; name; default as written)
    open_ended: bool  # ends in "...": the real signature may go on
    explicit: bool  # a heading or a signature block: it must name a real function
    section_module: str | None


def parse_signature(text: str, where: str, explicit: bool, section_module: str | None) -> DocSignature | None:
    """The signature ``text`` shows, or None when it is not written as one (a call with expressions)."""
    match = _SIGNATURE.fullmatch(" ".join(text.split()))
    if match is None:
        return None
    name, body = match.groups()
    open_ended = body.rstrip().endswith("...")
    if open_ended:
        body = body.rstrip()[:-3].rstrip().rstrip(",")
    try:
        args = ast.parse(f"def f({body}): pass").body[0].args
    except SyntaxError:
        return None
    positional = args.posonlyargs + args.args
    defaults = [None] * (len(positional) - len(args.defaults)) + list(args.defaults)
    params = [("", a.arg, None if d is None else ast.unparse(d)) for a, d in zip(positional, defaults)]
    if args.vararg:
        params.append(("*", args.vararg.arg, None))
    params += [("", a.arg, None if d is None else ast.unparse(d)) for a, d in zip(args.kwonlyargs, args.kw_defaults)]
    if args.kwarg:
        params.append(("**", args.kwarg.arg, None))
    return DocSignature(where, name, params, open_ended, explicit, section_module)


def resolve(name: str, section_module: str | None) -> Any:
    """The public callable ``name`` documents, or None (not public, ambiguous, or a method)."""
    parts = name.split(".")
    if parts[0] in ("sd", "smdist_tf"):
        obj: Any = smdist_tf
        for part in parts[1:]:
            obj = getattr(obj, part, None)
        return obj if callable(obj) else None
    if len(parts) > 1:
        return None  # `pipe.fit(...)`: a method of an object the page made
    found = []
    for module_name in ([section_module] if section_module else []) + list(PUBLIC_MODULES):
        value = getattr(importlib.import_module(module_name), name, None)
        if not callable(value):
            continue
        if module_name in (section_module, "smdist_tf"):
            return value
        if all(value is not other for other in found):
            found.append(value)
    return found[0] if len(found) == 1 else None


def documented_signatures() -> list[DocSignature]:
    """Every signature docs/api.md shows: headings, signature blocks and inline code spans."""
    found = []
    section_module = None
    paragraph: list[str] = []
    start = 0

    def flush() -> None:
        for span in _CODE_SPAN.finditer(" ".join(paragraph)):
            sig = parse_signature(span.group(1), f"docs/api.md:{start}", False, section_module)
            if sig:
                found.append(sig)
        paragraph.clear()

    in_block = False
    for number, line in enumerate(API.read_text().splitlines(), 1):
        if line.strip().startswith("```"):
            flush()
            in_block = not in_block
            continue
        if in_block:
            continue
        if line.startswith("#"):
            flush()
            if line.startswith("## "):
                module = _SECTION_MODULE.match(line)
                section_module = module.group(1) if module else None
            heading = re.fullmatch(r"#{2,4} `([^`]+)`\s*", line)
            if heading:
                sig = parse_signature(heading.group(1), f"docs/api.md:{number}", True, section_module)
                if sig:
                    found.append(sig)
            continue
        if not line.strip():
            flush()
            continue
        if not paragraph:
            start = number
        paragraph.append(line)
    flush()
    for block in read_blocks(API):
        sig = parse_signature(block.code.strip(), block.where, True, None) if block.language == "python" else None
        if sig:
            found.append(sig)
    return found


def real_parameters(obj: Any) -> list[tuple[str, str, Any]]:
    """(kind, name, default or inspect.Parameter.empty) of each parameter, as ``inspect`` sees them."""
    return [(_KIND.get(p.kind, ""), p.name, p.default) for p in inspect.signature(obj).parameters.values()]


def default_value(text: str) -> Any:
    """A default as written on the page: a literal, or a name in smdist_tf (``Compression.none``, ``Average``)."""
    try:
        return ast.literal_eval(text)
    except ValueError:
        obj: Any = smdist_tf
        for part in text.removeprefix("sd.").split("."):
            obj = getattr(obj, part)
        return obj


def checked_signatures() -> list[tuple[DocSignature, Any]]:
    """The page's signatures paired with the objects they describe (calls and methods left out)."""
    pairs = []
    for sig in documented_signatures():
        obj = resolve(sig.name, sig.section_module)
        if obj is None:
            assert not sig.explicit, f"{sig.where}: {sig.name} is not a public smdist_tf function or class"
            continue
        real_names = {name for _, name, _ in real_parameters(obj)}
        if not sig.explicit and (not sig.params or any(name not in real_names for _, name, _ in sig.params)):
            continue  # a mention such as `init()`, or an example call such as `allreduce(x, op=sd.Sum)`
        pairs.append((sig, obj))
    return pairs


SIGNATURES = checked_signatures()


def test_the_page_shows_the_main_signatures():
    names = {sig.name.removeprefix("sd.").removeprefix("smdist_tf.") for sig, _ in SIGNATURES}
    for name in ("init", "allreduce", "grouped_allreduce", "allgather", "broadcast", "alltoall", "reducescatter",
                 "barrier", "DistributedGradientTape", "GradientReducer", "broadcast_object", "run", "DataParallelStrategy",
                 "keras.PipelineModel", "start_timeline"):
        assert name in names, f"docs/api.md shows no signature of {name}"


@pytest.mark.parametrize("sig,obj", SIGNATURES, ids=[f"{s.where}:{s.name}" for s, _ in SIGNATURES])
def test_documented_signature_is_the_real_one(sig, obj):
    real = real_parameters(obj)
    shown = [(kind, name) for kind, name, _ in sig.params]
    actual = [(kind, name) for kind, name, _ in real]
    if sig.open_ended:
        actual = actual[:len(shown)]
    assert shown == actual, f"{sig.where}: {sig.name} shows parameters {shown}, the code has {actual}"
    for (_, name, text), (_, _, default) in zip(sig.params, real):
        if text is None:
            assert default is inspect.Parameter.empty, f"{sig.where}: {sig.name}({name}) has default {default!r}"
        else:
            assert default is not inspect.Parameter.empty, f"{sig.where}: {sig.name}({name}=...) has no default"
            assert default_value(text) == default, f"{sig.where}: {sig.name}({name}={text}), the code has {default!r}"


def test_every_horovod_name_the_migration_table_calls_supported_exists():
    """docs/migrate-from-horovod.md lists every ``horovod.tensorflow`` name; the supported ones must exist."""
    text = (ROOT / "docs" / "migrate-from-horovod.md").read_text()
    table = text.split("## Every Horovod TensorFlow name", 1)[1]
    rows = [line for line in table.splitlines() if line.startswith("| `")]
    assert len(rows) > 10, "the name table is missing"
    supported = []
    for row in rows:
        horovod_names, ours = row.split(" | ", 1)
        if "not supported" in ours:
            continue
        supported += [n for n in _CODE_SPAN.findall(horovod_names) if n.isidentifier()]
    missing = [name for name in supported if not hasattr(smdist_tf, name)]
    assert not missing, f"the migration table calls these supported, but smdist_tf lacks them: {missing}"
    assert {"join", "SyncBatchNormalization", "rank_op", "broadcast_", "grouped_reducescatter"} <= set(supported)
