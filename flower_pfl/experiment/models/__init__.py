"""The models of the experiments, one module per family, found by name (``registry``), like a method: its
``model`` values, its run-config keys and how it builds them (``base.ModelFamily``). ``own`` builds a
researcher's model by import path. Every model names its head (``head_name``).

``build_model(name, input_shape, num_classes, ...)`` builds one by name.
May import: ``flower_pfl.engine``, ``flower_pfl.experiment.data``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import nn

from flower_pfl.experiment.data.info import DataInfo
from flower_pfl.experiment.models.base import ModelSettings
from flower_pfl.experiment.models.cnn import ConvNet
from flower_pfl.experiment.models.linear import DNN, MLR
from flower_pfl.experiment.models.registry import build_model as build_for
from flower_pfl.experiment.models.registry import option_specs

__all__ = ["DNN", "MLR", "ConvNet", "build_model"]


def build_model(name: str, input_shape: tuple[int, ...], num_classes: int, *, seed: int | None = None, kind: str | None = None,
                vocab_size: int = 0, options: Mapping[str, Any] | None = None, settings: ModelSettings | None = None,
                **keys: Any) -> nn.Module:
    """Model ``name`` for samples of ``input_shape`` (one sample) and ``num_classes`` classes; ``seed`` fixes
    its initialization. ``kind`` (default: ``image`` for 3-d samples, else ``features``; ``tokens`` with
    ``vocab_size``) describes the samples; family keys come as ``options`` (run-config keys) or as keyword
    arguments with ``_`` for ``-`` (``hidden_units=4``)."""
    guess = {3: "image", 2: "signals"}.get(len(input_shape), "features")
    data = DataInfo(tuple(input_shape), num_classes, kind or guess, vocab_size, padding_id=None)
    named = {key.replace("_", "-"): value for key, value in keys.items()}
    if unknown := sorted(set(named) - set(option_specs())):
        raise TypeError(f"build_model() got keys no model family has: {unknown}")
    options = {**(options or {}), **named}
    return build_for(name, data, options, settings, seed)
