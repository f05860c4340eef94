"""FedRoD (Chen & Chao 2022): a generic model trained with a balanced loss, and a personal head on top."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

from flower_pfl.engine.client_algorithm import Batch, ClientAlgorithm, ClientState, LossFn, TrainData, keep, stored
from flower_pfl.engine.client_metrics import GLOBAL_ACCURACY
from flower_pfl.engine.evaluation import Personalization
from flower_pfl.engine.functional import Functional, State, gradients, sgd
from flower_pfl.engine.model_split import forward_with_features, head_module
from flower_pfl.engine.params import Rule, param
from flower_pfl.engine.server_algorithm import GlobalModelAlgorithm, Settings
from flower_pfl.methods.base import Method

#: config key: train the generic model with the balanced softmax
BALANCED = "fedrod-balanced"
#: client-state key of the personal head (weight, bias)
PERSONAL_HEAD = "fedrod-personal-head"


def balanced_softmax_loss(logits: torch.Tensor, y: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """Balanced softmax (Ren et al. 2020): cross-entropy of ``logits + log n_c``, ``n_c`` the client's
    count of class c. A class the client has not seen (``n_c = 0``) leaves the softmax."""
    return F.cross_entropy(logits + counts.to(logits.dtype).log(), y)


def personal_head(model: nn.Module, state: ClientState | None) -> nn.Linear:
    """The client's personal head: the one kept in ``state``, else zeros (the personalized model
    then predicts as the generic one), shaped and placed as the model's last ``nn.Linear``."""
    generic = head_module(model)
    head = nn.Linear(generic.in_features, generic.out_features, bias=generic.bias is not None)
    head.to(device=generic.weight.device, dtype=generic.weight.dtype)
    known = stored(state, PERSONAL_HEAD)
    with torch.no_grad():
        for p, value in zip(head.parameters(), known or [torch.zeros_like(p) for p in head.parameters()]):
            p.copy_(value.to(p.device).view_as(p))
    return head


class Personalized(Personalization):
    """FedRoD's personalized predictor: the generic model's logits plus the personal head's on the
    same representation (the input of the model's last ``nn.Linear``)."""

    def __init__(self, generic: nn.Module, head: nn.Linear) -> None:
        super().__init__()
        self.generic, self.head = generic, head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits, features = forward_with_features(self.generic, x)
        return logits + self.head(features)


class FedRoDClient(ClientAlgorithm):
    """FedRoD's client, per minibatch: one SGD step of the generic model (body and generic head) on the
    balanced softmax (with the class counts of the client's training split, ``begin``) or cross-entropy,
    and one of the personal head on the cross-entropy of ``generic logits + personal logits``, both
    logits from the same forward pass and the personal loss reaching neither the body nor the generic
    head. Keeps the personal head in the client state; evaluates the personalized predictor and
    reports the generic model's accuracy as ``global-accuracy``."""

    name = "fedrod"
    needs_state = keeps_state = True
    hookable = False
    carried = ("head",)
    batched_state = ("counts",)

    def __init__(self, model: nn.Module, config: Mapping[str, Any], state: ClientState | None = None,
                 loss_fn: LossFn = F.cross_entropy) -> None:
        super().__init__(model, config, state, loss_fn)
        self.balanced = bool(config.get(BALANCED, True))
        self.linear = personal_head(model, state)  # the personal head's module; its tensors are ``head``
        self.head = [p.detach().clone() for p in self.linear.parameters()]
        self.counts = torch.ones(head_module(model).out_features, dtype=torch.int64)  # until ``begin`` gives the split's

    def begin(self, model: nn.Module, data: TrainData) -> TrainData:
        self.counts = torch.bincount(data.y, minlength=len(self.counts)).to(data.y.device)
        return data

    def step(self, f: Functional, state: State, batches: Sequence[Batch], lr: float) -> tuple[State, torch.Tensor]:
        """The generic model's SGD step and the personal head's, on the logits and representation of one
        forward pass (held fixed in the personal loss)."""
        (x, y), = batches

        def generic_loss(w: State) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
            logits, features = f.with_features(w, x)
            loss = balanced_softmax_loss(logits, y, self.counts) if self.balanced else self.loss_fn(logits, y)
            return loss, (logits, features)

        grads, _, loss, state, (logits, features) = f.grad(generic_loss, state, has_aux=True)
        names = [name for name, _ in self.linear.named_parameters()]

        def personal_loss(head: State) -> tuple[torch.Tensor, tuple[()]]:
            return self.loss_fn(logits + functional_call(self.linear, dict(zip(names, head)), (features,)), y), ()

        self.head = sgd(self.head, gradients(personal_loss, self.head)[0][0], lr)
        return f.with_params(state, sgd(f.params(state), grads, lr)), loss

    def end_round(self, model: nn.Module, inputs: Any = None) -> dict[str, bytes]:
        keep(self.state, PERSONAL_HEAD, self.head)
        return {}

    @classmethod
    def evaluation_model(cls, model: nn.Module, config: Mapping[str, Any], state: ClientState | None, train: TrainData,
                         test: Callable[[nn.Module], Any]) -> tuple[nn.Module, dict[str, float]]:
        return Personalized(model, personal_head(model, state)), {GLOBAL_ACCURACY: test(model).accuracy}


@dataclass
class FedRoD(Method, GlobalModelAlgorithm):
    """FedRoD (Chen & Chao 2022): a generic model (body and generic head) trained by FedAvg on a
    class-balanced loss, and on every client a personal head whose logits add to the generic ones.

    Generic predictor (the balanced risk): clients minimise the balanced softmax
    ``−log(n_y e^{g_y} / Σ_c n_c e^{g_c})`` of the generic logits g, n_c the client's class counts;
    the server averages the models weighted by samples (FedAvg). Personalized predictor: ``g(z) + p_i(z)``
    on the same representation z, the personal head p_i trained on the client's cross-entropy with
    z and g held fixed (a lightweight module on top of the generic predictor), kept in the client
    state, zero before the client first trains (PFLlib and FL-bench start it as a copy of the
    generic head; FL-bench also predicts with p_i alone and lets its loss train the body). The
    counts n_c are those of the client's training split, as in the paper.
    """

    name = "fedrod"
    strategy = "FedRoD"
    aggregate_only = True
    reads_head = True
    client = FedRoDClient
    group = "baseline"
    default_clients_per_round = 10
    without_client_algorithm = "runs as FedAvg: no balanced loss and no personal head; clients evaluate the global model"

    balanced: bool = param(True, key="fedrod-balanced", must=Rule(lambda v: isinstance(v, bool), "true or false"),
                           doc="train the generic model with the balanced softmax (false: plain cross-entropy)")

    def train_config(self, num_participants: int) -> Settings:
        return {BALANCED: self.balanced}
