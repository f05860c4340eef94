"""FedPHP (Li et al., ECML-PKDD 2021): FedAvg whose clients keep an inherited private model (HPM), a
moving average of their trained local models that supervises the next local training and is evaluated."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from flower_pfl.engine.client_algorithm import Batch, ClientAlgorithm, ClientState, LossFn, keep, setting, stored
from flower_pfl.engine.functional import Functional, State, sgd
from flower_pfl.engine.layout import flatten_module
from flower_pfl.engine.mmd import squared_mmd, widths_around_mean_distance
from flower_pfl.engine.params import AT_LEAST_ONE, UNIT_INTERVAL, param
from flower_pfl.engine.server_algorithm import GlobalModelAlgorithm, Settings
from flower_pfl.methods.base import Method

#: config keys: the largest inheritance μ, the transfer weight λ and the participations μ ramps over
MU, LAMBDA, RAMP = "fedphp-mu", "fedphp-lambda", "fedphp-ramp"
#: client-state keys: the HPM (flat) and how often the client has trained (one value)
HPM_STATE, COUNT_STATE = "fedphp-hpm", "fedphp-participations"
#: the official code's MMD kernels: ``KERNELS`` Gaussian bandwidths, ``KERNEL_MUL`` apart, around the mean distance
KERNELS, KERNEL_MUL = 5, 2.0


def transfer_mmd(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The transfer term: the squared MMD of the local and the HPM's features with the official code's
    ``KERNELS`` Gaussian kernels, ``KERNEL_MUL`` apart around the batch's mean squared distance."""
    return squared_mmd(x, y, widths_around_mean_distance(x, y, KERNELS, KERNEL_MUL))


def inheritance(mu: float, participations: int, ramp: int) -> float:
    """``μ_k = μ · min(c_k / R, 1)``: how much of its HPM a client keeps, ``c_k`` its earlier participations
    and ``R`` the participations over which the weight grows to ``μ`` (0 at its first participation)."""
    return mu * min(participations / ramp, 1.0)


def inherit(hpm: torch.Tensor, local: torch.Tensor, mu: float) -> torch.Tensor:
    """The new HPM: ``μ · HPM + (1 − μ) · w``, ``w`` the trained local model."""
    return mu * hpm + (1 - mu) * local


class FedPHPClient(ClientAlgorithm):
    """FedPHP's client: local SGD on ``(1 − λ) CE + λ MMD(h(x; w), h(x; HPM))`` from the received global
    model (``h``: the representation, the head's input; the HPM's is a constant, computed in evaluation
    mode as the authors' code does, so that its batch-norm statistics stay the moving average's), then
    the HPM inherits the trained model. The HPM and the participation count live in the client state;
    before the first participation the HPM is the received model. The client evaluates its HPM."""

    name = "fedphp"
    needs_state = keeps_state = True
    hookable = False
    evaluated_state = HPM_STATE
    batched_state = ("hpm",)

    def __init__(self, model: nn.Module, config: Mapping[str, Any], state: ClientState | None = None,
                 loss_fn: LossFn = F.cross_entropy) -> None:
        super().__init__(model, config, state, loss_fn)
        self.mu, self.lam = float(setting(config, MU, "FedPHP")), float(setting(config, LAMBDA, "FedPHP"))
        self.ramp = int(setting(config, RAMP, "FedPHP"))
        if not (0 <= self.mu <= 1 and 0 <= self.lam <= 1 and self.ramp >= 1):
            raise ValueError(f"FedPHP needs 0 <= {MU} <= 1, 0 <= {LAMBDA} <= 1 and {RAMP} >= 1, got {self.mu}, {self.lam}, {self.ramp}")
        self.hpm = Functional(model).kept(state, HPM_STATE)  # the HPM's state

    def step(self, f: Functional, state: State, batches: Sequence[Batch], lr: float) -> tuple[State, torch.Tensor]:
        """One SGD step on ``(1 − λ) CE + λ MMD(h(x; w), h(x; HPM))``; the loss it reports is the CE."""
        (x, y), = batches
        if self.lam > 0:
            with f.evaluating():  # the HPM teaches with its own running statistics, and leaves them as they are
                teacher = f.with_features(self.hpm, x)[1]

        def loss_of(w: State) -> tuple[torch.Tensor, torch.Tensor]:
            logits, features = f.with_features(w, x)
            ce = self.loss(logits, y)
            loss = (1 - self.lam) * ce
            if self.lam > 0:
                loss = loss + self.lam * transfer_mmd(features, teacher)
            return loss, ce

        grads, _, _, state, ce = f.grad(loss_of, state, has_aux=True)
        return f.with_params(state, sgd(f.params(state), grads, lr)), ce

    def end_round(self, model: nn.Module, inputs: Any = None) -> dict[str, bytes]:
        count = stored(self.state, COUNT_STATE)
        participations = 0 if count is None else int(count[0].item())
        mu = inheritance(self.mu, participations, self.ramp)
        keep(self.state, HPM_STATE, [inherit(Functional(model).flat(self.hpm), flatten_module(model), mu)])
        keep(self.state, COUNT_STATE, [torch.tensor([participations + 1])])
        return {}


