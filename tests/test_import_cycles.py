"""No import cycle between the project's modules: every `import` and `from ... import` at any depth
of a module (functions included: a deferred import is still a dependency) is an edge, and the graph
must have no strongly connected component of more than one module. A package's `__init__` counts as
the module `pkg`; `from pkg import name` is an edge to `pkg.name` when that is a module."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("protocol", "conf", "broker", "namesrv", "client", "admin", "rocketq", "chaos", "bench", "demo")


def module_files() -> dict[str, Path]:
    modules = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
            modules[name] = path
    return modules


def import_graph(sources: dict[str, str]) -> dict[str, set[str]]:
    """module -> the project modules it imports, from each module's source."""
    def owner(name: str) -> str | None:          # the longest project module `name` falls in
        while name and name not in sources:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for module, source in sources.items():
        targets = set()
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Import):
                targets |= {owner(alias.name) for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets |= {owner(f"{node.module}.{alias.name}") for alias in node.names}
        graph[module] = {t for t in targets if t is not None and t != module}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan, iterative), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_check_finds_a_cycle() -> None:
    graph = import_graph({"a": "import b", "b": "from c import x", "c": "def f():\n    import a", "d": "import a"})
    assert cycles(graph) == [["a", "b", "c"]]
    assert cycles(import_graph({"a": "import b", "b": "", "c": "from a import b"})) == []


def test_no_import_cycle_between_project_modules() -> None:
    sources = {name: path.read_text(encoding="utf-8") for name, path in module_files().items()}
    assert len(sources) > 200
    assert cycles(import_graph(sources)) == [], "import cycles (break them: move the shared piece below both)"
