"""APFL (Deng, Kamani, Mahdavi 2020): adaptive personalized FL. Each client keeps a personal model
``v_i`` and a mixing weight ``α_i``; it predicts with ``α_i v_i(x) + (1 − α_i) w(x)`` (output
mixing), where ``w`` is the FedAvg model."""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from flower_pfl.engine.client_algorithm import Batch, ClientAlgorithm, ClientState, LossFn, TrainData, keep, load_stored, stored
from flower_pfl.engine.evaluation import Personalization
from flower_pfl.engine.functional import Functional, State, sgd
from flower_pfl.engine.params import NON_NEGATIVE, UNIT_INTERVAL, param
from flower_pfl.engine.server_algorithm import GlobalModelAlgorithm, Settings
from flower_pfl.methods.base import Method

#: config keys: α's step and start value
ALPHA_LR, ALPHA_INIT = "apfl-alpha-lr", "apfl-alpha-init"
#: client-state key: the personal model (flat) and α
PERSONAL_STATE = "apfl-personal"


class Mixture(Personalization):
    """``α v(x) + (1 − α) w(x)``: the personalized predictor."""

    alpha: torch.Tensor

    def __init__(self, personal: nn.Module, global_model: nn.Module, alpha: float | torch.Tensor) -> None:
        super().__init__()
        self.personal, self.global_model = personal, global_model
        device = next(global_model.parameters()).device
        self.register_buffer("alpha", torch.as_tensor(alpha, dtype=torch.float32, device=device).reshape(()))

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
    global model the client receives, α as ``apfl-alpha-init``; both (v's state and α, a 0-d tensor)
    are carried from step to step."""

    keeps_state = True
    name = "apfl"
    needs_state = True
    hookable = False


    carried = ("personal", "alpha")

    def __init__(self, model: nn.Module, config: Mapping[str, Any], state: ClientState | None = None,
                 loss_fn: LossFn = F.cross_entropy) -> None:
        super().__init__(model, config, state, loss_fn)
        kept = stored(state, PERSONAL_STATE)
        alpha = float(kept[1][0]) if kept is not None else float(config[ALPHA_INIT])
        self.alpha_lr = float(config[ALPHA_LR])
        if self.alpha_lr < 0 or not 0 <= alpha <= 1:
            raise ValueError("APFL needs alpha_lr >= 0 and 0 <= alpha <= 1")
        self.personal = Functional(model).kept(state, PERSONAL_STATE)  # v's state
        self.alpha = torch.tensor(alpha, dtype=torch.float32, device=self.personal[0].device)

    def step(self, f: Functional, state: State, batches: Sequence[Batch], lr: float) -> tuple[State, torch.Tensor]:
        """The global model's SGD step; the personal model's and α's on the mixture with ``w(x)`` from
        before that step, on the same minibatch."""
        (x, y), = batches

        def global_loss(w: State) -> tuple[torch.Tensor, torch.Tensor]:
            logits = f(w, x)
            return self.loss(logits, y), logits

        grads, _, loss, state, out_w = f.grad(global_loss, state, has_aux=True)
        fixed = out_w.detach()  # the mixture uses w before its step (Algorithm 1)

        def mixed_loss(v: State, a: torch.Tensor) -> torch.Tensor:
            return self.loss(a * f(v, x) + (1 - a) * fixed, y)

        v_grads, (a_grad,), _, personal, _ = f.grad(mixed_loss, self.personal, self.alpha)
        self.personal = f.with_params(personal, sgd(f.params(personal), v_grads, lr))
        self.alpha = torch.clamp(self.alpha - self.alpha_lr * a_grad, 0.0, 1.0)
        return f.with_params(state, sgd(f.params(state), grads, lr)), loss

    def end_round(self, model: nn.Module, inputs: Any = None) -> dict[str, bytes]:
        keep(self.state, PERSONAL_STATE, [Functional(model).flat(self.personal), self.alpha.detach().reshape(1).float()])
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
    aggregate_only = True
    client = APFLClient
    without_client_algorithm = "runs as FedAvg: no personal model v_i or mixing weight α is trained"

    alpha_init: float = param(0.5, key="apfl-alpha-init", must=UNIT_INTERVAL, doc="the mixing weight α a client starts with")
    alpha_lr: float = param(0.02, key="apfl-alpha-lr", must=NON_NEGATIVE, doc="step of α (0 keeps it fixed)")

    def train_config(self, num_participants: int) -> Settings:
        return {ALPHA_LR: self.alpha_lr, ALPHA_INIT: self.alpha_init}
