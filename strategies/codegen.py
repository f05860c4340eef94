"""Writes ``strategies/methods.py`` and ``strategies/message/methods.py``: one class per method of
``flower_pfl.methods`` for each Flower API, whose constructor takes the method's hyperparameters
as typed keyword arguments with their declared defaults and hands everything else to the API's
generic strategy (``LegacyMethodStrategy``, ``MethodStrategy``), so editors, ``help()`` and mypy
see every argument. Run ``python strategies/codegen.py`` (a script: it runs while a generated file is broken) after adding or changing a method's
hyperparameters; ``tests/test_registry.py`` fails, naming that command, while a file is stale.
"""

from __future__ import annotations

from pathlib import Path

from flower_pfl.engine.params import annotation_text, param_specs
from flower_pfl.methods.base import Method
from flower_pfl.methods.registry import method_classes

HERE = Path(__file__).parent
#: (file, API's name, generic strategy and its options' TypedDict with their module)
APIS = (
    (HERE / "methods.py", "legacy", "strategies.legacy", "LegacyMethodStrategy", "LegacyOptions"),
    (HERE / "message" / "methods.py", "Message", "strategies.message.method_strategy", "MethodStrategy", "MessageOptions"),
)
WIDTH = 120


def _wrapped(head: str, parts: list[str], tail: str, indent: str) -> list[str]:
    """``indent + head + ", ".join(parts) + tail``, broken after commas so that no line passes ``WIDTH``;
    continuation lines start under the first part."""
    lines, line = [], indent + head
    for i, part in enumerate(parts):
        piece = part + (", " if i < len(parts) - 1 else tail)
        if len(line) + len(piece.rstrip()) > WIDTH and line.strip() and not line.endswith(head):
            lines.append(line.rstrip())
            line = indent + " " * len(head)
        line += piece
    return [*lines, line.rstrip()]


def class_source(method: type[Method], generic: str, options: str) -> list[str]:
    specs = param_specs(method)
    module = method.__module__.rsplit(".", 1)[1]
    arguments = [f"{s.name}: {annotation_text(method, s.name)} = {s.default!r}" for s in specs]
    lines = ["", "", f"class {method.strategy}({generic}):", f"    method_class = {module}.{method.__name__}", ""]
    lines += _wrapped("def __init__(self, *, ", [*arguments, f"**options: Unpack[{options}]"], ") -> None:", "    ")
    if method.default_clients_per_round is not None:
        lines.append(f'        options.setdefault("clients_per_round", {method.default_clients_per_round})')
    made = f"{module}.{method.__name__}(" + ", ".join(f"{s.name}={s.name}" for s in specs) + ")"
    if len(made) + len("        super().__init__(, **options)") <= WIDTH:
        lines.append(f"        super().__init__({made}, **options)")
    else:
        lines.append("        method = " + made if len(made) + 17 <= WIDTH else "")
        if not lines[-1]:
            lines[-1:] = _wrapped(f"method = {module}.{method.__name__}(", [f"{s.name}={s.name}" for s in specs], ")", "        ")
        lines.append("        super().__init__(method, **options)")
    return lines


def source(api: str, generic_module: str, generic: str, options: str) -> str:
    """The text of one API's per-method module."""
    classes = method_classes()
    modules = sorted({c.__module__.rsplit(".", 1)[1] for c in classes})
    annotations = " ".join(annotation_text(c, s.name) for c in classes for s in param_specs(c))
    lines = [f'"""Every method of ``flower_pfl.methods`` as a {api}-API strategy: written by ``python strategies/codegen.py``',
             "from the method declarations (do not edit). Each class hands its hyperparameters to its method and its",
             f'other arguments to ``{generic}``; ``help()`` shows them all."""', "", "from __future__ import annotations", ""]
    lines += ["from typing import Unpack", ""]
    if "ServerAlgorithm" in annotations:
        lines += ["from flower_pfl.engine.server_algorithm import ServerAlgorithm"]
    methods = f"from flower_pfl.methods import {', '.join(modules)}"
    if len(methods) > 140:  # as ruff's import sorting wraps a long import
        methods = "from flower_pfl.methods import (\n" + "".join(f"    {m},\n" for m in modules) + ")"
    lines += [methods, f"from {generic_module} import {', '.join(sorted([generic, options]))}"]
    lines += ["", "__all__ = [" + ", ".join(f'"{c.strategy}"' for c in classes) + "]"]
    for cls in classes:
        lines += class_source(cls, generic, options)
    lines.append("")
    body = "\n".join(lines)
    return "\n".join(line.rstrip() for line in body.split("\n")) + "\n"


def sources() -> dict[Path, str]:
    """Both APIs' per-method modules and their text."""
    return {path: source(api, module, generic, options) for path, api, module, generic, options in APIS}


if __name__ == "__main__":
    for path, text in sources().items():
        path.write_text(text)
        print(f"wrote {path}")
