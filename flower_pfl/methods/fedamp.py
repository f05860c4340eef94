"""FedAMP and HeurFedAMP (Huang et al. 2021): attentive message passing between personalized models.

Server: each participant gets ``u_i = sum_j xi_ij w_j`` (its "cloud model"). Client: local SGD on
``f_i(w) + lam / (2 alpha_k) ||w - u_i||^2`` from ``u_i``, i.e. the proximal solver with
``mu = lam / alpha_k`` toward the received model; its gradient is never zero while ``w != u_i``
(the regularizer is built from live parameters, see ``solvers.proximal_term``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..attention import fedamp_weights, heuristic_fedamp_weights
from ..layout import ParamLayout
from .base import PROXIMAL_MU


@dataclass
class FedAMPRule:
    """FedAMP: ``xi_ij = alpha_k exp(-||w_i - w_j||^2 / sigma) / sigma`` (``j != i``), self weight the rest.

    ``alpha_k``: the server step (it scales the weights and divides the client's ``lam``);
    ``sigma``: the distance scale; ``lam``: the regularization weight. The client's proximal weight
    is ``lam / alpha_k``; keep ``lr * lam / alpha_k`` well under 2 or local SGD diverges.
    """

    alpha_k: float = 0.05
    sigma: float = 1.0
    lam: float = 1.0
    all_clients_train: bool = False
    name: str = field(default="fedamp", init=False)

    def __post_init__(self) -> None:
        for key in ("alpha_k", "sigma", "lam"):
            if not getattr(self, key) > 0:
                raise ValueError(f"{key} must be > 0, got {getattr(self, key)}")

    def personalize(self, models: torch.Tensor, layout: ParamLayout) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        weights = fedamp_weights(models, self.alpha_k, self.sigma)
        return weights @ models, {"model": weights}

    def client_config(self) -> dict[str, float | int | str]:
        return {PROXIMAL_MU: self.lam / self.alpha_k}


@dataclass
class HeurFedAMPRule(FedAMPRule):
    """HeurFedAMP: cosine similarity instead of distance, ``xi_ij`` proportional to
    ``exp(sigma cos(w_i, w_j))`` over ``j != i``, a fixed ``self_weight``."""

    sigma: float = 10.0
    self_weight: float = 0.3
    name: str = field(default="heurfedamp", init=False)

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0.0 <= self.self_weight <= 1.0:
            raise ValueError(f"self_weight must be in [0, 1], got {self.self_weight}")

    def personalize(self, models: torch.Tensor, layout: ParamLayout) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        weights = heuristic_fedamp_weights(models, self.sigma, self.self_weight)
        return weights @ models, {"model": weights}
