"""FedPer (Arivazhagan et al. 2019): federated base layers, personal heads."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from flower_pfl.engine.client_algorithm import ClientAlgorithm
from flower_pfl.engine.layout import ParamLayout
from flower_pfl.engine.model_facts import ModelFacts
from flower_pfl.engine.model_split import body_slice, complement
from flower_pfl.engine.params import AT_LEAST_ONE, param
from flower_pfl.engine.reply_checks import Reply
from flower_pfl.engine.server_algorithm import ClientId, PersonalizedAlgorithm, weighted_mean
from flower_pfl.methods.base import Method, one_layer_refusal


class SharedPart(PersonalizedAlgorithm):
    """A personalized step whose model has one federated part, the columns ``shared_columns`` names (the
    ``share_weights``-weighted mean of the participants'), while every other column stays each client's own
    (FedPer's head, LG-FedAvg's lower layers, FedBN's batch-norm layers). A participant gets the current
    shared part with its own other columns, and evaluates the same. The store keeps of each client only
    its own columns (``own_columns``), and the shared part once."""

    state_attributes = ("base",)

    def shared_columns(self, layout: ParamLayout) -> slice | torch.Tensor:
        """The shared part's columns of the flat model vector: a slice, or an index tensor."""
        raise NotImplementedError

    def own_columns(self, layout: ParamLayout) -> slice | torch.Tensor | None:
        """Every column but the shared part's."""
        return complement(self.shared_columns(layout), layout.dim)

    def share_weights(self, replies: Sequence[Reply]) -> list[float]:
        """The participants' weights in the shared part's mean (default: their sample counts)."""
        return [r.num_examples for r in replies]

    def setup(self, layout: ParamLayout, initial: torch.Tensor, device: torch.device, seed: int = 0) -> None:
        super().setup(layout, initial, device, seed)
        columns = self.shared_columns(layout)
        #: the shared part's columns (an index tensor lives on the store's device)
        self.base_slice = columns.to(self.store.device) if isinstance(columns, torch.Tensor) else columns
        self.base = initial.to(device=self.store.device, dtype=torch.float32)[self.base_slice]

    def set_state(self, state: dict[str, Any]) -> None:
        super().set_state(state)
        self.base = self.base.to(self.store.device)

    def shared_values(self) -> torch.Tensor:
        """The starting model with the current shared part."""
        values = self.initial.clone()
        values[self.base_slice] = self.base
        return values

    def _with_base(self, models: torch.Tensor) -> torch.Tensor:
        if self.own is None:  # a method that keeps whole models (``stored`` fills the shared part otherwise)
            models[:, self.base_slice] = self.base
        return models

    def personalize(self, models: torch.Tensor, layout: ParamLayout) -> tuple[torch.Tensor, None]:
        return self._with_base(models), None

    def models_for_evaluation(self, ids: Sequence[ClientId]) -> torch.Tensor:
        """The shared part with each client's own other columns."""
        return self._with_base(self.stored(ids))

    def aggregate(self, server_round: int, replies: Sequence[Reply]) -> None:
        super().aggregate(server_round, replies)
        bases = torch.stack([r.model.to(self.store.device)[self.base_slice] for r in replies])
        self.base = weighted_mean(bases, self.share_weights(replies))


@dataclass
class FedPer(Method, SharedPart):
    """FedPer (Arivazhagan et al. 2019): the base layers are trained by FedAvg, the last
    ``head_layers`` layers (the personalization layers) stay each client's own.

    Server: a participant gets the current global base with its own head; the base is then the
    sample-weighted mean of the participants' bases, each head is kept for its client. Client:
    plain local SGD on the whole model. A client evaluates the global base with its own head.
    """

    name = "fedper"
    strategy = "FedPer"
    client = ClientAlgorithm
    default_clients_per_round = 10

    head_layers: int = param(1, key="fedper-head-layers", must=AT_LEAST_ONE,
                             doc="trailing layers (modules, e.g. fc2) each client keeps as its own head")

    def shared_columns(self, layout: ParamLayout) -> slice:
        """The base layers: the modules before the head, a leading slice of the flat vector."""
        return body_slice(layout, self.head_layers)

    @classmethod
    def check_model(cls, facts: ModelFacts) -> str | None:
        return super().check_model(facts) or one_layer_refusal(facts, "a model with a layer to share besides the head", f"{cls.strategy} would be Local")
