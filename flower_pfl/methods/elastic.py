"""Elastic aggregation (Chen et al. 2023): FedAvg whose update is scaled per parameter by its sensitivity."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from flower_pfl.engine.client_algorithm import Batch, ClientAlgorithm, ClientState, LossFn, over_state, setting
from flower_pfl.engine.functional import Functional, State, sgd
from flower_pfl.engine.params import HALF_OPEN_UNIT, NON_NEGATIVE, param
from flower_pfl.engine.reply_checks import Reply, norm, received_vector
from flower_pfl.engine.server_algorithm import GlobalModelAlgorithm, Settings
from flower_pfl.engine.wire import encode_vector
from flower_pfl.methods.base import Method
from flower_pfl.methods.moon import needs_batch

#: config key: the sensitivity's moving-average weight μ
MU = "elastic-mu"
#: reply key: the client's sensitivity Ω_k, one value per entry of the model's state (float32 bytes; 0
#: for buffers)
SENSITIVITY = "elastic-sensitivity"


def output_sensitivity(model: nn.Module, x: torch.Tensor) -> list[torch.Tensor]:
    """``|∂ mean_n ||F(x_n)||² / ∂θ|`` for each trainable parameter ``θ``: how much the squared norm of
    the model's output moves with each parameter (the model in evaluation mode: batch-norm statistics
    untouched; a parameter the output does not depend on gets 0)."""
    f = Functional(model)
    return sensitivity(f, f.state(), x)


def sensitivity(f: Functional, state: State, x: torch.Tensor) -> list[torch.Tensor]:
    """``output_sensitivity`` of the model holding ``state`` (``params`` order), as a function of tensors."""
    with f.evaluating():
        grads, _, _, _, _ = f.grad(lambda s: f(s, x).pow(2).sum(1).mean(), state)
    return [g.abs() for g in grads]


def elastic_coefficients(sensitivities: torch.Tensor, weights: torch.Tensor, tau: float) -> torch.Tensor:
    """``ζ = 1 + τ − Ω / Ω_max`` per parameter, from the ``(m, d)`` sensitivities ``Ω_k`` and the weights
    ``p_k`` (summing to 1): ``Ω = Σ_k p_k Ω_k`` and ``Ω_max = max_k Ω_k``; 1 (FedAvg) where ``Ω_max = 0``."""
    top = sensitivities.max(0).values
    ratio = (weights.to(sensitivities) @ sensitivities) / torch.where(top > 0, top, torch.ones_like(top))
    return torch.where(top > 0, 1 + tau - ratio, torch.ones_like(top))


class ElasticClient(ClientAlgorithm):
    """Elastic aggregation's client: plain local SGD; before each step it takes the output's
    sensitivity on the minibatch (``output_sensitivity``) into ``Ω ← μ Ω + (1 − μ) |g|`` (``Ω = 0``
    at the round's start) and ``finish`` returns ``Ω`` as ``elastic-sensitivity``.

    The package's loop runs ``step`` (``Ω`` carried from step to step, so a round's clients train as
    one computation); a user's loop runs ``adjust_gradients``; both take ``Ω`` through ``_measured``."""

    name = "elastic"
    reply_keys = (SENSITIVITY,)
    carried = ("sensitivity",)

    def __init__(self, model: nn.Module, config: Mapping[str, Any], state: ClientState | None = None,
                 loss_fn: LossFn = F.cross_entropy) -> None:
        super().__init__(model, config, state, loss_fn)
        self.mu = float(setting(config, MU, "Elastic"))
        if not 0 <= self.mu < 1:
            raise ValueError(f"Elastic's mu must be in [0, 1), got {self.mu}")
        self.sensitivity = [torch.zeros_like(p) for p in self.received]

    def _measured(self, f: Functional, state: State, x: torch.Tensor) -> None:
        """``Ω ← μ Ω + (1 − μ) |g|`` with the sensitivity ``g`` of the model holding ``state`` on ``x``."""
        self.sensitivity = [self.mu * s + (1 - self.mu) * a for s, a in zip(self.sensitivity, sensitivity(f, state, x))]

    def step(self, f: Functional, state: State, batches: Sequence[Batch], lr: float) -> tuple[State, torch.Tensor]:
        """The loop's step: the loss's gradient (its training-mode pass updating the running statistics),
        the sensitivity of the model it holds then, and the SGD step."""
        (x, y), = batches
        grads, _, loss, state, _ = f.grad(lambda w: self.loss(f(w, x), y), state)
        self._measured(f, state, x)
        return f.with_params(state, sgd(f.params(state), grads, lr)), loss

    def adjust_gradients(self, model: nn.Module, batch: Batch | None = None) -> None:
        x, _ = needs_batch(batch, "Elastic")
        f = Functional(model)
        self._measured(f, f.state(), x)
        super().adjust_gradients(model, batch)

    def end_round(self, model: nn.Module, inputs: Any = None) -> dict[str, bytes]:
        if self.steps < 1:
            raise ValueError("Elastic's sensitivity needs at least one step")
        return {SENSITIVITY: encode_vector(over_state(model, self.sensitivity))}


