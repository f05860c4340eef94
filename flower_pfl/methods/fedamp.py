"""FedAMP and HeurFedAMP (Huang et al. 2021): attentive message passing between personalized models.

Server: each participant gets ``u_i = Σ_j ξ_ij w_j`` (its "cloud model"). Client: local SGD on
``f_i(w) + λ/(2 α_k) ||w − u_i||²`` from ``u_i``, the proximal step with ``μ = λ / α_k`` toward the
received model; its gradient is never zero while ``w ≠ u_i``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from flower_pfl.engine.client_algorithm import PROXIMAL_MU, Proximal
from flower_pfl.engine.layout import ParamLayout
from flower_pfl.engine.params import POSITIVE, UNIT_INTERVAL, param
from flower_pfl.engine.server_algorithm import Settings
from flower_pfl.methods.all_clients_train import AllClientsTrain
from flower_pfl.methods.attention import fedamp_weights, heuristic_fedamp_weights
from flower_pfl.methods.base import Method


@dataclass
class FedAMP(Method, AllClientsTrain):
    """FedAMP (Huang et al. 2021): each participant gets ``u_i = Σ_j ξ_ij w_j`` with distance-based
    weights and trains with a proximal term toward it.

    ``ξ_ij = α_k exp(−||w_i − w_j||² / σ) / σ`` for ``j ≠ i``, the self weight the rest; the client's
    proximal weight is ``λ / α_k`` (keep ``lr · λ / α_k`` well under 2 or local SGD diverges).
    """

    name = "fedamp"
    strategy = "FedAMP"
    client = Proximal
    default_clients_per_round = 10

    alpha_k: float = param(0.05, key="fedamp-alpha-k", must=POSITIVE,
                           doc="server step α_k (scales the weights; the client's proximal weight is λ / α_k)")
    sigma: float = param(1.0, key="fedamp-sigma", must=POSITIVE, doc="distance scale σ of ξ_ij = α_k exp(−||w_i − w_j||² / σ) / σ")
    lam: float = param(1.0, key="fedamp-lambda", must=POSITIVE, doc="regularization weight λ")

    @classmethod
    def check_run(cls, options: Mapping[str, Any]) -> tuple[str, str] | None:
        """No self weight may turn negative: ``(m − 1) α_k / σ ≤ 1`` for ``m`` participants."""
        if (stall := _stall(options)) is not None:
            return stall
        others = options["clients-per-round"] - 1
        if others * options["fedamp-alpha-k"] / options["fedamp-sigma"] > 1:
            return "fedamp-alpha-k", (f"at most fedamp-sigma / (clients-per-round - 1) = {options['fedamp-sigma'] / others:.4g}, "
                                      "so no self weight can turn negative")
        return None

    proximal_mu_text = "lam / alpha_k (run config fedamp-lambda / fedamp-alpha-k)"
    without_client_algorithm = "runs without its proximal term toward the cloud model u_i (weight λ / α_k): clients train plain SGD from u_i"

    def personalize(self, models: torch.Tensor, layout: ParamLayout) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        weights = fedamp_weights(models, self.alpha_k, self.sigma)
        return weights @ models, {"model": weights}

    def train_config(self, num_participants: int) -> Settings:
        return {PROXIMAL_MU: self.lam / self.alpha_k}


@dataclass
class HeurFedAMP(FedAMP):
    """HeurFedAMP (Huang et al. 2021): FedAMP with cosine-similarity weights, ``ξ_ij ∝ exp(σ cos(w_i, w_j))``
    over ``j ≠ i``, and a fixed self weight."""

    name = "heurfedamp"
    strategy = "HeurFedAMP"

    sigma: float = param(10.0, key="heurfedamp-sigma", must=POSITIVE, doc="scale σ of ξ_ij ∝ exp(σ cos(w_i, w_j))")
    self_weight: float = param(0.3, key="heurfedamp-self-weight", must=UNIT_INTERVAL, doc="fixed self weight ξ_ii")

    @classmethod
    def check_run(cls, options: Mapping[str, Any]) -> tuple[str, str] | None:
        return _stall(options)

    def personalize(self, models: torch.Tensor, layout: ParamLayout) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        weights = heuristic_fedamp_weights(models, self.sigma, self.self_weight)
        return weights @ models, {"model": weights}


def _stall(options: Mapping[str, Any]) -> tuple[str, str] | None:
    """Clients cannot train when ``lr · λ / α_k >= 1``: their proximal step lands on (or past) the anchor."""
    mu = options["fedamp-lambda"] / options["fedamp-alpha-k"]
    if options["lr"] * mu >= 1:
        return "fedamp-lambda", (f"below fedamp-alpha-k / lr = {options['fedamp-alpha-k'] / options['lr']:.4g}, so that "
                                 f"lr · fedamp-lambda / fedamp-alpha-k < 1 (it is {options['lr'] * mu:.4g}: clients could not train)")
    return None
