"""The skeleton: every import inside the project points down its layers and none closes a cycle
(function-level imports counted), the Flower-free layers import no Flower, every subpackage says
what it holds and may import, and no function of the engine, the strategies or the apps runs past
``MAX_LINES``."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("flower_pfl", "strategies", "client_apps", "server_apps")
#: the layers, lowest first: a module may import its own layer and the ones before it
LAYERS = (
    ("flower_pfl.engine",),
    ("flower_pfl.methods",),
    ("flower_pfl.experiment",),
    ("flower_pfl.reports",),
    ("flower_pfl.run",),
    ("strategies",),
    ("client_apps",),
    ("server_apps",),
    ("flower_pfl.tools", "flower_pfl.__main__", "flower_pfl"),
)
FLOWER_FREE = ("flower_pfl.engine", "flower_pfl.methods", "flower_pfl.experiment", "flower_pfl.reports", "flower_pfl.run")
SUBPACKAGES = ("engine", "methods", "experiment", "reports", "run", "tools")
MAX_LINES = 60
LENGTH_CHECKED = ("flower_pfl/engine", "strategies", "client_apps", "server_apps")


def _modules() -> dict[str, Path]:
    out = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


MODULES = _modules()


def _imports(name: str, path: Path) -> set[str]:
    """The modules ``name`` imports (package-internal ones resolved to a module; others by top name),
    at any depth of the file: function-level and ``TYPE_CHECKING`` imports included."""
    is_package = path.name == "__init__.py"
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = name.split(".") if is_package else name.split(".")[:-1]
            if node.level == 0:
                target = node.module or ""
            else:
                target = ".".join(base[: len(base) - node.level + 1] + ([node.module] if node.module else []))
            for alias in node.names:
                out.add(f"{target}.{alias.name}" if f"{target}.{alias.name}" in MODULES else target)
    return out


GRAPH = {name: {t for t in _imports(name, path) if t in MODULES and t != name} for name, path in MODULES.items()}


def _layer(module: str) -> int:
    best = max((prefix for layer in LAYERS for prefix in layer if module == prefix or module.startswith(prefix + ".")), key=len)
    return next(i for i, layer in enumerate(LAYERS) if best in layer)


def test_every_import_points_down_the_layers():
    upward = sorted(f"{m} -> {t}" for m, targets in GRAPH.items() for t in targets if _layer(t) > _layer(m))
    assert not upward, "imports pointing up the layers (see LAYERS):\n" + "\n".join(upward)


def test_no_import_cycle():
    done: set[str] = set()

    def visit(node: str, path: list[str]) -> None:
        if node in path:
            pytest.fail("import cycle: " + " -> ".join([*path[path.index(node):], node]))
        if node in done:
            return
        for target in sorted(GRAPH[node]):
            visit(target, [*path, node])
        done.add(node)

    for module in sorted(GRAPH):
        visit(module, [])


def test_the_lower_layers_are_free_of_flower():
    found = sorted(f"{m} imports {t}" for m, path in MODULES.items() if m.startswith(FLOWER_FREE)
                   for t in _imports(m, path) if t == "flwr" or t.startswith("flwr."))
    assert not found, found


def test_the_checks_above_would_catch_an_upward_import_and_a_cycle():
    assert _layer("flower_pfl.engine.store") < _layer("flower_pfl.methods.fedmcsa") < _layer("server_apps.app")
    graph = {"a": {"b"}, "b": {"a"}}
    with pytest.raises(pytest.fail.Exception, match="a -> b -> a"):
        global GRAPH
        saved, GRAPH = GRAPH, graph
        try:
            test_no_import_cycle()
        finally:
            GRAPH = saved


@pytest.mark.parametrize("name", SUBPACKAGES)
def test_every_subpackage_says_what_it_holds_and_may_import(name):
    doc = ast.get_docstring(ast.parse((ROOT / "flower_pfl" / name / "__init__.py").read_text()))
    assert doc and len(doc) > 100, name
    assert "import" in doc, f"flower_pfl.{name}'s docstring does not say what it may import"


def test_functions_of_the_engine_and_the_apps_are_short():
    long = []
    for folder in LENGTH_CHECKED:
        for path in (ROOT / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.end_lineno - node.lineno >= MAX_LINES:
                    long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1} lines)")
    assert not long, long
