"""Server state of the methods that train one global model with extra information each round
(IGFL, SCAFFOLD), shared by the legacy and Message-API strategies.

A round: ``begin_round`` with the global model the participants start from,
``instructions`` adds config entries to every participant's instruction,
``client_model`` may replace the global model a given client receives (FedAttn's
personalized biases), ``check_payload`` validates the extra bytes a client returns
with its model, and ``aggregate`` turns the accepted models (and payloads) into the
next global model.
"""

from __future__ import annotations

from typing import Any, Hashable, Mapping, Sequence

import numpy as np
import torch

from flower_pfl.diagnostics import AttentionAccumulator
from flower_pfl.layout import ParamLayout


class GlobalServer:
    """Base class: keeps the layout, the round's global model and the number of clients."""

    def __init__(self) -> None:
        self.layout: ParamLayout | None = None
        self.global_model: torch.Tensor | None = None
        self.num_clients = 0
        #: client-level attention weights averaged over rounds (methods that attend fill it)
        self.attention = AttentionAccumulator()

    def initialize(self, arrays: Mapping[str, np.ndarray]) -> None:
        """Learn the model's layout from the initial arrays (once)."""
        if self.layout is None:
            self.layout = ParamLayout.from_arrays(arrays)
            self.on_initialize()

    def on_initialize(self) -> None:
        """Create the method's state once ``self.layout`` is known."""

    def begin_round(self, global_arrays: Sequence[np.ndarray], num_clients: int) -> None:
        """Remember the global model this round's participants start from, and how many
        clients are connected."""
        assert self.layout is not None, "initialize() first"
        self.global_model = self.layout.flatten(global_arrays)
        self.num_clients = num_clients

    def instructions(self, num_participants: int) -> dict[str, Any]:
        """Config entries for this round's participants."""
        return {}

    def client_model(self, client_id: Hashable, training: bool) -> torch.Tensor | None:
        """The flat model client ``client_id`` gets to train (``training``) or evaluate, when it is
        not the global model (``None``: the global model)."""
        return None

    def evaluation_config(self) -> dict[str, Any]:
        """Config entries for evaluation messages (e.g. how a client builds its personalized model)."""
        return {}

    def check_payload(self, payload: Mapping[str, Any]) -> Any:
        """Validate what a client returned besides its model; raise ``ValueError`` to reject it."""
        return None

    def aggregate(self, ids: Sequence[Hashable], models: Sequence[torch.Tensor], payloads: Sequence[Any],
                  num_examples: Sequence[int]) -> torch.Tensor:
        """The next global model from the accepted models, their checked payloads and sample counts."""
        raise NotImplementedError

    def state_dict(self) -> dict[str, Any]:
        """What the server learned besides the global model, to save with the results."""
        return {}


def weighted_mean(models: Sequence[torch.Tensor] | torch.Tensor, num_examples: Sequence[int]) -> torch.Tensor:
    """FedAvg: the models' mean weighted by their clients' sample counts (uniform without counts);
    ``models`` may already be stacked into one ``(m, d)`` tensor."""
    stacked = models if isinstance(models, torch.Tensor) else torch.stack(list(models))
    weights = torch.tensor([float(n) for n in num_examples]) if num_examples else torch.ones(len(stacked))
    return (weights / weights.sum()) @ stacked


class FedAvgServer(GlobalServer):
    """FedAvg's aggregation; subclasses add what their clients need in ``instructions`` and
    ``evaluation_config`` (Ditto, Per-FedAvg)."""

    def aggregate(self, ids: Sequence[Hashable], models: Sequence[torch.Tensor], payloads: Sequence[Any],
                  num_examples: Sequence[int]) -> torch.Tensor:
        return weighted_mean(models, num_examples)
