"""Declarations found by looking: the classes a package's modules define, so that a registry of methods,
data sets or model families lists no name by hand."""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Collection
from typing import TypeVar

T = TypeVar("T")


def declared_classes(package: str, base: type[T], skip: Collection[str] = ()) -> list[type[T]]:
    """Every subclass of ``base`` defined in a module of ``package`` (not imported into it), modules in name
    order and classes in the order they are defined, leaving out the modules named in ``skip``."""
    root = importlib.import_module(package)
    names = sorted(info.name for info in pkgutil.iter_modules(root.__path__) if info.name not in skip)
    found: list[type[T]] = []
    for name in names:
        module = importlib.import_module(f"{package}.{name}")
        found += [obj for obj in vars(module).values()
                  if isinstance(obj, type) and issubclass(obj, base) and obj is not base and obj.__module__ == module.__name__]
    return found
