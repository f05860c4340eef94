"""FedALA (Zhang et al. 2023): adaptive local aggregation of the global model into the local one."""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

from flower_pfl.engine.client_algorithm import (
    BATCH_SIZE,
    SERVER_ROUND,
    Batch,
    ClientAlgorithm,
    ClientState,
    LossFn,
    TrainData,
    keep,
    load_stored,
    setting,
    stored,
)
from flower_pfl.engine.layout import ParamLayout, flatten_module
from flower_pfl.engine.params import AT_LEAST_ONE, PERCENT, POSITIVE, param
from flower_pfl.engine.server_algorithm import GlobalModelAlgorithm, Settings
from flower_pfl.methods.base import Method

#: config keys: the higher layers p, the weights' step η, the share s (in %) of the local data the
#: weights are learned on, the seed of its sample (the run's)
LAYERS, ETA, RAND_PERCENT, SEED = "fedala-layers", "fedala-eta", "fedala-rand-percent", "fedala-seed"
#: client-state keys: the local model θ_i (flat), the weights W_i (flat, higher layers)
LOCAL_STATE, WEIGHTS_STATE = "fedala-local", "fedala-weights"
#: the first weight learning runs until the std of the last ``CONVERGED_WINDOW`` epoch losses is under
#: ``CONVERGED_STD`` (the authors' code), at most ``MAX_START_EPOCHS`` epochs
CONVERGED_WINDOW, CONVERGED_STD, MAX_START_EPOCHS = 10, 0.1, 100


def higher_layers(model: nn.Module, layers: int) -> list[str]:
    """The trainable parameters of the model's last ``layers`` modules (all of them if it has fewer)."""
    names = [name for name, p in model.named_parameters() if p.requires_grad]
    modules = list(dict.fromkeys(name.rpartition(".")[0] for name in names))
    return [name for name in names if name.rpartition(".")[0] in modules[-layers:]]


def ala_init(local: Mapping[str, torch.Tensor], global_: Mapping[str, torch.Tensor],
             weights: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``θ_i + (Θ − θ_i) ⊙ W_i`` for the tensors ``weights`` names."""
    return {n: local[n] + (global_[n] - local[n]) * w for n, w in weights.items()}


def learn_weights(model: nn.Module, local: Mapping[str, torch.Tensor], global_: Mapping[str, torch.Tensor],
                  weights: dict[str, torch.Tensor], batches: Sequence[Batch], eta: float, loss_fn: LossFn,
                  until_converged: bool) -> dict[str, torch.Tensor]:
    """ALA's weight learning (Algorithm 1, ALA's lines): per batch,
    ``W ← clip(W − η ∇_θ̂ L(θ̂) ⊙ (Θ − θ_i), 0, 1)`` with ``θ̂`` from ``ala_init``; one epoch over
    ``batches``, or epochs until the loss settles (a client's first weight learning). ``model``
    holds the lower layers (the global ones) and is not changed."""
    scratch = copy.deepcopy(model)
    losses: list[float] = []
    while True:
        for x, y in batches:
            mixed = {n: t.detach().requires_grad_(True) for n, t in ala_init(local, global_, weights).items()}
            loss = loss_fn(functional_call(scratch, mixed, (x,)), y)
            grads = torch.autograd.grad(loss, list(mixed.values()))
            weights = {n: (w - eta * g * (global_[n] - local[n])).clamp(0, 1) for (n, w), g in zip(weights.items(), grads)}
        losses.append(float(loss.detach()))
        if not until_converged or len(losses) >= MAX_START_EPOCHS or (
                len(losses) > CONVERGED_WINDOW and float(np.std(losses[-CONVERGED_WINDOW:])) < CONVERGED_STD):
            return weights


def sample_indices(n: int, percent: float, seed: int, server_round: int) -> torch.Tensor:
    """``round(percent / 100 · n)`` (at least 1) of ``n`` examples, drawn without replacement by a
    permutation seeded by ``seed``, ``server_round`` and ``n`` (another sample every round)."""
    state = np.random.SeedSequence([seed, server_round, n]).generate_state(1)[0]
    count = min(n, max(1, round(percent / 100 * n)))
    return torch.randperm(n, generator=torch.Generator().manual_seed(int(state)))[:count]


class FedALAClient(ClientAlgorithm):
    """FedALA's client (Algorithm 1): from its second round on, in ``begin`` (before the round's steps),
    the received global model ``Θ`` and the client's local model ``θ_i`` (kept in its state) make
    ``θ̂_i``: the global lower layers, and ``θ_i + (Θ − θ_i) ⊙ W_i`` in the top ``p`` layers, with
    ``W_i`` (ones at first, kept in the state) learned on a random ``s``% of its training split
    (``sample_indices``: seeded by ``fedala-seed`` and the round, in minibatches of ``batch-size``).
    Then local SGD on the whole split; the trained model is the reply and the new ``θ_i``, which the
    client evaluates. Not a hook on a user's loop: the aggregation needs ``begin``."""

    name = "fedala"
    evaluated_state = LOCAL_STATE  # the local model of the client's last round
    keeps_state = needs_state = True
    hookable = False

    def __init__(self, model: nn.Module, config: Mapping[str, Any], state: ClientState | None = None,
                 loss_fn: LossFn = F.cross_entropy) -> None:
        super().__init__(model, config, state, loss_fn)
        self.layers, self.eta = int(config[LAYERS]), float(setting(config, ETA, "FedALA"))
        self.percent = float(setting(config, RAND_PERCENT, "FedALA"))
        if self.layers < 1 or not self.eta > 0 or not 0 < self.percent <= 100:
            raise ValueError(f"FedALA needs {LAYERS} >= 1, {ETA} > 0 and 0 < {RAND_PERCENT} <= 100")
        self.names = higher_layers(model, self.layers)
        self.weights: dict[str, torch.Tensor] | None = None

    def sample(self, data: TrainData) -> list[Batch]:
        """The round's ``s``% of ``data`` (``sample_indices``), in minibatches of ``batch-size``."""
        batch = int(setting(self.config, BATCH_SIZE, "FedALA"))
        idx = sample_indices(len(data.y), self.percent, int(self.config.get(SEED, 0)),
                             int(self.config.get(SERVER_ROUND, 0))).to(data.y.device)
        return [(data.x[i], data.y[i]) for i in idx.split(batch)]

    def begin(self, model: nn.Module, data: TrainData) -> TrainData:
        """Load ``θ̂_i`` into ``model`` (which holds ``Θ``) and keep the learned ``W_i``; train on all of ``data``."""
        local_model = copy.deepcopy(model)
        if not load_stored(local_model, self.state, LOCAL_STATE):
            return data  # the first round: the global model as it is
        received, local = dict(model.named_parameters()), dict(local_model.named_parameters())
        global_ = {n: received[n].detach() for n in self.names}
        local_ = {n: local[n].detach() for n in self.names}
        kept = stored(self.state, WEIGHTS_STATE)
        weights = dict(zip(self.names, kept[0].to(global_[self.names[0]]).split([global_[n].numel() for n in self.names])))  \
            if kept is not None else {n: torch.ones_like(t) for n, t in global_.items()}
        weights = {n: w.view_as(global_[n]) for n, w in weights.items()}
        self.weights = learn_weights(model, local_, global_, weights, self.sample(data), self.eta, self.loss_fn, kept is None)
        with torch.no_grad():
            for n, t in ala_init(local_, global_, self.weights).items():
                received[n].copy_(t)
        return data

    def end_round(self, model: nn.Module, inputs: Any = None) -> dict[str, bytes]:
        keep(self.state, LOCAL_STATE, [flatten_module(model)])
        if self.weights is not None:
            keep(self.state, WEIGHTS_STATE, [torch.cat([self.weights[n].flatten() for n in self.names])])
        return {}


