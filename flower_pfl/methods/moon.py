"""MOON (Li, He, Song 2021): model-contrastive federated learning."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from flower_pfl.engine.client_algorithm import Batch, ClientAlgorithm, ClientState, LossFn, keep, setting
from flower_pfl.engine.functional import Functional
from flower_pfl.engine.layout import flatten_module
from flower_pfl.engine.params import NON_NEGATIVE, POSITIVE, param
from flower_pfl.engine.server_algorithm import GlobalModelAlgorithm, Settings
from flower_pfl.methods.base import Method

#: config keys: MOON's weight μ and temperature τ
MU, TAU = "moon-mu", "moon-tau"
#: client-state key of the client's previous local model w_i^{t−1} (flat, buffers included)
PREVIOUS_STATE = "moon-previous"


def contrastive_loss(z: torch.Tensor, z_global: torch.Tensor, z_previous: torch.Tensor, tau: float) -> torch.Tensor:
    """The model-contrastive loss, averaged over the batch:
    ``−log( e^{sim(z, z_glob)/τ} / (e^{sim(z, z_glob)/τ} + e^{sim(z, z_prev)/τ}) )`` with cosine ``sim``."""
    logits = torch.stack([F.cosine_similarity(z, z_global, dim=1), F.cosine_similarity(z, z_previous, dim=1)], dim=1) / tau
    return F.cross_entropy(logits, torch.zeros(len(z), dtype=torch.long, device=z.device))


def needs_batch(batch: Batch | None, who: str) -> Batch:
    if batch is None:
        raise ValueError(f"{who}'s client algorithm works on the minibatch: call algorithm.adjust_gradients(model, (x, y))")
    return batch


class MoonClient(ClientAlgorithm):
    """MOON's client: per minibatch, the gradient of ``μ ℓ_con`` is added to the loop's ``ℓ_sup``
    gradient, ``z`` from the model being trained, ``z_glob`` from the received global model and
    ``z_prev`` from the client's previous local model (client state; the received model before its
    first round, where ``ℓ_con = log 2`` has no gradient). ``finish`` keeps the trained model as the
    next previous one. The two frozen models are states (``Functional``) run on the model's
    architecture, so the step is the same in a user's loop and for a round's clients at once."""

    name = "moon"
    needs_state = keeps_state = True
    batched_state = ("global_state", "previous_state")

    def __init__(self, model: nn.Module, config: Mapping[str, Any], state: ClientState | None = None,
                 loss_fn: LossFn = F.cross_entropy) -> None:
        super().__init__(model, config, state, loss_fn)
        self.mu, self.tau = float(setting(config, MU, "MOON")), float(setting(config, TAU, "MOON"))
        if not (self.mu >= 0 and self.tau > 0):
            raise ValueError(f"MOON needs mu >= 0 and tau > 0, got mu = {self.mu}, tau = {self.tau}")
        self.model = model  # the model being trained: its representation is differentiated
        f = Functional(model)
        self.global_state = [t.clone() for t in f.state()]  # w^t, the received model
        self.previous_state = f.kept(state, PREVIOUS_STATE)  # w_i^{t−1} (w^t before the client's first round)

    def gradient_terms(self, params: Sequence[torch.Tensor], batch: Batch | None) -> Sequence[torch.Tensor | None]:
        x = needs_batch(batch, "MOON")[0]
        f = Functional(self.model)
        with f.evaluating():  # the frozen models in evaluation mode
            z_global = f.with_features(self.global_state, x)[1]
            z_previous = f.with_features(self.previous_state, x)[1]
        # the model being trained in its mode: in training mode its output reads the minibatch's statistics, not
        # the running ones, so the received model's stand in (copies: what this extra pass writes is dropped)
        others = self.global_state if self.model.training else f.state()
        grads, _, _, _, _ = f.grad(lambda s: self.mu * contrastive_loss(f.with_features(s, x)[1], z_global, z_previous, self.tau),
                                   f.with_params(others, params))
        return grads

    def end_round(self, model: nn.Module, inputs: Any = None) -> dict[str, bytes]:
        keep(self.state, PREVIOUS_STATE, [flatten_module(model)])
        return {}


@dataclass
class MOON(Method, GlobalModelAlgorithm):
    """MOON (Li, He, Song 2021): FedAvg whose clients add a model-contrastive loss pulling their
    representation toward the global model's and away from their previous local model's.

    Client (Sec. 3.3, Algorithm 1): ``ℓ = ℓ_sup(w; (x, y)) + μ ℓ_con(w; w_i^{t−1}; w^t; x)`` with
    ``ℓ_con = −log( exp(sim(z, z_glob)/τ) / (exp(sim(z, z_glob)/τ) + exp(sim(z, z_prev)/τ)) )``,
    ``sim`` the cosine similarity, ``z``, ``z_glob``, ``z_prev`` the representations of ``x`` by the
    local model, the received global model ``w^t`` and the client's previous local model
    ``w_i^{t−1}``. Server: FedAvg (weighted by sample counts). The representation is the input of
    the model's last linear layer (the paper adds a projection head, which the package's models
    lack; PFLlib and FL-bench take the same representation as here); the frozen models run in
    evaluation mode.
    """

    name = "moon"
    strategy = "MOON"
    aggregate_only = True
    reads_head = True
    client = MoonClient
    without_client_algorithm = "runs as FedAvg: no contrastive loss"

    mu: float = param(1.0, key="moon-mu", must=NON_NEGATIVE, doc="weight μ of the model-contrastive loss")
    tau: float = param(0.5, key="moon-tau", must=POSITIVE, doc="temperature τ of the model-contrastive loss")

    def train_config(self, num_participants: int) -> Settings:
        return {MU: self.mu, TAU: self.tau}
