"""Renamed: ``client_apps.own_loop`` (``step_for`` is ``algorithm_for``); the old names import for
one release, with a warning."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.nn.functional as F
from flwr.app import RecordDict
from torch import nn

from client_apps.own_loop import algorithm_for
from flower_pfl.engine.client_algorithm import ClientAlgorithm
from flower_pfl.engine.deprecated import renamed

__getattr__ = renamed(__name__, {"step_for": ("client_apps.own_loop", "algorithm_for")}, moved_to="client_apps.own_loop")


class ClientRule:
    """Deprecated: ``ClientRule.from_config(...)`` is ``client_apps.own_loop.algorithm_for(...)``."""

    @staticmethod
    def from_config(config: Mapping[str, Any], model: nn.Module, state: RecordDict | None = None,
                    optimizer: torch.optim.Optimizer | None = None,
                    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = F.cross_entropy) -> ClientAlgorithm:
        """Deprecated name of ``algorithm_for``."""
        warnings.warn("client_apps.rules.ClientRule.from_config is now client_apps.own_loop.algorithm_for", FutureWarning, stacklevel=2)
        return algorithm_for(config, model, state, optimizer, loss_fn)
