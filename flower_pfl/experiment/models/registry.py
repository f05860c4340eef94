"""The model families of this package, found by looking: every ``ModelFamily`` class in a module of
``flower_pfl.experiment.models``. The run config, ``build_model`` and the model table read this; none
lists model names by hand."""

from __future__ import annotations

from collections.abc import Mapping
from functools import lru_cache
from typing import Any

import torch
from torch import nn

from flower_pfl.engine.discovery import declared_classes
from flower_pfl.engine.model_facts import ModelFacts
from flower_pfl.engine.params import ParamSpec, param_specs
from flower_pfl.experiment.data.imports import is_import_path
from flower_pfl.experiment.data.info import KIND_TEXT, DataInfo
from flower_pfl.experiment.models.base import ModelFamily, ModelSettings
from flower_pfl.experiment.models.own import build_own_model

_NOT_FAMILIES = ("base", "registry", "own")


@lru_cache(maxsize=1)
def families() -> tuple[type[ModelFamily], ...]:
    """Every model family, in module order."""
    return tuple(declared_classes("flower_pfl.experiment.models", ModelFamily, _NOT_FAMILIES))


@lru_cache(maxsize=1)
def model_names() -> tuple[str, ...]:
    """The run config's ``model`` values of the package's families."""
    out: list[str] = []
    for family in families():
        clash = set(out) & set(family.models)
        if clash:
            raise RuntimeError(f"model {sorted(clash)} is declared by two families")
        out += list(family.models)
    return tuple(out)


def family_of(name: str) -> type[ModelFamily]:
    for family in families():
        if name in family.models:
            return family
    raise ValueError(f"model must be one of {', '.join(model_names())} or an import path 'package.module:factory', got {name!r}")


@lru_cache(maxsize=1)
def option_specs() -> dict[str, ParamSpec]:
    """Every model family's run-config keys, by key."""
    return {spec.key: spec for family in families() for spec in param_specs(family) if spec.key is not None}


def family_instance(name: str, options: Mapping[str, Any]) -> ModelFamily:
    """Model ``name``'s family with its keys' values from ``options`` (run-config keys; missing: defaults)."""
    family = family_of(name)
    return family(**{s.name: options[s.key] for s in param_specs(family) if s.key is not None and s.key in options})


def takes(name: str, kind: str) -> str | None:
    """Why model ``name`` (a package model) cannot take samples of ``kind``, or ``None`` when it can."""
    if is_import_path(name):
        return None
    allowed = family_of(name).takes
    if kind in allowed:
        return None
    return f"model {name!r} takes {' or '.join(KIND_TEXT[k] for k in allowed)}, and this data set's samples are {KIND_TEXT[kind]}"


def build_model(name: str, data: DataInfo, options: Mapping[str, Any] | None = None, settings: ModelSettings | None = None,
                seed: int | None = None) -> nn.Module:
    """Model ``name`` (a package model, or ``"package.module:factory"``) for samples described by ``data``;
    ``options``: the family's run-config keys; ``seed`` fixes its initialization."""
    if seed is not None:
        torch.manual_seed(seed)
    if is_import_path(name):
        return build_own_model(name, data)
    if (problem := takes(name, data.kind)) is not None:
        raise ValueError(problem)
    return family_instance(name, options or {}).build(name, data, settings or ModelSettings())


@lru_cache(maxsize=256)
def _facts(name: str, data: DataInfo, options: tuple[tuple[str, Any], ...], settings: ModelSettings) -> ModelFacts:
    with torch.device("meta"):  # the facts need names and shapes, not values
        return ModelFacts.of_model(build_model(name, data, dict(options), settings))


def model_facts(name: str, data: DataInfo, options: Mapping[str, Any], settings: ModelSettings | None = None) -> ModelFacts:
    """What a method may ask of package model ``name`` built for ``data`` (``flower_pfl.engine.model_facts``),
    without allocating it."""
    keys = tuple((s.key, options[s.key]) for s in param_specs(family_of(name)) if s.key is not None and s.key in options)
    return _facts(name, data, keys, settings or ModelSettings())
