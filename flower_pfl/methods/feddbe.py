"""FedDBE (Zhang et al. 2023): FedAvg with a domain bias eliminator in representation space."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from flower_pfl.engine.client_algorithm import Batch, ClientAlgorithm, ClientState, LossFn, TrainData, keep, setting, stored
from flower_pfl.engine.evaluation import Personalization
from flower_pfl.engine.feature_stats import representation_size
from flower_pfl.engine.functional import Functional, State, sgd
from flower_pfl.engine.layout import ParamLayout
from flower_pfl.engine.model_facts import ModelFacts
from flower_pfl.engine.model_split import head_module
from flower_pfl.engine.params import NON_NEGATIVE, Rule, param
from flower_pfl.engine.reply_checks import Reply, norm, received_vector
from flower_pfl.engine.server_algorithm import GlobalModelAlgorithm, Settings, weighted_mean
from flower_pfl.engine.wire import decode_flat, encode_vector
from flower_pfl.methods.base import Method, one_layer_refusal

#: config keys: MR's weight κ, the running mean's momentum, and the consensus mean z̄^g (bytes; absent until known)
KAPPA, MOMENTUM, CONSENSUS = "feddbe-kappa", "feddbe-momentum", "feddbe-consensus"
#: reply key: the client's running mean ``z̄_i^g`` of its round's minibatch representations (float32 bytes)
RUNNING_MEAN = "feddbe-running-mean"
#: client-state key: the client's PRBM vector z̄_i^p
PRBM = "feddbe-prbm"


def forward_shifted(model: nn.Module, x: torch.Tensor, shift: torch.Tensor | None,
                    run: Callable[[torch.Tensor], torch.Tensor] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(head(z + shift), z)``: the model's logits with ``shift`` added to its representation ``z`` (the
    input of its last ``nn.Linear``) and ``z`` itself, both with their gradients (``shift`` ``None``: the plain
    model). ``run`` calls the model (default ``model(x)``; a ``Functional``'s call on a state)."""
    captured: list[torch.Tensor] = []

    def pre_hook(_module: nn.Module, inputs: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        captured.append(inputs[0])
        return inputs if shift is None else (inputs[0] + shift, *inputs[1:])

    handle = head_module(model).register_forward_pre_hook(pre_hook)
    try:
        logits = model(x) if run is None else run(x)
    finally:
        handle.remove()
    return logits, captured[0].flatten(1)


def mean_regularization(running: torch.Tensor, consensus: torch.Tensor, kappa: float) -> torch.Tensor:
    """MR: ``κ · mean_k ½ (z̄_i,k^g − z̄_k^g)²`` over the ``d`` features (the authors' code)."""
    return kappa * (0.5 * (running - consensus) ** 2).mean()


class Shifted(Personalization):
    """The model with its client's PRBM vector added to its representation: ``head(f(x) + z̄_i^p)``."""

    shift: torch.Tensor

    def __init__(self, model: nn.Module, shift: torch.Tensor) -> None:
        super().__init__()
        self.model = model
        self.register_buffer("shift", shift)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return forward_shifted(self.model, x, self.shift)[0]


def prbm_vector(model: nn.Module, state: ClientState | None) -> torch.Tensor:
    """The client's PRBM vector: the one kept in ``state``, else zeros (the size of the model's representation)."""
    head = head_module(model)
    known = stored(state, PRBM)
    if known is None:
        return torch.zeros(head.in_features, device=head.weight.device, dtype=head.weight.dtype)
    return known[0].to(device=head.weight.device, dtype=head.weight.dtype).clone()


class FedDBEClient(ClientAlgorithm):
    """FedDBE's client. Every step updates ``z̄_i^g ← (1 − m) z̄_i^g + m mean_n f(x_n)``, the running mean
    of the round's minibatch representations (from 0, earlier steps' held fixed). Before the consensus
    exists (the first round): plain SGD, and the reply carries ``z̄_i^g`` (``feddbe-running-mean``). Then,
    per minibatch, one SGD step of the model and of the PRBM vector ``z̄_i^p`` on ``CE(head(f(x) + z̄_i^p),
    y) + κ mean_k ½ (z̄_i,k^g − z̄_k^g)²`` and a reply with the model alone. Keeps ``z̄_i^p`` in the
    client state and evaluates ``head(f(x) + z̄_i^p)``."""

    name = "feddbe"
    needs_state = keeps_state = True
    hookable = False
    reply_keys = (RUNNING_MEAN,)
    carried = ("prbm", "running")
    batched_state = ("consensus",)

    def __init__(self, model: nn.Module, config: Mapping[str, Any], state: ClientState | None = None,
                 loss_fn: LossFn = F.cross_entropy) -> None:
        super().__init__(model, config, state, loss_fn)
        self.kappa, self.momentum = float(setting(config, KAPPA, "FedDBE")), float(setting(config, MOMENTUM, "FedDBE"))
        if not self.kappa >= 0:
            raise ValueError(f"FedDBE's kappa must be >= 0, got {self.kappa}")
        if not 0 < self.momentum <= 1:
            raise ValueError(f"FedDBE's momentum must lie in (0, 1], got {self.momentum}")
        self.prbm = prbm_vector(model, state)
        head = head_module(model)
        #: whether the server sent its consensus (the rounds after the first): PRBM and MR train
        self.regularized = CONSENSUS in config
        self.consensus = (decode_flat(config[CONSENSUS], head.in_features, CONSENSUS).to(self.prbm)
                          if self.regularized else torch.zeros_like(self.prbm))
        self.running = torch.zeros_like(self.prbm)

    def step(self, f: Functional, state: State, batches: Sequence[Batch], lr: float) -> tuple[State, torch.Tensor]:
        """The running mean's update and one SGD step: of the model on CE (the first round), or of the model
        and the PRBM vector on CE + MR (later rounds). The loss it reports is the CE."""
        (x, y), = batches

        def loss_of(w: State, *prbm: torch.Tensor) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
            logits, z = forward_shifted(f.model, x, prbm[0] if prbm else None, lambda inputs: f(w, inputs))
            running = (1 - self.momentum) * self.running + self.momentum * z.mean(0)
            loss = self.loss(logits, y)
            total = loss + mean_regularization(running, self.consensus, self.kappa) if prbm else loss
            return total, (loss, running)

        prbm = (self.prbm,) if self.regularized else ()  # the first round: no PRBM, no MR
        grads, prbm_grad, _, state, (loss, self.running) = f.grad(loss_of, state, *prbm, has_aux=True)
        if self.regularized:
            self.prbm = self.prbm - lr * prbm_grad[0]
        return f.with_params(state, sgd(f.params(state), grads, lr)), loss

    def end_round(self, model: nn.Module, inputs: Any = None) -> dict[str, bytes]:
        keep(self.state, PRBM, [self.prbm])
        if self.regularized:  # the server has its consensus and asks for nothing more
            return {}
        return {RUNNING_MEAN: encode_vector(self.running)}

    @classmethod
    def evaluation_model(cls, model: nn.Module, config: Mapping[str, Any], state: ClientState | None, train: TrainData,
                         test: Callable[[nn.Module], Any]) -> tuple[nn.Module, dict[str, float]]:
        """The received model with the client's PRBM vector (zeros before it first trains)."""
        return Shifted(model, prbm_vector(model, state)), {}


@dataclass
class FedDBE(Method, GlobalModelAlgorithm):
    """FedDBE (Zhang et al. 2023): FedAvg whose clients add a personal bias vector to the representation
    (PRBM) and pull their mean representation toward a consensus mean (MR).

    Domain Bias Eliminator on FedAvg: the representation ``z_i = f(x)`` (the input of the model's last
    linear layer) is fed to the head as ``z_i^g + z̄_i^p``, ``z̄_i^p`` the client's Personalized
    Representation Bias Memory, a trainable vector trained with the model (same learning rate), kept on
    the client and never sent. Mean Regularization adds ``κ · mean_k ½ (z̄_i,k^g − z̄_k^g)²`` to the
    client's loss, ``z̄_i^g`` the client's mean representation (a running mean over the round's minibatches
    with momentum ``m``, reset each round) and ``z̄^g`` the consensus. The consensus is computed once:
    the first round's participants train plain FedAvg (no PRBM, no MR) and send their running means
    ``z̄_i^g`` of that round (only then: later replies carry the model alone); ``z̄^g`` is their mean
    weighted by sample counts, fixed from then on, as in the authors' code: the same quantity MR compares
    it with, on the same scale. Server: FedAvg of the whole model (weighted by samples). Clients evaluate
    ``head(f(x) + z̄_i^p)``.

    Defaults: κ = 50, the authors' run script's (PFLlib's default, 0, turns MR off); ``m = 0.1``,
    PFLlib's default (the authors' run script sets ``m = 1``, each minibatch's mean; the reference
    check's ``feddbe-mo1`` row). MR as the authors' code writes it (with the ½).
    The authors' code and PFLlib compute the consensus in an initialisation period before round 1 in
    which every client trains (its models are discarded); here the first round's participants give it,
    and that round's models are aggregated.
    """

    name = "feddbe"
    strategy = "FedDBE"
    reads_head = True
    client = FedDBEClient
    default_clients_per_round = 10
    state_attributes = ("consensus", "consensus_known")
    without_client_algorithm = "cannot run: every first-round reply lacks the running mean that makes the consensus"

    kappa: float = param(50.0, key="feddbe-kappa", must=NON_NEGATIVE,
                         doc="κ: weight of the mean regularization (the authors' run script: 50)")
    momentum: float = param(0.1, key="feddbe-momentum", must=Rule(lambda v: 0 < v <= 1, "a number in (0, 1]"),
                            doc="momentum m of the running mean of the minibatches' representations (PFLlib's 0.1; 1: each minibatch's mean)")

    def setup(self, layout: ParamLayout, initial: torch.Tensor, device: torch.device, seed: int = 0) -> None:
        super().setup(layout, initial, device, seed)
        self.classes, self.dim = representation_size(layout, "FedDBE")
        self.consensus, self.consensus_known = torch.zeros(self.dim), torch.tensor(False)

    @classmethod
    def check_model(cls, facts: ModelFacts) -> str | None:
        return super().check_model(facts) or one_layer_refusal(facts, "a model with a representation before its last layer",
                                 "its representation would be the input itself")

    def train_config(self, num_participants: int) -> Settings:
        consensus = {CONSENSUS: encode_vector(self.consensus)} if bool(self.consensus_known) else {}
        return {KAPPA: self.kappa, MOMENTUM: self.momentum, **consensus}

    def check_extras(self, extras: Mapping[str, Any]) -> torch.Tensor | None:
        """The running mean ``z̄_i^g`` (finite, of the representation's size) while the consensus is
        unknown; nothing once it is (it was not asked for)."""
        if bool(self.consensus_known):
            return None
        return received_vector(extras, RUNNING_MEAN, self.dim, "its running mean representation", FedDBEClient.__name__)

    def example_extras(self, generator: torch.Generator) -> dict[str, bytes]:
        return {RUNNING_MEAN: encode_vector(torch.rand(self.dim, generator=generator))}

    def update_norms(self, reply: Reply, sent: torch.Tensor) -> dict[str, tuple[float, float]]:
        """The model's change, and the client's running mean (when sent) against the round's median."""
        running = {} if reply.extras is None else {RUNNING_MEAN: (norm(reply.extras), 0.0)}
        return {**super().update_norms(reply, sent), **running}

    def aggregate(self, server_round: int, replies: Sequence[Reply]) -> None:
        """FedAvg; in the first round with replies, the consensus ``z̄^g = Σ_i n_i z̄_i^g / Σ_i n_i``."""
        super().aggregate(server_round, replies)
        if not bool(self.consensus_known):
            self.consensus = weighted_mean(torch.stack([r.extras.float().cpu() for r in replies]), [r.num_examples for r in replies])
            self.consensus_known = torch.tensor(True)
