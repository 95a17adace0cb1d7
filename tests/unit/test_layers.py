"""The package layers: the OpenAI translation (``inferq.openai``) and the batch runner
(``inferq.batch``) stand below the HTTP gateway, so loading them loads no FastAPI, and the
gateway imports the batch runner like any other module (no lazy import to break a loop)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
INFERQ = ROOT / "inferq"
BENCHMARKS = ROOT / "benchmarks"


@pytest.mark.parametrize("module", ["inferq.openai", "inferq.openai.requests",
                                    "inferq.openai.responses", "inferq.openai.errors",
                                    "inferq.batch", "inferq.batch.runner",
                                    "inferq.batch.lines"])
def test_importing_the_translation_or_the_batch_runner_loads_no_http_server(
        module: str) -> None:
    # A fresh interpreter: this one has loaded FastAPI already (other tests).
    code = (f"import sys, {module}; "
            "loaded = sorted({m.split('.')[0] for m in sys.modules} & {'fastapi', 'starlette', "
            "'uvicorn'}); assert not loaded, loaded")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_the_gateway_imports_the_batch_runner_at_the_top() -> None:
    tree = ast.parse((INFERQ / "gateway" / "batch_state.py").read_text())
    nested = [node for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)
              for inner in ast.walk(node) if isinstance(inner, ast.Import | ast.ImportFrom)]
    assert not nested, "batch_state imports inside a function: a loop to open?"
    top = {node.module for node in tree.body if isinstance(node, ast.ImportFrom)}
    assert "inferq.batch.runner" in top
    assert not any(isinstance(node, ast.If) for node in tree.body), "TYPE_CHECKING imports"


# ------------------------------------------------------------------------------ floors

#: Each top-level module or package of ``inferq`` and its floor: a module imports only from
#: its own floor or below, and the packages of one floor import each other without a circle.
#: The named order is issue 35's: errors < protocol < (plans, connection, cluster) < producer
#: < openai < batch < gateway < cli; the others sit where what they import puts them.
FLOORS = {
    "errors": 0, "logs": 0,
    # OpenTelemetry, behind one switch: the payload (protocol) validates its trace fields
    "tracing": 0,
    "protocol": 1, "embedded": 1,
    # the sans-IO plans and what runs on them without the SDK
    "plans": 2, "connection": 2, "sentinel": 2, "cluster": 2, "stats": 2, "tenancy": 2,
    "deadletters": 2, "usage": 2, "autoscale": 2, "affinity_stats": 2,
    # the SDK (``inferq`` itself re-exports it) and the worker, side by side
    "producer": 3, "lookup": 3, "__init__": 3, "worker": 3,
    "openai": 4, "models": 4,
    "batch": 5,
    "gateway": 6,
    "cli": 7,
    "__main__": 8,
}
#: What the worker never imports: it serves queues, it does not send to them.
NOT_FROM_WORKER = frozenset({"producer", "gateway", "batch"})
#: Module circles left open (none: add one only with the reason it cannot be opened).
KNOWN_CIRCLES: set[frozenset[str]] = set()


def _module_name(path: Path, root: Path = INFERQ) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(module: str, path: Path, known: set[str]) -> set[str]:
    """The modules of ``module``'s own top package (``inferq`` or ``benchmarks``) it imports,
    wherever the import is (a function's too), except under ``if TYPE_CHECKING:`` (never
    run)."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    top = module.split(".")[0]
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _type_checking(child):
                for other in child.orelse:
                    visit(other)
            elif isinstance(child, ast.Import):
                found.update(a.name for a in child.names if a.name.split(".")[0] == top)
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    base = package.split(".")[:len(package.split(".")) - child.level + 1]
                    source = ".".join(base + ([child.module] if child.module else []))
                else:
                    source = child.module or ""
                if source.split(".")[0] == top:
                    # ``from inferq import plans`` imports the module ``inferq.plans``
                    found.update(f"{source}.{a.name}" if f"{source}.{a.name}" in known
                                 else source for a in child.names)
            else:
                visit(child)

    visit(ast.parse(path.read_text()))
    return {m for m in found if m in known and m != module}


def _graph(root: Path = INFERQ) -> dict[str, set[str]]:
    paths = {_module_name(p, root): p for p in root.rglob("*.py")}
    known = set(paths)
    return {m: _imports(m, p, known) for m, p in paths.items()}


def _floor_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _circles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected parts of more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[frozenset[str]] = []

    def strong(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            part = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                part.add(w)
                if w == v:
                    break
            if len(part) > 1:
                found.append(frozenset(part))

    for v in sorted(graph):
        if v not in index:
            strong(v)
    return found


def test_every_top_level_module_has_a_floor() -> None:
    assert {_floor_of(m) for m in _graph()} == set(FLOORS), "place the new module in FLOORS"


def test_imports_never_go_up_a_floor_and_the_worker_stands_apart() -> None:
    up = []
    for module, imported in sorted(_graph().items()):
        here = _floor_of(module)
        for other in sorted(imported):
            there = _floor_of(other)
            if FLOORS[there] > FLOORS[here] or (here == "worker" and there in NOT_FROM_WORKER):
                up.append(f"{module} -> {other}")
    assert not up, "imports up the floors:\n" + "\n".join(up)


def test_no_circles_between_packages_or_modules() -> None:
    graph = _graph()
    packages: dict[str, set[str]] = {}
    for module, imported in graph.items():
        packages.setdefault(_floor_of(module), set()).update(
            _floor_of(m) for m in imported if _floor_of(m) != _floor_of(module))
    assert _circles(packages) == [], "packages import each other"
    assert set(_circles(graph)) == KNOWN_CIRCLES, "modules import each other (KNOWN_CIRCLES)"


def test_no_circles_between_benchmark_modules() -> None:
    assert _circles(_graph(BENCHMARKS)) == [], "benchmark modules import each other"


def test_the_circle_test_sees_an_import_inside_a_function(tmp_path: Path) -> None:
    # The test above passes only if it would fail: a circle closed by a function-level import.
    folder = tmp_path / "benchmarks"
    folder.mkdir()
    (folder / "a.py").write_text("from benchmarks import b\n")
    (folder / "b.py").write_text("def f() -> None:\n    from benchmarks.a import x\n")
    assert _circles(_graph(folder)) == [frozenset({"benchmarks.a", "benchmarks.b"})]


def test_the_batch_runner_enqueues_through_the_clients_public_door() -> None:
    """``AsyncClient.prepare`` and ``enqueue_items``: not the producer's inner modules, its
    registered scripts or its private methods."""
    inner = {"inferq.producer.base", "inferq.producer.prepare", "inferq.producer.routing",
             "inferq.producer.send"}
    reached = sorted(f"{m} -> {o}" for m, deps in _graph().items()
                     if m.startswith("inferq.batch") for o in deps & inner)
    assert not reached, reached
    for path in (INFERQ / "batch").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            owner = node.value if isinstance(node, ast.Attribute) else None
            if (isinstance(owner, ast.Attribute) and owner.attr == "client") or (
                    isinstance(owner, ast.Name) and owner.id == "client"):
                assert node.attr != "scripts" and not node.attr.startswith("_"), (
                    f"{path.name}:{node.lineno} reaches into the client: client.{node.attr}")
