"""The data sets of this package, found by looking: every ``DataSet`` class with a ``name`` in a module of
``flower_pfl.experiment.datasets``. The run config, the loaders and the data table read this; none lists
data set names by hand."""

from __future__ import annotations

from collections.abc import Mapping
from functools import lru_cache
from typing import Any

from flower_pfl.engine.discovery import declared_classes
from flower_pfl.engine.params import ParamSpec, param_specs
from flower_pfl.experiment.datasets.base import DataSet

_NOT_DATA_SETS = ("base", "registry", "own")


@lru_cache(maxsize=1)
def data_sets() -> tuple[type[DataSet], ...]:
    """Every data set, in module order."""
    found = [cls for cls in declared_classes("flower_pfl.experiment.datasets", DataSet, _NOT_DATA_SETS) if "name" in vars(cls)]
    seen: set[str] = set()
    for cls in found:
        if cls.name in seen:
            raise RuntimeError(f"data set {cls.name!r} is declared twice")
        seen.add(cls.name)
    return tuple(found)


def names() -> tuple[str, ...]:
    """The run config's ``dataset`` values of the package's data sets."""
    return tuple(cls.name for cls in data_sets())


def data_set_class(name: str) -> type[DataSet]:
    for cls in data_sets():
        if cls.name == name:
            return cls
    raise ValueError(f"dataset must be one of {', '.join(names())} or an import path 'package.module:function', got {name!r}")


@lru_cache(maxsize=1)
def option_specs() -> dict[str, ParamSpec]:
    """Every data set's run-config keys, by key (data sets that share a key agree on its default and type)."""
    out: dict[str, ParamSpec] = {}
    for cls in data_sets():
        for spec in param_specs(cls):
            if spec.key is None:
                continue
            known = out.setdefault(spec.key, spec)
            if (known.default, known.type) != (spec.default, spec.type):
                raise RuntimeError(f"run-config key '{spec.key}' is declared with two defaults or types")
    return out


def instance(name: str, options: Mapping[str, Any]) -> DataSet:
    """Data set ``name`` with its keys' values from ``options`` (run-config keys; missing: defaults)."""
    cls = data_set_class(name)
    return cls(**{s.name: options[s.key] for s in param_specs(cls) if s.key is not None and s.key in options})


def keys_of(name: str) -> tuple[str, ...]:
    """The run-config keys data set ``name`` reads."""
    return tuple(s.key for s in param_specs(data_set_class(name)) if s.key is not None)
