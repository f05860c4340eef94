"""Ditto (Li, Hu, Beirami, Smith 2021): a global model by FedAvg and, on every client, a personal
model ``v_i`` trained on ``f_i(v) + λ/2 ||v − w||²`` toward the global model it received."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from flower_pfl.engine.client_algorithm import Batch, ClientAlgorithm, ClientState, LossFn, added, keep, proximal_terms
from flower_pfl.engine.functional import Functional, State, sgd
from flower_pfl.engine.params import NON_NEGATIVE, param
from flower_pfl.engine.server_algorithm import GlobalModelAlgorithm, Settings
from flower_pfl.methods.base import Method

#: config key: Ditto's λ
LAMBDA = "ditto-lambda"
#: client-state key of the personal model (flat)
PERSONAL_STATE = "ditto-personal"


class DittoClient(ClientAlgorithm):
    """Ditto's client (Algorithm 1): per minibatch, a plain SGD step of the global model and a
    proximal step of the personal model ``v`` toward the received global model; ``v`` starts as the
    first global model the client receives and lives in the client state."""

    keeps_state = True
    name = "ditto"
    evaluated_state = PERSONAL_STATE  # the personal model
    needs_state = True
    hookable = False


    carried = ("personal",)
    batched_state = ("received",)

    def __init__(self, model: nn.Module, config: Mapping[str, Any], state: ClientState | None = None,
                 loss_fn: LossFn = F.cross_entropy) -> None:
        super().__init__(model, config, state, loss_fn)
        self.lam = float(config[LAMBDA])
        if self.lam < 0:
            raise ValueError(f"Ditto's lambda must be >= 0, got {self.lam}")
        self.personal = Functional(model).kept(state, PERSONAL_STATE)  # v's state

    def step(self, f: Functional, state: State, batches: Sequence[Batch], lr: float) -> tuple[State, torch.Tensor]:
        """The personal model's proximal step toward the received model, then the global model's SGD step,
        on the same minibatch."""
        (x, y), = batches
        grads, _, _, personal, _ = f.grad(lambda v: self.loss(f(v, x), y), self.personal)
        v = f.params(personal)
        self.personal = f.with_params(personal, sgd(v, added(grads, proximal_terms(self.lam, v, self.received)), lr))
        grads, _, loss, state, _ = f.grad(lambda w: self.loss(f(w, x), y), state)
        return f.with_params(state, sgd(f.params(state), grads, lr)), loss

    def end_round(self, model: nn.Module, inputs: Any = None) -> dict[str, bytes]:
        keep(self.state, PERSONAL_STATE, [Functional(model).flat(self.personal)])
        return {}


@dataclass
class Ditto(Method, GlobalModelAlgorithm):
    """Ditto (Li et al. 2021): FedAvg plus a personal model on every client, trained toward the global
    model with weight λ, kept in the client's state and evaluated."""

    name = "ditto"
    strategy = "Ditto"
    aggregate_only = True
    client = DittoClient
    without_client_algorithm = "runs as FedAvg: no personal model v_i is trained"

    lam: float = param(1.0, key="ditto-lambda", must=NON_NEGATIVE, doc="weight λ of the personal model's pull toward the global model")

    def train_config(self, num_participants: int) -> Settings:
        return {LAMBDA: self.lam}

