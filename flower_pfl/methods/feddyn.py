"""FedDyn (Acar et al. 2021): a dynamic regularizer aligns the clients' local minima with the global one."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from flower_pfl.engine.client_algorithm import Batch, ClientAlgorithm, ClientState, LossFn, keep, like_params, setting, stored, trainable
from flower_pfl.engine.layout import ParamLayout
from flower_pfl.engine.params import POSITIVE, param
from flower_pfl.engine.reply_checks import Reply
from flower_pfl.engine.server_algorithm import GlobalModelAlgorithm, Settings
from flower_pfl.methods.base import Method
from flower_pfl.methods.fedbn import is_statistic, name_mask

#: config key: FedDyn's α
ALPHA = "feddyn-alpha"
#: client-state key of the client's gradient state ∇L_k(θ_k^{t−1}) (one tensor per trainable parameter)
GRADIENT_STATE = "feddyn-gradient"


def next_gradient_state(gradient: Sequence[torch.Tensor], trained: Sequence[torch.Tensor], received: Sequence[torch.Tensor],
                        alpha: float) -> list[torch.Tensor]:
    """Algorithm 1: ``∇L_k(θ_k^t) = ∇L_k(θ_k^{t−1}) − α (θ_k^t − θ^{t−1})``."""
    return [g - alpha * (p.detach() - r) for g, p, r in zip(gradient, trained, received)]


def dynamic_server_update(theta: torch.Tensor, h: torch.Tensor, models: torch.Tensor, alpha: float,
                          num_clients: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Algorithm 1's server: ``h^t = h^{t−1} − α (1/m) Σ_{k∈P_t} (θ_k^t − θ^{t−1})`` with ``m`` the
    number of clients, then ``θ^t = (1/|P_t|) Σ_{k∈P_t} θ_k^t − h^t / α`` (rows of ``models``: the participants)."""
    new_h = h - alpha / num_clients * (models - theta).sum(0)
    return models.mean(0) - new_h / alpha, new_h


class FedDynClient(ClientAlgorithm):
    """FedDyn's client (Algorithm 1): local SGD on ``L_k(θ) − ⟨∇L_k(θ_k^{t−1}), θ⟩ + α/2 ||θ − θ^{t−1}||²``
    (gradient ``g − ∇L_k(θ_k^{t−1}) + α (θ − θ^{t−1})``) from the received ``θ^{t−1}``; ``finish``
    updates the gradient state ``∇L_k`` (client state, zero before the first participation)."""

    name = "feddyn"
    batched_state = ("received", "gradient")
    needs_state = keeps_state = True

    def __init__(self, model: nn.Module, config: Mapping[str, Any], state: ClientState | None = None,
                 loss_fn: LossFn = F.cross_entropy) -> None:
        super().__init__(model, config, state, loss_fn)
        self.alpha = float(setting(config, ALPHA, "FedDyn"))
        if not self.alpha > 0:
            raise ValueError(f"FedDyn's alpha must be > 0, got {self.alpha}")
        known = stored(state, GRADIENT_STATE)
        self.gradient = [torch.zeros_like(r) for r in self.received] if known is None else like_params(known, self.received, "gradient state")


    def gradient_terms(self, params: Sequence[torch.Tensor], batch: Batch | None) -> Sequence[torch.Tensor | None]:
        return [self.alpha * (p.detach() - r) - g for p, r, g in zip(params, self.received, self.gradient)]

    def end_round(self, model: nn.Module, inputs: Any = None) -> dict[str, bytes]:
        keep(self.state, GRADIENT_STATE, next_gradient_state(self.gradient, trainable(model), self.received, self.alpha))
        return {}


@dataclass
class FedDyn(Method, GlobalModelAlgorithm):
    """FedDyn (Acar et al. 2021): each client minimizes its loss plus a dynamic regularizer (a linear
    term with its own gradient state and α/2 ||θ − θ_server||²); the server corrects the mean of the
    returned models by its state h.

    Algorithm 1. Client ``k ∈ P_t``: ``θ_k^t = argmin_θ L_k(θ) − ⟨∇L_k(θ_k^{t−1}), θ⟩ + α/2 ||θ − θ^{t−1}||²``
    (``local-steps`` SGD steps), then ``∇L_k(θ_k^t) = ∇L_k(θ_k^{t−1}) − α (θ_k^t − θ^{t−1})``, kept
    by the client. Server: ``h^t = h^{t−1} − α (1/m) Σ_{k∈P_t} (θ_k^t − θ^{t−1})`` with ``m`` the
    connected clients and ``θ^t = (1/|P_t|) Σ_{k∈P_t} θ_k^t − h^t / α`` (uniform, not sample-weighted).
    Batch-norm running statistics are averaged without ``h``. PFLlib's client regularizes with the
    unsquared norm ``α/2 ||θ − θ^{t−1}||``; FL-bench's keeps only a linear term (no pull toward
    ``θ^{t−1}``), clips gradients and averages ``h`` over every client: neither is the paper's.

    Default: ``α = 0.01``, the value of the authors' code (``alpha_coef = 1e-2``). FL-bench's default is
    0.1 and PFLlib's shared ``--alpha`` is 1.0; the reference check runs all three at 0.01. A larger α
    pulls the local models harder toward ``θ^{t−1}`` (less local drift, slower local progress).
    """

    name = "feddyn"
    strategy = "FedDyn"
    client = FedDynClient
    state_attributes = ("h",)
    without_client_algorithm = "runs without the dynamic regularizer: the mean of plain local models shifted by h"

    alpha: float = param(0.01, key="feddyn-alpha", must=POSITIVE, doc="weight α of the dynamic regularizer")
    h: torch.Tensor | None = field(default=None, init=False, repr=False)

    def setup(self, layout: ParamLayout, initial: torch.Tensor, device: torch.device, seed: int = 0) -> None:
        super().setup(layout, initial, device, seed)
        self.h = torch.zeros(layout.dim)
        #: the entries ``h`` corrects: everything but batch-norm running statistics
        self.corrected = ~name_mask(layout, is_statistic)

    def train_config(self, num_participants: int) -> Settings:
        return {ALPHA: self.alpha}

    def combine(self, replies: Sequence[Reply]) -> torch.Tensor:
        models = torch.stack([r.model for r in replies])
        new, h = dynamic_server_update(self.model, self.h, models, self.alpha, max(self.num_clients, len(replies)))  # type: ignore[arg-type]
        self.h = torch.where(self.corrected, h, 0.0)
        return torch.where(self.corrected, new, models.mean(0))