@dataclass
class FedALA(Method, GlobalModelAlgorithm):
    """FedALA (Zhang et al. 2023): FedAvg, with each client initializing its local model by an
    element-wise, learned aggregation of the global model into its previous local model.

    Server: FedAvg of the trained local models. Client ``i`` (Algorithm 1; ALA is its lines 6-16):
    ``θ̂_i = θ_i + (Θ − θ_i) ⊙ W_i``, where ``W_i`` is 1 on the lower layers and learned on
    the top ``p`` layers by ``W_i ← clip(W_i − η ∇_θ̂ L_i(θ̂_i) ⊙ (Θ − θ_i), 0, 1)`` over
    a random ``s``% of its training split, drawn anew every round (seeded by the run's seed and the
    round): until the loss settles the first time, one epoch later; then local SGD from ``θ̂_i``.
    Clients evaluate their local model. PFLlib evaluates after ALA and runs ALA for every client
    every round (Algorithm 1 only for the sampled ones); FL-bench keeps ``θ_i`` and ``W_i`` on its
    worker, shared by all the clients the worker trains in turn.
    """

    name = "fedala"
    strategy = "FedALA"
    aggregate_only = True
    client = FedALAClient
    default_clients_per_round = 10
    without_client_algorithm = "runs as FedAvg: clients train the global model without adaptive local aggregation"

    eta: float = param(1.0, key="fedala-eta", must=POSITIVE, doc="η: step of the aggregation weights W_i")
    rand_percent: float = param(80.0, key="fedala-rand-percent", must=PERCENT,
                                doc="s: percent of a client's training data the weights are learned on")
    layers: int = param(1, key="fedala-layers", must=AT_LEAST_ONE,
                        doc="p: top layers (modules) whose aggregation is learned; the lower ones take the global model")

    def setup(self, layout: ParamLayout, initial: torch.Tensor, device: torch.device, seed: int = 0) -> None:
        super().setup(layout, initial, device, seed)
        self.seed = seed

    def train_config(self, num_participants: int) -> Settings:
        return {LAYERS: self.layers, ETA: self.eta, RAND_PERCENT: self.rand_percent, SEED: self.seed}
