"""Server side of the methods whose personalized model the client makes: the server trains a global
model (FedAvg, or pFedMe's β-mixed average) and tells clients how to personalize it (Ditto,
Per-FedAvg, pFedMe, APFL)."""

from __future__ import annotations

from typing import Any, Hashable, Sequence

import torch

from flower_pfl.methods.apfl import ALPHA_INIT, ALPHA_LR, EVALUATE_MIXED
from flower_pfl.methods.ditto import LAMBDA
from flower_pfl.methods.per_fedavg import ADAPT, ALPHA
from flower_pfl.methods.pfedme import EVALUATE_BOTH, INNER_STEPS, LAMBDA as PFEDME_LAMBDA, PERSONAL_LR

from .global_server import FedAvgServer, weighted_mean


class DittoServer(FedAvgServer):
    """Ditto: clients also train a personal model with ``lam / 2 ||v − w||²`` toward the global
    model, keep it in their state and evaluate it."""

    def __init__(self, lam: float = 1.0) -> None:
        super().__init__()
        if lam < 0:
            raise ValueError(f"Ditto's lambda must be >= 0, got {lam}")
        self.lam = lam

    def instructions(self, num_participants: int) -> dict[str, Any]:
        return {LAMBDA: self.lam}

    def evaluation_config(self) -> dict[str, Any]:
        return {LAMBDA: self.lam}


class PerFedAvgServer(FedAvgServer):
    """Per-FedAvg (first order): clients take MAML steps with inner step ``alpha`` and evaluate the
    global model after one step of size ``alpha`` on their training split."""

    def __init__(self, alpha: float = 0.01) -> None:
        super().__init__()
        if alpha <= 0:
            raise ValueError(f"Per-FedAvg's alpha must be > 0, got {alpha}")
        self.alpha = alpha

    def instructions(self, num_participants: int) -> dict[str, Any]:
        return {ALPHA: self.alpha}

    def evaluation_config(self) -> dict[str, Any]:
        return {ADAPT: self.alpha}


class PFedMeServer(FedAvgServer):
    """pFedMe: ``w ← (1 − β) w + β · mean_i w_i`` (sample-weighted); clients solve for their
    personalized θ_i with ``lam``, ``personal_lr`` and ``inner_steps`` (K) and report the accuracy
    of θ_i (PM) and of the global model (GM)."""

    def __init__(self, beta: float = 1.0, lam: float = 15.0, personal_lr: float = 0.01, inner_steps: int = 5) -> None:
        super().__init__()
        if not 0 < beta <= 2 or lam <= 0 or personal_lr <= 0 or inner_steps < 1:
            raise ValueError("pFedMe needs 0 < beta <= 2, lam > 0, personal_lr > 0 and inner_steps >= 1")
        self.beta, self.lam, self.personal_lr, self.inner_steps = beta, lam, personal_lr, inner_steps

    def instructions(self, num_participants: int) -> dict[str, Any]:
        return {PFEDME_LAMBDA: self.lam, PERSONAL_LR: self.personal_lr, INNER_STEPS: self.inner_steps}

    def evaluation_config(self) -> dict[str, Any]:
        return {EVALUATE_BOTH: True}

    def aggregate(self, ids: Sequence[Hashable], models: Sequence[torch.Tensor], payloads: Sequence[Any],
                  num_examples: Sequence[int]) -> torch.Tensor:
        return (1 - self.beta) * self.global_model + self.beta * weighted_mean(models, num_examples)  # type: ignore[operator]


class APFLServer(FedAvgServer):
    """APFL: clients keep a personal model and a mixing weight α (starting at ``alpha_init``,
    stepped with ``alpha_lr``) and evaluate the mixture ``α v(x) + (1 − α) w(x)``."""

    def __init__(self, alpha_init: float = 0.5, alpha_lr: float = 0.02) -> None:
        super().__init__()
        if not 0 <= alpha_init <= 1 or alpha_lr < 0:
            raise ValueError("APFL needs 0 <= alpha_init <= 1 and alpha_lr >= 0")
        self.alpha_init, self.alpha_lr = alpha_init, alpha_lr

    def instructions(self, num_participants: int) -> dict[str, Any]:
        return {ALPHA_LR: self.alpha_lr, ALPHA_INIT: self.alpha_init}

    def evaluation_config(self) -> dict[str, Any]:
        return {EVALUATE_MIXED: True}
