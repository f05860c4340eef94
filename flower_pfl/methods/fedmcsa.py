"""FedMCSA (Guo et al., paper 004): model-components self-attention."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

import torch

from ..attention import layerwise_attention
from ..layout import GROUPINGS, Grouping, ParamLayout
from .base import PROXIMAL_MU


@dataclass
class FedMCSARule:
    """Server: layer-wise attention over the participants' models (eqs. 6-8, Alg. 1 l. 2-5).
    Client: proximal local SGD toward the received model with weight ``lam`` (eq. 9).

    ``grouping`` chooses the components: ``"tensor"`` (weight and bias separate, as
    the authors' code) or ``"module"`` (one component per layer).
    ``all_clients_train`` (Algorithm 1, lines 7-19): every client takes its R steps
    every round; the sampled ones restart from their new W_i, the others continue
    from their own model, anchored to the last W they received. Off by default: then
    only the sampled clients train, Flower's usual partial participation.
    """

    sigma: float = 50.0
    lam: float = 5.0
    grouping: Grouping = "tensor"
    all_clients_train: bool = False
    #: mechanism transfer (the paper's Table 2, e.g. pFedMe+MCSA): another method's client settings
    #: in place of the proximal step, and the evaluation settings that go with them
    client_settings: Mapping[str, Any] | None = None
    evaluation_settings: Mapping[str, Any] | None = None
    name: str = field(default="fedmcsa", init=False)

    def __post_init__(self) -> None:
        if not self.sigma > 0:
            raise ValueError(f"sigma must be > 0, got {self.sigma}")
        if not self.lam >= 0:
            raise ValueError(f"lam must be >= 0, got {self.lam}")
        if self.grouping not in GROUPINGS:
            raise ValueError(f"grouping must be one of {GROUPINGS}, got {self.grouping!r}")

    def personalize(self, models: torch.Tensor, layout: ParamLayout) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Personalized models and each component's ``(m, m)`` attention weights."""
        components = layout.components(self.grouping)
        out, weights = layerwise_attention(models, [sl for _, sl in components], self.sigma)
        return out, {name: weights[l] for l, (name, _) in enumerate(components)}

    def client_config(self) -> dict[str, float | int | str]:
        return dict(self.client_settings) if self.client_settings is not None else {PROXIMAL_MU: float(self.lam)}

    def evaluation_config(self) -> dict[str, Any]:
        return dict(self.evaluation_settings or {})
