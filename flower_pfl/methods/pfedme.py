"""pFedMe (T. Dinh, Tran, Nguyen 2020): personalized models θ_i as Moreau envelopes of the clients'
losses around their local copies w_i of the global model.

Client, per local step on a fresh minibatch ``D``: ``K`` gradient steps on
``f(θ; D) + λ/2 ||θ − w||²`` (step ``personal_lr``, from the current θ), then
``w ← w − η λ (w − θ)`` (its Algorithm 1). Server: ``w ← (1 − β) w + β · mean_i w_i``.
The reference optimizer adds a hidden weight decay; there is none here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

from flower_pfl.engine.client_algorithm import (
    Batch,
    ClientAlgorithm,
    ClientState,
    LossFn,
    TrainData,
    keep,
    setting,
    sgd_update,
    trainable,
)
from flower_pfl.engine.client_metrics import GLOBAL_ACCURACY
from flower_pfl.engine.layout import ParamLayout
from flower_pfl.engine.params import AT_LEAST_ONE, POSITIVE, Rule, param
from flower_pfl.engine.reply_checks import Reply
from flower_pfl.engine.server_algorithm import GlobalModelAlgorithm, Settings
from flower_pfl.methods.base import Method

#: config keys: λ, the personalized step and K
LAMBDA, PERSONAL_LR, INNER_STEPS = "pfedme-lambda", "pfedme-personal-lr", "pfedme-inner-steps"
#: client-state key of the personalized model θ_i (flat, the whole ``state_dict``)
THETA_STATE = "pfedme-theta"


def personalize(model: nn.Module, theta: Sequence[torch.Tensor], loss_of: Callable[[torch.Tensor], torch.Tensor],
                inputs: torch.Tensor, *, lam: float, personal_lr: float, inner_steps: int) -> tuple[list[torch.Tensor], torch.Tensor]:
    """``K = inner_steps`` gradient steps on ``loss_of(θ(inputs)) + λ/2 ||θ − w||²`` from ``θ``
    (eq. 7 solved approximately; ``w``: the model's parameters). Returns the new θ and its last loss."""
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    params = trainable(model)
    for _ in range(inner_steps):
        leaves = [t.detach().requires_grad_(True) for t in theta]
        loss = loss_of(functional_call(model, dict(zip(names, leaves)), (inputs,)))
        grads = torch.autograd.grad(loss, leaves)
        with torch.no_grad():
            theta = [t - personal_lr * (g + lam * (t - w)) for t, g, w in zip(leaves, grads, params)]
    return [t.detach() for t in theta], loss.detach()


def personalized_vector(model: nn.Module, theta: Sequence[torch.Tensor]) -> torch.Tensor:
    """The model with θ_i in place of its trainable parameters, as one flat float32 vector in
    ``state_dict`` order (what the client keeps to evaluate)."""
    state = dict(model.state_dict())
    state.update(zip((n for n, p in model.named_parameters() if p.requires_grad), theta))
    return ParamLayout.from_arrays(state).flatten(state.values())


class PFedMeClient(ClientAlgorithm):
    """pFedMe's client (Algorithm 1): per step, θ_i from ``K`` steps on the minibatch's
    ``f(θ) + λ/2 ||θ − w||²``, then the gradient of ``w`` is ``λ (w − θ_i)`` (the model's own
    gradient is discarded). ``finish`` keeps θ_i; evaluation reports θ_i's accuracy (PM) and the
    received global model's (GM, ``global-accuracy``)."""

    keeps_state = True
    name = "pfedme"
    unbatched_because = "its step solves an inner problem for θ_i on each minibatch"
    evaluated_state = THETA_STATE  # θ_i, the personalized model
    needs_plain_sgd = True


    def __init__(self, model: nn.Module, config: Mapping[str, Any], state: ClientState | None = None,
                 loss_fn: LossFn = F.cross_entropy) -> None:
        super().__init__(model, config, state, loss_fn)
        self.lam = float(setting(config, LAMBDA, "pFedMe"))
        self.personal_lr = float(setting(config, PERSONAL_LR, "pFedMe"))
        self.inner_steps = int(setting(config, INNER_STEPS, "pFedMe"))
        if self.lam <= 0 or self.personal_lr <= 0 or self.inner_steps < 1:
            raise ValueError("pFedMe needs lam > 0, personal_lr > 0 and inner_steps >= 1")
        self.theta = [r.clone() for r in self.received]

    def adjust_gradients(self, model: nn.Module, batch: Batch | None = None) -> None:
        if batch is None:
            raise ValueError("pFedMe solves its inner problem on the minibatch: pass (x, y) to adjust_gradients")
        x, y = batch
        self.theta, loss = personalize(model, self.theta, lambda out: self.loss_fn(out, y), x, lam=self.lam,
                                       personal_lr=self.personal_lr, inner_steps=self.inner_steps)
        self.step_loss = float(loss)  # the loss pFedMe reports is θ's
        self.steps += 1
        with torch.no_grad():
            for p, t in zip(trainable(model), self.theta):
                p.grad = self.lam * (p - t)

    def train_step(self, model: nn.Module, next_batch: Callable[[], Batch], lr: float) -> float:
        """A user's loop iteration without its forward and backward pass, whose gradient
        ``adjust_gradients`` replaces anyway."""
        batch = next_batch()
        self.adjust_gradients(model, batch)
        sgd_update(model, lr)
        return self.step_loss  # type: ignore[return-value]

    def end_round(self, model: nn.Module, inputs: Any = None) -> dict[str, bytes]:
        keep(self.state, THETA_STATE, [personalized_vector(model, self.theta)])
        return {}

    @classmethod
    def evaluation_model(cls, model: nn.Module, config: Mapping[str, Any], state: ClientState | None, train: TrainData,
                         test: Callable[[nn.Module], Any]) -> tuple[nn.Module, dict[str, float]]:
        extra = {GLOBAL_ACCURACY: test(model).accuracy}  # the received global model's, before θ_i replaces it
        return super().evaluation_model(model, config, state, train, test)[0], extra


@dataclass
class PFedMe(Method, GlobalModelAlgorithm):
    """pFedMe (Dinh et al. 2020): a global model ``w ← (1 − β) w + β · mean w_i`` (sample-weighted);
    every client keeps its personalized θ_i (Moreau envelope) and reports the accuracy of θ_i (PM,
    ``accuracy``) and of the global model (GM, ``global-accuracy``)."""

    name = "pfedme"
    strategy = "PFedMe"
    client = PFedMeClient
    without_client_algorithm = "runs as FedAvg with server mixing β: no personalized model θ_i is trained"

    beta: float = param(1.0, key="pfedme-beta", must=Rule(lambda v: 0 < v <= 2, "a number in (0, 2]"),
                        doc="server mixing β: w ← (1 − β) w + β mean(w_i)")
    lam: float = param(15.0, key="pfedme-lambda", must=POSITIVE, doc="regularization weight λ")
    personal_lr: float = param(0.01, key="pfedme-personal-lr", must=POSITIVE, doc="step of the K inner steps that find θ_i")
    inner_steps: int = param(5, key="pfedme-inner-steps", must=AT_LEAST_ONE, doc="K, the inner steps per local step")

    def train_config(self, num_participants: int) -> Settings:
        return {LAMBDA: self.lam, PERSONAL_LR: self.personal_lr, INNER_STEPS: self.inner_steps}

    def combine(self, replies: Sequence[Reply]) -> torch.Tensor:
        return (1 - self.beta) * self.model + self.beta * super().combine(replies)
