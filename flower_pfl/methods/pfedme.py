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

from flower_pfl.engine.client_algorithm import Batch, ClientAlgorithm, ClientState, LossFn, TrainData, keep, setting, trainable
from flower_pfl.engine.client_metrics import GLOBAL_ACCURACY
from flower_pfl.engine.functional import Functional, State, sgd
from flower_pfl.engine.layout import ParamLayout
from flower_pfl.engine.params import AT_LEAST_ONE, POSITIVE, Rule, param
from flower_pfl.engine.reply_checks import Reply
from flower_pfl.engine.server_algorithm import GlobalModelAlgorithm, Settings
from flower_pfl.methods.base import Method

#: config keys: λ, the personalized step and K
LAMBDA, PERSONAL_LR, INNER_STEPS = "pfedme-lambda", "pfedme-personal-lr", "pfedme-inner-steps"
#: client-state key of the personalized model θ_i (flat, the whole ``state_dict``)
THETA_STATE = "pfedme-theta"


def personalize(f: Functional, state: State, theta: Sequence[torch.Tensor], loss_of: Callable[[torch.Tensor], torch.Tensor],
                inputs: torch.Tensor, *, lam: float, personal_lr: float, inner_steps: int) -> tuple[State, torch.Tensor, State]:
    """``K = inner_steps`` gradient steps on ``loss_of(θ(inputs)) + λ/2 ||θ − w||²`` from ``θ``
    (eq. 7 solved approximately; ``w``: the trainable entries of the model's ``state``). Returns the new θ,
    its last loss, and ``state`` with the buffers the K forward passes updated (θ shares the model's)."""
    w, inner, loss = f.params(state), state, torch.zeros(())
    for _ in range(inner_steps):
        grads, _, loss, inner, _ = f.grad(lambda s: loss_of(f(s, inputs)), f.with_params(inner, theta))
        theta = [t - personal_lr * (g + lam * (t - p)) for t, g, p in zip(theta, grads, w)]
    return list(theta), loss, f.with_params(inner, w)


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
    evaluated_state = THETA_STATE  # θ_i, the personalized model
    needs_plain_sgd = True
    carried = ("theta",)

    def __init__(self, model: nn.Module, config: Mapping[str, Any], state: ClientState | None = None,
                 loss_fn: LossFn = F.cross_entropy) -> None:
        super().__init__(model, config, state, loss_fn)
        self.lam = float(setting(config, LAMBDA, "pFedMe"))
        self.personal_lr = float(setting(config, PERSONAL_LR, "pFedMe"))
        self.inner_steps = int(setting(config, INNER_STEPS, "pFedMe"))
        if self.lam <= 0 or self.personal_lr <= 0 or self.inner_steps < 1:
            raise ValueError("pFedMe needs lam > 0, personal_lr > 0 and inner_steps >= 1")
        self.theta = [r.clone() for r in self.received]

    def inner_problem(self, f: Functional, state: State, batch: Batch) -> tuple[torch.Tensor, State]:
        """θ_i from the minibatch (``personalize``, with the user's loss), kept in ``theta``; the step's reported
        loss (θ's) and the state with the buffers its forward passes updated. The hook and the step both use it."""
        x, y = batch
        self.theta, loss, state = personalize(f, state, self.theta, lambda out: self.loss(out, y), x, lam=self.lam,
                                              personal_lr=self.personal_lr, inner_steps=self.inner_steps)
        return loss, state

    def gradient_of_w(self, params: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """``λ (w − θ_i)``, the gradient ``w``'s step takes (the model's own is discarded)."""
        return [self.lam * (p - t) for p, t in zip(params, self.theta)]

    def adjust_gradients(self, model: nn.Module, batch: Batch | None = None) -> None:
        if batch is None:
            raise ValueError("pFedMe solves its inner problem on the minibatch: pass (x, y) to adjust_gradients")
        f = Functional(model)
        with torch.no_grad():
            loss, state = self.inner_problem(f, f.state(), batch)
            for target, value, train in zip(model.state_dict().values(), state, f.trains):
                if not train:  # the running statistics the inner forward passes updated, as model(x) does
                    target.copy_(value)
            params = trainable(model)
            for p, g in zip(params, self.gradient_of_w(params)):
                p.grad = g
        self.step_loss = float(loss)  # the loss pFedMe reports is θ's
        self.steps += 1

    def step(self, f: Functional, state: State, batches: Sequence[Batch], lr: float) -> tuple[State, torch.Tensor]:
        """``adjust_gradients`` and the SGD step of a user's loop, without its forward and backward pass (whose
        gradient is discarded anyway)."""
        batch, = batches
        loss, state = self.inner_problem(f, state, batch)
        w = f.params(state)
        return f.with_params(state, sgd(w, self.gradient_of_w(w), lr)), loss

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
    aggregate_only = True
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
