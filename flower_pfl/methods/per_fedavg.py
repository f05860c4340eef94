"""Per-FedAvg (Fallah, Mokhtari, Ozdaglar 2020), first-order version: FedAvg trains a model that
adapts well after one local step; a client's personalized model is that one step."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from flower_pfl.engine.client_algorithm import Batch, ClientAlgorithm, ClientState, LossFn, TrainData, setting, trainable
from flower_pfl.engine.functional import Functional, State, sgd
from flower_pfl.engine.params import POSITIVE, param
from flower_pfl.engine.server_algorithm import GlobalModelAlgorithm, Settings
from flower_pfl.methods.base import Method

#: config keys: Per-FedAvg's client algorithm (its α, the adaptation step size); evaluate after one step
ALPHA, ADAPT = "per-fedavg-alpha", "per-fedavg-adapt"


def _grads(model: nn.Module, x: torch.Tensor, y: torch.Tensor, loss_fn: LossFn = F.cross_entropy
           ) -> tuple[tuple[torch.Tensor, ...], float]:
    loss = loss_fn(model(x), y)
    return torch.autograd.grad(loss, trainable(model)), float(loss.detach())


def adapt_one_step(model: nn.Module, x: torch.Tensor, y: torch.Tensor, alpha: float) -> None:
    """The personalized model: one gradient step of size ``alpha`` on the client's whole training
    split (never its test split), in place."""
    if len(y) == 0:
        return
    grads, _ = _grads(model, x, y)
    with torch.no_grad():
        for p, g in zip(trainable(model), grads):
            p.sub_(alpha * g)


class PerFedAvgClient(ClientAlgorithm):
    """First-order MAML step on two fresh minibatches ``D``, ``D'``: ``w_tmp = w − α ∇f(w; D)``, then
    ``w ← w − β ∇f(w_tmp; D')`` with ``β`` the instruction's ``lr``. Evaluation: one step of size α
    on the training split."""

    name = "per-fedavg"
    hookable = False


    minibatches = 2

    def __init__(self, model: nn.Module, config: Mapping[str, Any], state: ClientState | None = None,
                 loss_fn: LossFn = F.cross_entropy) -> None:
        super().__init__(model, config, state, loss_fn)
        self.alpha = float(setting(config, ALPHA, "Per-FedAvg"))

    def step(self, f: Functional, state: State, batches: Sequence[Batch], lr: float) -> tuple[State, torch.Tensor]:
        """The step reports ``f(w; D)``; the running statistics follow both forward passes, ``D``'s then ``D'``'s."""
        (x, y), (x2, y2) = batches
        w = f.params(state)
        grads, _, loss, state, _ = f.grad(lambda s: self.loss(f(s, x), y), state)
        grads, _, _, state, _ = f.grad(lambda s: self.loss(f(s, x2), y2), f.with_params(state, sgd(w, grads, self.alpha)))
        return f.with_params(state, sgd(w, grads, lr)), loss

    @classmethod
    def evaluation_model(cls, model: nn.Module, config: Mapping[str, Any], state: ClientState | None, train: TrainData,
                         test: Callable[[nn.Module], Any]) -> tuple[nn.Module, dict[str, float]]:
        adapt_one_step(model, train.x, train.y, float(config[ADAPT]))
        return model, {}


@dataclass
class PerFedAvg(Method, GlobalModelAlgorithm):
    """Per-FedAvg (Fallah et al. 2020), first order: FedAvg of MAML-trained models; each client's
    personalized model is one step of size α on its training split (``lr`` is the outer step β)."""

    name = "per-fedavg"
    strategy = "PerFedAvg"
    aggregate_only = True
    client = PerFedAvgClient
    without_client_algorithm = "runs as FedAvg: its clients take plain SGD steps, not the MAML step"

    alpha: float = param(0.01, key="per-fedavg-alpha", must=POSITIVE, doc="inner (adaptation) step α; lr is the outer step β")

    def train_config(self, num_participants: int) -> Settings:
        return {ALPHA: self.alpha}

    def evaluation_config(self) -> Settings:
        return {ADAPT: self.alpha}
