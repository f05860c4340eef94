"""A researcher's own function by import path (``"my_pkg.my_module:my_function"``): a data set's loader or a
model's factory, named in the run config."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


def is_import_path(value: str) -> bool:
    """``"package.module:name"``: a module path and an attribute, both non-empty."""
    module, sep, name = value.partition(":")
    return bool(sep and module and name) and all(part.isidentifier() for part in [*module.split("."), *name.split(".")])


def load_callable(path: str, what: str) -> Callable[..., Any]:
    """The callable at import path ``path`` (``"pkg.module:function"``); a ``ValueError`` naming ``path``
    and ``what`` it is for when it cannot be imported or is not callable."""
    module_name, _, attribute = path.partition(":")
    try:
        target: Any = importlib.import_module(module_name)
    except Exception as err:  # the user's module: any error while importing it
        raise ValueError(f"{what} = {path!r}: module {module_name!r} is not importable ({type(err).__name__}: {err}); "
                         "is its package installed or on PYTHONPATH?") from err
    for part in attribute.split("."):
        if not hasattr(target, part):
            raise ValueError(f"{what} = {path!r}: {module_name!r} has no {attribute!r}")
        target = getattr(target, part)
    if not callable(target):
        raise ValueError(f"{what} = {path!r}: {attribute!r} is not a function (it is of type {type(target).__name__})")
    return target
