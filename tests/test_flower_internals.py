"""Flower's internals in one module: every name ``client_apps/flower_internals.py`` imports exists in
the installed Flower (a release that moved one fails here, naming the symbol and the version), and no
other file of the project imports a Flower module outside Flower's public API."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import flwr
import pytest

ROOT = Path(__file__).resolve().parents[1]
INTERNALS = ROOT / "client_apps" / "flower_internals.py"
#: Flower's public API as this project uses it (the strategy interfaces included)
PUBLIC = ("flwr", "flwr.app", "flwr.serverapp", "flwr.serverapp.strategy", "flwr.clientapp", "flwr.clientapp.mod",
          "flwr.server", "flwr.server.strategy", "flwr.server.workflow", "flwr.server.client_proxy",
          "flwr.server.client_manager", "flwr.server.criterion", "flwr.client", "flwr.client.mod", "flwr.common",
          "flwr.common.logger", "flwr.simulation")


def _imports(path: Path) -> list[tuple[str, str | None, int]]:
    """``(module, name or None, line)`` for every import of ``path``, at any depth."""
    out: list[tuple[str, str | None, int]] = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [(alias.name, None, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out += [(node.module, alias.name, node.lineno) for alias in node.names]
    return out


NAMES = [(m, n) for m, n, _ in _imports(INTERNALS) if m.split(".")[0] == "flwr"]


@pytest.mark.parametrize("module,name", NAMES, ids=[f"{m}.{n}" for m, n in NAMES])
def test_every_internal_name_exists_in_the_installed_flower(module, name):
    try:
        found = importlib.import_module(module)
        if name is not None:
            getattr(found, name) if hasattr(found, name) else importlib.import_module(f"{module}.{name}")
    except (ImportError, AttributeError) as err:
        pytest.fail(f"Flower {flwr.__version__} lacks {module}.{name or ''} ({err}): update client_apps/flower_internals.py")


def test_no_other_file_imports_flower_internals():
    found = []
    for folder in ("flower_pfl", "strategies", "client_apps", "server_apps", "benchmarks", "tests", "examples"):
        for path in (ROOT / folder).rglob("*.py"):
            if path == INTERNALS:
                continue
            for module, name, line in _imports(path):
                target = module if name is None or module != "flwr" else f"flwr.{name}"
                if target.split(".")[0] == "flwr" and target not in PUBLIC and not target.startswith(("flwr.app.",)):
                    found.append(f"{path.relative_to(ROOT)}:{line} {module}{'.' + name if name else ''}")
    assert not found, "import these through client_apps.flower_internals:\n" + "\n".join(found)
