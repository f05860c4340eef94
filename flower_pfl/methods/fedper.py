"""FedPer (Arivazhagan et al. 2019): federated base layers, personal heads."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from flower_pfl.engine.client_step import ClientStep
from flower_pfl.engine.layout import ParamLayout
from flower_pfl.engine.model_split import body_slice
from flower_pfl.engine.params import AT_LEAST_ONE, param
from flower_pfl.engine.reply_checks import Reply
from flower_pfl.engine.server_step import ClientId, PersonalizedStep, weighted_mean
from flower_pfl.methods.base import Method


@dataclass
class FedPer(Method, PersonalizedStep):
    """FedPer (Arivazhagan et al. 2019): the base layers are trained by FedAvg, the last
    ``head_layers`` layers (the personalization layers) stay each client's own.

    Server: a participant gets the current global base with its own head; the base is then the
    sample-weighted mean of the participants' bases, each head is kept for its client. Client:
    plain local SGD on the whole model. A client evaluates the global base with its own head.
    """

    name = "fedper"
    strategy = "FedPer"
    client = ClientStep
    default_clients_per_round = 10
    state_attributes = ("base",)

    head_layers: int = param(1, key="fedper-head-layers", must=AT_LEAST_ONE,
                             doc="trailing layers (modules, e.g. fc2) each client keeps as its own head")

    def setup(self, layout: ParamLayout, initial: torch.Tensor, device: torch.device, seed: int = 0) -> None:
        super().setup(layout, initial, device, seed)
        #: the base layers' columns: the modules before the head, a leading slice of the flat vector
        self.base_slice = body_slice(layout, self.head_layers)
        self.base = initial[self.base_slice].to(device=self.store.device, dtype=torch.float32)

    @classmethod
    def check_run(cls, options: Mapping[str, Any]) -> tuple[str, str] | None:
        if options["model"] == "mlr":
            return "model", "a model with a layer to share besides the head (mlr has one layer: FedPer would be Local)"
        return None

    def set_state(self, state: dict[str, Any]) -> None:
        super().set_state(state)
        self.base = self.base.to(self.store.device)

    def _with_base(self, models: torch.Tensor) -> torch.Tensor:
        models[:, self.base_slice] = self.base
        return models

    def personalize(self, models: torch.Tensor, layout: ParamLayout) -> tuple[torch.Tensor, None]:
        return self._with_base(models), None

    def models_for_evaluation(self, ids: Sequence[ClientId]) -> torch.Tensor:
        """The global base with each client's own head."""
        return self._with_base(self.store.get(ids))

    def aggregate(self, server_round: int, replies: Sequence[Reply]) -> None:
        super().aggregate(server_round, replies)
        bases = torch.stack([r.model[self.base_slice] for r in replies])
        self.base = weighted_mean(bases, [r.num_examples for r in replies]).to(self.store.device)
