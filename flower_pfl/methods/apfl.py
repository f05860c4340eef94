"""APFL (Deng, Kamani, Mahdavi 2020): adaptive personalized FL. Each client keeps a personal model
``v_i`` and a mixing weight ``α_i``; it predicts with ``α_i v_i(x) + (1 − α_i) w(x)`` (output
mixing), where ``w`` is the FedAvg model."""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from flower_pfl.engine.client_algorithm import Batch, ClientAlgorithm, ClientState, LossFn, TrainData, keep, load_stored, stored, trainable
from flower_pfl.engine.layout import flatten_module
from flower_pfl.engine.params import NON_NEGATIVE, UNIT_INTERVAL, param
from flower_pfl.engine.server_algorithm import GlobalModelAlgorithm, Settings
from flower_pfl.methods.base import Method

#: config keys: α's step and start value
ALPHA_LR, ALPHA_INIT = "apfl-alpha-lr", "apfl-alpha-init"
#: client-state key: the personal model (flat) and α
PERSONAL_STATE = "apfl-personal"


class Mixture(nn.Module):
    """``α v(x) + (1 − α) w(x)``: the personalized predictor."""

    def __init__(self, personal: nn.Module, global_model: nn.Module, alpha: float | torch.Tensor) -> None:
        super().__init__()
        self.personal, self.global_model = personal, global_model
        self.alpha = alpha

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.alpha * self.personal(x) + (1 - self.alpha) * self.global_model(x)


def _personal(model: nn.Module, state: ClientState | None) -> tuple[nn.Module, float] | None:
    """The personal model and α kept in the client state (``None`` before the client's first round)."""
    personal = copy.deepcopy(model)
    if not load_stored(personal, state, PERSONAL_STATE):
        return None
    return personal, float(stored(state, PERSONAL_STATE)[1][0])  # type: ignore[index]


class APFLClient(ClientAlgorithm):
    """APFL's client (Algorithm 1), per minibatch: ``w ← w − η ∇f(w)``; with the mixture's loss
    ``f(α v(x) + (1 − α) w(x))`` at the same minibatch and the step's starting ``w`` (held fixed),
    ``v ← v − η ∇_v`` and ``α ← clip(α − η_α ∂/∂α, 0, 1)``. The personal model starts as the first
    global model the client receives, α as ``apfl-alpha-init``."""

    keeps_state = True
    name = "apfl"
    needs_state = True
    hookable = False


    def __init__(self, model: nn.Module, config: Mapping[str, Any], state: ClientState | None = None,
                 loss_fn: LossFn = F.cross_entropy) -> None:
        super().__init__(model, config, state, loss_fn)
        known = _personal(model, state)
        self.personal, self.alpha = known if known is not None else (copy.deepcopy(model), float(config[ALPHA_INIT]))
        self.alpha_lr = float(config[ALPHA_LR])
        if self.alpha_lr < 0 or not 0 <= self.alpha <= 1:
            raise ValueError("APFL needs alpha_lr >= 0 and 0 <= alpha <= 1")

    def train_step(self, model: nn.Module, next_batch: Callable[[], Batch], lr: float) -> float:
        x, y = next_batch()
        w_params, v_params = trainable(model), trainable(self.personal)
        self.personal.train()
        out_w = model(x)
        loss = self.loss_fn(out_w, y)
        grads = torch.autograd.grad(loss, w_params)
        fixed = out_w.detach()  # the mixture uses w before its step (Algorithm 1)
        with torch.no_grad():
            for p, g in zip(w_params, grads):
                p.sub_(lr * g)
        a = torch.tensor(float(self.alpha), requires_grad=True)
        mixed = self.loss_fn(a * self.personal(x) + (1 - a) * fixed, y)
        *v_grads, a_grad = torch.autograd.grad(mixed, [*v_params, a])
        with torch.no_grad():
            for p, g in zip(v_params, v_grads):
                p.sub_(lr * g)
        self.alpha = float(min(1.0, max(0.0, self.alpha - self.alpha_lr * float(a_grad))))
        return float(loss.detach())

    def end_round(self, model: nn.Module, inputs: Any = None) -> dict[str, bytes]:
        keep(self.state, PERSONAL_STATE, [flatten_module(self.personal), torch.tensor([self.alpha], dtype=torch.float32)])
        return {}

    @classmethod
    def evaluation_model(cls, model: nn.Module, config: Mapping[str, Any], state: ClientState | None, train: TrainData,
                         test: Callable[[nn.Module], Any]) -> tuple[nn.Module, dict[str, float]]:
        """The mixture of the personal model and the received global one (the received one before
        the client's first round)."""
        known = _personal(model, state)
        return (Mixture(known[0], model, known[1]) if known is not None else model), {}


@dataclass
class APFL(Method, GlobalModelAlgorithm):
    """APFL (Deng et al. 2020): FedAvg plus, on every client, a personal model and a mixing weight α
    (stepped by its gradient and clipped to [0, 1]); clients evaluate ``α v(x) + (1 − α) w(x)``."""

    name = "apfl"
    strategy = "APFL"
    client = APFLClient
    without_client_algorithm = "runs as FedAvg: no personal model v_i or mixing weight α is trained"

    alpha_init: float = param(0.5, key="apfl-alpha-init", must=UNIT_INTERVAL, doc="the mixing weight α a client starts with")
    alpha_lr: float = param(0.02, key="apfl-alpha-lr", must=NON_NEGATIVE, doc="step of α (0 keeps it fixed)")

    def train_config(self, num_participants: int) -> Settings:
        return {ALPHA_LR: self.alpha_lr, ALPHA_INIT: self.alpha_init}