@dataclass
class Elastic(Method, GlobalModelAlgorithm):
    """Elastic aggregation (Chen et al. 2023): FedAvg whose update is scaled per parameter, less where
    the clients' outputs are sensitive to the parameter and more where they are not.

    Client ``k``: plain local SGD; on each minibatch, before the step, the parameters' sensitivity
    ``Ω_k ← μ Ω_k + (1 − μ) |g_k|``, ``g_k = ∂ mean_n ||F(x_n; θ)||²₂ / ∂θ`` (unsupervised and online,
    as the paper measures it), sent up with the model. Server: ``Ω = Σ_k p_k Ω_k`` with ``p_k``
    the sample shares, ``Ω_max = max_k Ω_k`` (per parameter), ``ζ = 1 + τ − Ω / Ω_max`` and
    ``θ ← θ + ζ ⊙ Σ_k p_k (θ_k − θ)``: ``ζ`` lies in ``[τ, 1 + τ]``; where no participant's output depends
    on a parameter (and for buffers) ``ζ = 1``.

    Against FL-bench: it takes the sensitivity per tensor (the squared norm of the tensor's gradient),
    of the supervised loss, once before training on a held-out 30% of the client's data (trained on
    the other 70%) and carried over rounds; here it is the paper's, per parameter, of the output's
    norm, on the minibatches trained on, ``Ω_k`` starting at 0 each round (the clients keep no state:
    a scale common to the clients cancels in ``Ω / Ω_max``).
    """

    name = "elastic"
    strategy = "Elastic"
    client = ElasticClient
    without_client_algorithm = "cannot run: every reply lacks the sensitivity Ω_k"

    tau: float = param(0.5, key="elastic-tau", must=NON_NEGATIVE, doc="τ: the elastic coefficients ζ lie in [τ, 1 + τ] (FL-bench's 0.5)")
    mu: float = param(0.95, key="elastic-mu", must=HALF_OPEN_UNIT, doc="μ: the weight of the past in the sensitivity's moving average (FL-bench's 0.95)")

    def train_config(self, num_participants: int) -> Settings:
        return {MU: self.mu}

    def check_extras(self, extras: Mapping[str, Any]) -> torch.Tensor:
        """The client's sensitivity ``Ω_k``: float32 bytes of the model's size, finite and ``≥ 0``."""
        sensitivity = received_vector(extras, SENSITIVITY, self.layout.dim, "Elastic's sensitivity Ω_k", ElasticClient.__name__)
        if (sensitivity < 0).any():
            raise ValueError(f"'{SENSITIVITY}' holds negative values (a sensitivity is an absolute value)")
        return sensitivity

    def example_extras(self, generator: torch.Generator) -> dict[str, bytes]:
        return {SENSITIVITY: encode_vector(torch.rand(self.layout.dim, generator=generator))}

    def update_norms(self, reply: Reply, sent: torch.Tensor) -> dict[str, tuple[float, float]]:
        """The model's change, and the sensitivity against the round's median."""
        return {**super().update_norms(reply, sent), SENSITIVITY: (norm(reply.extras), 0.0)}

    def combine(self, replies: Sequence[Reply]) -> torch.Tensor:
        counts = torch.tensor([float(r.num_examples) for r in replies])
        weights = counts / counts.sum()
        zeta = elastic_coefficients(torch.stack([r.extras for r in replies]), weights, self.tau)
        return self.model + zeta * (weights @ (torch.stack([r.model for r in replies]) - self.model))
