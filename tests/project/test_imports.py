"""The import graph of ``src/stepstone`` has no cycle.

Every ``import`` and ``from ... import`` is an edge, wherever it is written: at the top
of a module, inside a function (an import deferred to break a cycle still is one) or
under ``if TYPE_CHECKING:`` (a cycle the type checker needs is a design cycle too). The
graph is read from the source with ``ast``, so nothing is imported and no optional
dependency is needed. Implicit imports of parent packages are not edges: a package's
``__init__`` runs before its modules, and ``stepstone/__init__.py`` imports its public
names lazily.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterator
from pathlib import Path

from parsing import parse

SRC = Path(__file__).resolve().parents[2] / "src"
PACKAGE = "stepstone"

#: The engine: these modules may be in no cycle at all, now.
ENGINE = frozenset({PACKAGE}) | frozenset(
    f"{PACKAGE}.{name}"
    for name in (
        "_acquire",
        "_arunner",
        "_checkpoint",
        "_checks",
        "_codec",
        "_control",
        "_core",
        "_effects",
        "_errors",
        "_hooks",
        "_lease",
        "_migrate",
        "_observe",
        "_plan",
        "_registry",
        "_runner",
        "_steps",
        "_store",
        "_suspend",
    )
)

#: Modules outside the engine that are still in a cycle while the packages around
#: them are being cut apart. The lead empties this set once they are: from then on the
#: whole of ``src/`` is held to no cycle. A module not listed here fails at once.
STILL_IN_A_CYCLE: frozenset[str] = frozenset()


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__" and len(parts) > 1:
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    # A package is named as ``import`` knows it: ``stepstone/__init__.py`` is ``stepstone``.
    return {_module_name(path): path for path in (SRC / PACKAGE).rglob("*.py")}


def _is_package(path: Path) -> bool:
    return path.name == "__init__.py"


def _resolve(module: str, path: Path, level: int, target: str | None) -> str:
    """Return the absolute name of ``from <level dots><target> import ...`` in ``module``."""
    if level == 0:
        return target or ""
    base = module.split(".")
    if not _is_package(path):
        base.pop()  # a module's own package is the one its dots start from
    base = base[: len(base) - (level - 1)]
    return ".".join([*base, target] if target else base)


def _imports(module: str, path: Path, known: dict[str, Path]) -> Iterator[str]:
    """Yield every module of the package that ``module`` imports, anywhere in its body."""
    tree = parse(path.read_text(encoding="utf-8"), str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in known:
                    yield alias.name
        elif isinstance(node, ast.ImportFrom):
            source = _resolve(module, path, node.level, node.module)
            for alias in node.names:
                submodule = f"{source}.{alias.name}"
                if submodule in known:
                    yield submodule  # ``from . import _hooks``: the module itself
                elif source in known:
                    yield source


@functools.cache
def import_graph() -> dict[str, set[str]]:
    """Return ``{module: modules it imports}`` for every module under ``src/stepstone``."""
    known = _modules()
    return {
        module: {target for target in _imports(module, path, known) if target != module}
        for module, path in known.items()
    }


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Return one cycle (``a -> b -> ... -> a``) per strongly connected component.

    Tarjan's algorithm, iterative: each component of more than one module holds at least
    one cycle, and naming one of them is enough to say where to cut.
    """
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[set[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work: list[tuple[str, Iterator[str]]] = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component: set[str] = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    components.append(component)
    return [_one_cycle(graph, component) for component in components]


def _one_cycle(graph: dict[str, set[str]], component: set[str]) -> list[str]:
    """Return a shortest cycle through the first module (by name) of ``component``."""
    start = min(component)
    paths: dict[str, list[str]] = {start: [start]}
    frontier = [start]
    while frontier:
        following: list[str] = []
        for node in frontier:
            for child in sorted(graph[node] & component):
                if child == start:
                    return [*paths[node], start]
                if child not in paths:
                    paths[child] = [*paths[node], child]
                    following.append(child)
        frontier = following
    raise AssertionError(f"no cycle through {start}")  # pragma: no cover - Tarjan found one


def _shown(found: list[list[str]]) -> str:
    return "\n".join("  " + " -> ".join(cycle) for cycle in found) or "  (none)"


def test_the_graph_sees_every_kind_of_import() -> None:
    """The graph holds top-level, function-level and relative imports of submodules."""
    graph = import_graph()
    assert f"{PACKAGE}._effects" in graph[f"{PACKAGE}._core"]  # from ._effects import ...
    assert f"{PACKAGE}._hooks" in graph[f"{PACKAGE}._core"]  # from . import _hooks
    # Deferred on purpose (asyncio), inside a function: still an edge.
    assert f"{PACKAGE}._arunner" in graph[f"{PACKAGE}._runner"]


def test_cycles_are_found_and_named() -> None:
    """A cycle in a made-up graph is reported as a path that returns to its start."""
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"e2"}, "e2": {"e"}}
    assert sorted(cycles(graph)) == [["a", "b", "c", "a"], ["e", "e2", "e"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_the_engine_is_in_no_import_cycle() -> None:
    """No cycle of imports passes through an engine module (``_core``, ``_runner``, ...)."""
    found = cycles(import_graph())
    engine = [cycle for cycle in found if ENGINE & set(cycle)]
    assert not engine, "import cycles through the engine:\n" + _shown(engine)


def test_src_is_in_no_import_cycle() -> None:
    """No cycle of imports anywhere in ``src/stepstone`` (bar the modules still being cut)."""
    found = cycles(import_graph())
    new = [cycle for cycle in found if not set(cycle) <= STILL_IN_A_CYCLE]
    listed = _shown(found)
    assert not new, f"import cycles in src/stepstone (every cycle found is listed):\n{listed}"