@dataclass
class FedPHP(Method, GlobalModelAlgorithm):
    """FedPHP (Li et al. 2021): FedAvg, and on every client an inherited private model (HPM), a moving
    average of its trained local models that guides local training by MMD and is the model it evaluates.

    Client ``k`` starts from the global model ``w`` and takes SGD steps on
    ``(1 − λ) CE(f(x; w), y) + λ MMD²(h(x; w), h(x; w̄_k))``, ``h`` the representation (the head's input)
    and ``w̄_k`` its HPM, a fixed teacher; it then inherits the trained ``w_k``:
    ``w̄_k ← μ_k w̄_k + (1 − μ_k) w_k`` with ``μ_k = μ · min(c_k / R, 1)``, ``c_k`` its earlier
    participations (0 the first time: the HPM becomes its local model) and ``R`` the participations over
    which the inheritance grows to ``μ``. Server: FedAvg of the local models. Clients evaluate their HPM
    (one that never trained: the global model). λ = 0 trains as FedAvg.

    As the authors' code (FedRepo ``fedphp.py``): ``μ = 0.9``, ``μ_k = 0.9 · c_k / ⌊Q T⌋`` capped at 0.9
    (``R = ⌊Q T⌋`` the expected participations of a client, Q the sampled fraction and T the rounds: 20
    in the package's Synthetic benchmark), MMD over the representations with five Gaussian kernels around
    the batch's mean squared distance; λ = 0.1 is the default of FLGo's port of that code (the authors'
    code reads it from its command line).
    Differences: before its first participation the HPM is the model the client receives (the authors'
    code and PFLlib start it from the initial model, the same in round 1); no gradient clipping.
    PFLlib's ``clientphp`` grows μ with the round, ``μ · t / T``, uses four fixed bandwidths
    (10, 15, 20, 50), and evaluates the local model, not the HPM.
    """

    name = "fedphp"
    strategy = "FedPHP"
    aggregate_only = True
    reads_head = True
    client = FedPHPClient
    group = "baseline"
    default_clients_per_round = 10
    without_client_algorithm = "runs as FedAvg: no HPM is kept, transferred or evaluated"

    mu: float = param(0.9, key="fedphp-mu", must=UNIT_INTERVAL, doc="μ: largest weight of the HPM in its moving average")
    lam: float = param(0.1, key="fedphp-lambda", must=UNIT_INTERVAL,
                       doc="λ: weight of the MMD transfer from the HPM (1 − λ: of the cross-entropy)")
    ramp: int = param(20, key="fedphp-ramp", must=AT_LEAST_ONE,
                      doc="R: participations over which μ_k grows from 0 to μ (the authors' ⌊Q·T⌋; 20 = 0.2 · 100 rounds)")

    def train_config(self, num_participants: int) -> Settings:
        return {MU: self.mu, LAMBDA: self.lam, RAMP: self.ramp}
