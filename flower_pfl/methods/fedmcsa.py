"""FedMCSA (Guo et al., paper 004): model-components self-attention."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from ..attention import layerwise_attention
from ..client_step import PROXIMAL_MU, Proximal
from ..layout import GROUPINGS, ParamLayout
from ..params import NON_NEGATIVE, POSITIVE, one_of, param
from ..server_step import PersonalizedStep, Settings, all_clients_train_param
from .base import Method


@dataclass
class FedMCSA(Method, PersonalizedStep):
    """FedMCSA (Guo et al.): layer-wise self-attention over the participants' personalized models,
    and a proximal client step toward the model it receives.

    Server (eqs. 6-8, Algorithm 1 lines 2-5): for every component ``l``,
    ``w_{i,l} = Σ_k softmax_k(σ cos(θ_{i,l}, θ_{k,l})) θ_{k,l}`` over the round's participants.
    Client (eq. 9): ``R`` SGD steps on ``f_i(Θ) + λ/2 ||Θ − W_i||²``, the anchor ``W_i`` fixed
    for the round (sent as ``proximal-mu``).
    """

    name = "fedmcsa"
    strategy = "FedMCSA"
    client = Proximal
    group = "paper"
    default_clients_per_round = 10

    sigma: float = param(50.0, key="sigma", must=POSITIVE,
                         doc="attention scale σ (eq. 7): → 0 gives the per-layer mean, large keeps each client's own layer")
    lam: float = param(5.0, key="lam", must=NON_NEGATIVE, doc="proximal weight λ toward the received model (eq. 9)")
    grouping: str = param("tensor", key="layer-grouping", must=one_of(*GROUPINGS),
                          doc="components: 'tensor' (weight and bias apart, as the authors' code) or 'module' (one per layer)")
    all_clients_train: bool = all_clients_train_param()
    #: mechanism transfer (the paper's Table 2, e.g. pFedMe+MCSA): another method's client settings
    #: in place of the proximal step, and the evaluation settings that go with them
    client_settings: Mapping[str, Any] | None = param(None, doc="another method's client settings in place of the proximal step (Table 2's transfers)")
    evaluation_settings: Mapping[str, Any] | None = param(None, doc="evaluation settings that go with client_settings")

    proximal_mu_text = "lam (run config lam)"
    without_client_step = "runs without its proximal term λ (eq. 9), i.e. as FedAvg+MCSA (λ = 0)"

    def setup(self, layout: ParamLayout, initial: torch.Tensor, device: torch.device, seed: int = 0) -> None:
        super().setup(layout, initial, device, seed)
        if self.grouping == "module" and not layout.named:
            raise ValueError("grouping = 'module' finds layers by parameter name, and this model's have none: "
                             "give the strategy the initial model with its parameter names (a state_dict)")

    def personalize(self, models: torch.Tensor, layout: ParamLayout) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Personalized models and each component's ``(m, m)`` attention weights."""
        components = layout.components(self.grouping)  # type: ignore[arg-type]
        out, weights = layerwise_attention(models, [sl for _, sl in components], self.sigma)
        return out, {name: weights[l] for l, (name, _) in enumerate(components)}

    def train_config(self) -> Settings:
        return dict(self.client_settings) if self.client_settings is not None else {PROXIMAL_MU: float(self.lam)}

    def evaluation_config(self) -> Settings:
        return dict(self.evaluation_settings or {})
