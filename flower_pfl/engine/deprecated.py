"""Names kept for one release after a rename (``docs/changelog.md``): the old name still imports,
with a ``FutureWarning`` that names the new one."""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable, Mapping
from typing import Any


def renamed(module: str, names: Mapping[str, tuple[str, str]], moved_to: str | None = None) -> Callable[[str], Any]:
    """A module-level ``__getattr__`` (PEP 562) for ``module``: each old name of ``names`` gives
    ``(new module, new name)``'s object with a warning; with ``moved_to`` (the module ``module`` was
    renamed to), every other name is that module's, with a warning too."""

    def __getattr__(name: str) -> Any:
        if name in names:
            where, new = names[name]
        elif moved_to is not None and not name.startswith("__"):
            where, new = moved_to, name
        else:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        warnings.warn(f"{module}.{name} is now {where}.{new}; the old name goes in the next release", FutureWarning, stacklevel=2)
        return getattr(importlib.import_module(where), new)

    return __getattr__
