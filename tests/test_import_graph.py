"""Python imports run down the layers: the package's import graph has no circle.

Every ``import`` of an ``smdist_tf`` module counts, at module level or inside a
function (a deferred import still makes the two modules depend on each other), and
so does the package that holds the imported module (Python runs its ``__init__``
first), unless it holds the importer too.
"""

from __future__ import annotations

import ast
from pathlib import Path

import tensorflow as tf

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "smdist_tf"


def module_files() -> dict[str, Path]:
    modules = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def imported_modules(module: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The smdist_tf modules ``module`` imports, with their packages outside its own ancestors."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parents = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parents + ([base] if base else []))
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
        else:
            continue
        for name in names:
            while name and name not in modules:
                name = name.rpartition(".")[0]
            while name.startswith("smdist_tf"):
                if name != module and not module.startswith(name + "."):
                    found.add(name)
                name = name.rpartition(".")[0]
    return found


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


class ImportGraphTest(tf.test.TestCase):
    def test_no_import_circle(self):
        modules = module_files()
        graph = {m: imported_modules(m, p, modules) for m, p in modules.items()}
        self.assertEqual(circles(graph), [], "modules that import each other, directly or through others")

    def test_the_check_sees_a_circle_through_a_deferred_import(self):
        graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
        self.assertEqual(circles(graph), [["a", "b", "c"]])
        modules = module_files()
        # runtime -> _native is a plain import; a deferred import inside a function counts as well.
        self.assertIn("smdist_tf._native", imported_modules("smdist_tf.runtime", modules["smdist_tf.runtime"], modules))
        self.assertIn("smdist_tf.objects",
                      imported_modules("smdist_tf.initialization", modules["smdist_tf.initialization"], modules))
