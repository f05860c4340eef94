"""FedFomo (Zhang et al. 2021): personalized first-order model optimization."""

from __future__ import annotations

import copy
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from flower_pfl.engine.client_algorithm import Batch, ClientAlgorithm, ClientState, LossFn, TrainData, setting
from flower_pfl.engine.layout import ParamLayout, flatten_module, load_flat_
from flower_pfl.engine.params import AT_LEAST_ONE, NON_NEGATIVE, UNIT_INTERVAL, Rule, param
from flower_pfl.engine.reply_checks import Reply, norm, received_vector
from flower_pfl.engine.server_algorithm import ClientId, Instruction, PersonalizedAlgorithm
from flower_pfl.engine.wire import decode_flat, encode_vector
from flower_pfl.methods.base import Method

#: config keys: how many weights the reply holds (M), the other clients' models (float32 bytes, up to M
#: rows), the share of a client's training split held out for validation, and the seed of that split (the run's)
SLOTS, DOWNLOADS, VAL_FRACTION, VAL_SEED = "fedfomo-m", "fedfomo-downloads", "fedfomo-val-fraction", "fedfomo-val-seed"
#: reply key: the first-order weight w_n of every model received (float32 bytes, M values, zero-padded)
WEIGHTS = "fedfomo-weights"
OPEN_UNIT = Rule(lambda v: 0 < v < 1, "a number in (0, 1)")


def first_order_weights(own_loss: float, losses: torch.Tensor, own: torch.Tensor, others: torch.Tensor) -> torch.Tensor:
    """``w_n = (L(θ_i) − L(θ_n)) / ||θ_n − θ_i||`` for the ``(m, d)`` models ``others``;
    0 for a model equal to the client's own (the quotient is then undefined)."""
    distances = torch.linalg.vector_norm((others - own).double(), dim=1)
    gains = own_loss - losses.double()
    return torch.where(distances > 0, gains / distances.clamp_min(1e-300), torch.zeros_like(gains)).float()


def fomo_update(own: torch.Tensor, others: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """``θ_i + Σ_n (max(w_n, 0) / Σ_k max(w_k, 0)) (θ_n − θ_i)``; ``θ_i`` when no weight is positive."""
    positive = weights.clamp_min(0).to(own.dtype)
    total = positive.sum()
    if len(weights) == 0 or total <= 0:
        return own.clone()
    return own + (positive / total) @ (others - own)


@torch.no_grad()
def mean_loss(model: nn.Module, vector: torch.Tensor, batches: Sequence[Batch], loss_fn: LossFn) -> float:
    """The sample-weighted mean loss of the flat model ``vector`` over ``batches`` (``model`` is a scratch copy)."""
    load_flat_(model, vector)
    model.eval()
    total = sum(float(loss_fn(model(x), y)) * len(y) for x, y in batches)
    return total / max(1, sum(len(y) for _, y in batches))


def validation_split(n: int, fraction: float, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(validation, training)`` indices of a split of ``n`` examples: the first
    ``max(1, round(fraction · n))`` (at most ``n − 1``) of a permutation seeded by ``seed`` and ``n``,
    and the rest, each in ascending order. The same for the same ``n``, ``fraction`` and ``seed``."""
    state = np.random.SeedSequence([seed, n]).generate_state(1)[0]
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(int(state)))
    held_out = min(max(1, round(fraction * n)), n - 1) if n > 1 else 0
    return perm[:held_out].sort().values, perm[held_out:].sort().values


def chunks(data: TrainData, size: int = 4096) -> list[Batch]:
    """``data`` in chunks of ``size`` examples (to bound the memory of a forward pass)."""
    return [(data.x[s:s + size], data.y[s:s + size]) for s in range(0, len(data.y), size)]


class FedFomoClient(ClientAlgorithm):
    """FedFomo's client (Algorithm 1, lines 9-12). In ``begin``, before the round's steps, it holds out
    a fixed validation part of its training split (``fedfomo-val-fraction`` of it, a permutation seeded
    by ``fedfomo-val-seed`` and the split's size: the same every round), and the losses on it of its own
    model ``θ_i`` (the received one) and of the downloaded models ``θ_n`` give ``w_n``; the client
    starts from their combination (``fomo_update``), trains it with local SGD on the rest of its split
    and returns the ``w_n`` for the server's affinity matrix. Not a hook on a user's loop: the
    validation part and the combination need ``begin``."""

    name = "fedfomo"
    hookable = False
    reply_keys = (WEIGHTS,)

    def __init__(self, model: nn.Module, config: Mapping[str, Any], state: ClientState | None = None,
                 loss_fn: LossFn = F.cross_entropy) -> None:
        super().__init__(model, config, state, loss_fn)
        self.slots = int(setting(config, SLOTS, "FedFomo"))
        self.val_fraction = float(config.get(VAL_FRACTION, 0.2))
        self.val_seed = int(config.get(VAL_SEED, 0))
        own = flatten_module(model)
        data = setting(config, DOWNLOADS, "FedFomo")
        if not isinstance(data, bytes) or len(data) % (4 * own.numel()) or len(data) // (4 * own.numel()) > self.slots:
            raise ValueError(f"'{DOWNLOADS}' must hold at most {self.slots} models of {own.numel()} float32 values")
        self.others = decode_flat(data, len(data) // 4, DOWNLOADS).view(-1, own.numel()).to(own.device)
        self.weights = torch.zeros(self.slots)

    def split(self, data: TrainData) -> tuple[TrainData, TrainData]:
        """``(validation, training)`` parts of the training split ``data`` (``validation_split``)."""
        val, train = (i.to(data.y.device) for i in validation_split(len(data.y), self.val_fraction, self.val_seed))
        return TrainData(data.x[val], data.y[val]), TrainData(data.x[train], data.y[train])

    def begin(self, model: nn.Module, data: TrainData) -> TrainData:
        """Combine the models on the validation part; the steps train on the rest."""
        val, train = self.split(data)
        if len(self.others) and len(val.y):
            self.combine(model, chunks(val))
        return train

    def combine(self, model: nn.Module, batches: Sequence[Batch]) -> None:
        """Replace the model by ``fomo_update``'s combination and record the weights ``w_n``."""
        own = flatten_module(model)
        scratch = copy.deepcopy(model)
        own_loss = mean_loss(scratch, own, batches, self.loss_fn)
        losses = torch.tensor([mean_loss(scratch, row, batches, self.loss_fn) for row in self.others], device=own.device)
        w = first_order_weights(own_loss, losses, own, self.others)
        self.weights[: len(w)] = w.cpu()
        load_flat_(model, fomo_update(own, self.others, w))
        model.train()

    def end_round(self, model: nn.Module, inputs: Any = None) -> dict[str, bytes]:
        return {WEIGHTS: encode_vector(self.weights)}


@dataclass
class FedFomo(Method, PersonalizedAlgorithm):
    """FedFomo (Zhang et al. 2021): each client combines the models of M other clients with
    first-order weights measured on its own validation data; the server picks them by affinity.

    Server (Algorithm 1): keeps every client's model θ_i and an affinity matrix ``P``. A participant
    ``i`` gets its own model and the models of ``M`` clients that have trained: with probability
    ``ε_t = max(0, ε − t_decay · (t − 1))`` ``M`` at random (ε-greedy exploration), else the ``M``
    with the largest ``p_{i,n}`` (ties in random order). Client: ``w_n = (L_i(θ_i) − L_i(θ_n)) /
    ||θ_n − θ_i||`` on its validation part (a fixed share of its training split, held out from
    training), ``θ_i ← θ_i + Σ_n (max(w_n, 0) / Σ_k max(w_k, 0)) (θ_n − θ_i)``, then local SGD on
    the rest of its split. The server stores the trained model and adds the returned weights to its
    row of the affinity matrix, ``p_{i,n} ← p_{i,n} + w_n``.
    Clients evaluate their stored model. The weight has no ``+1e-5`` in its denominator as PFLlib's
    and FL-bench's do (a model equal to the client's gets ``w = 0``), and neither reference has the
    ε-greedy exploration; FL-bench only offers the previous round's participants.
    """

    name = "fedfomo"
    strategy = "FedFomo"
    client = FedFomoClient
    default_clients_per_round = 10
    state_attributes = ("affinity", "trained")
    without_client_algorithm = "cannot run: every reply lacks the weights w_n"

    models: int = param(5, key="fedfomo-models", must=AT_LEAST_ONE, doc="M: other clients' models each participant downloads")
    epsilon: float = param(0.3, key="fedfomo-epsilon", must=UNIT_INTERVAL,
                           doc="ε-greedy: chance that a participant gets M random models instead of its top M by affinity")
    epsilon_decay: float = param(0.05, key="fedfomo-epsilon-decay", must=NON_NEGATIVE, doc="ε's decrease per round")
    val_fraction: float = param(0.2, key="fedfomo-val-fraction", must=OPEN_UNIT,
                                doc="share of a client's training split held out, the same every round, for the weights w_n")

    def setup(self, layout: ParamLayout, initial: torch.Tensor, device: torch.device, seed: int = 0) -> None:
        super().setup(layout, initial, device, seed)
        self.seed = seed
        #: p_{i,n}: the summed weights client i gave client n's models
        self.affinity: dict[Hashable, dict[Hashable, float]] = {}
        #: the clients with a trained model, and the last round each trained
        self.trained: dict[Hashable, int] = {}
        self._downloads: dict[Hashable, list[Hashable]] = {}

    def exploration(self, server_round: int) -> float:
        return max(0.0, self.epsilon - self.epsilon_decay * (server_round - 1))

    def choose(self, client: ClientId, generator: torch.Generator, epsilon: float) -> list[Hashable]:
        """The ``M`` clients whose models ``client`` downloads this round (ε-greedy over the affinity)."""
        candidates = [c for c in self.trained if c != client]
        explore = float(torch.rand((), generator=generator)) < epsilon
        order = torch.randperm(len(candidates), generator=generator).tolist()
        if not explore:
            row = self.affinity.get(client, {})
            order.sort(key=lambda j: -row.get(candidates[j], 0.0))  # stable: ties stay in random order
        return [candidates[j] for j in order[: self.models]]

    def train_instructions(self, server_round: int, sampled: Sequence[ClientId], others: Sequence[ClientId]) -> list[Instruction]:
        """Each participant's own model, with the models it downloads as ``fedfomo-downloads``."""
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + server_round)
        epsilon, own = self.exploration(server_round), self.stored(sampled)
        settings = {SLOTS: self.models, VAL_FRACTION: self.val_fraction, VAL_SEED: self.seed}
        out = []
        self._downloads = {}
        for i, cid in enumerate(sampled):
            chosen = self._downloads[cid] = self.choose(cid, generator, epsilon)
            rows = self.stored(chosen) if chosen else own.new_zeros((0, own.shape[1]))
            out.append(Instruction(cid, own[i], {**settings, DOWNLOADS: encode_vector(rows.flatten())}))
        return out

    def check_extras(self, extras: Mapping[str, Any]) -> torch.Tensor:
        """The weights ``w_n``: ``M`` finite float32 values."""
        return received_vector(extras, WEIGHTS, self.models, "FedFomo's weights w_n", FedFomoClient.__name__)

    def example_extras(self, generator: torch.Generator) -> dict[str, bytes]:
        return {WEIGHTS: encode_vector(torch.rand(self.models, generator=generator))}

    def update_norms(self, reply: Reply, sent: torch.Tensor) -> dict[str, tuple[float, float]]:
        """The model's change, and the weights against the round's median."""
        return {**super().update_norms(reply, sent), WEIGHTS: (norm(reply.extras), 0.0)}

    def aggregate(self, server_round: int, replies: Sequence[Reply]) -> None:
        """Store the trained models; ``p_{i,n} += w_n`` for the models each client received."""
        super().aggregate(server_round, replies)
        for reply in replies:
            self.trained[reply.client_id] = server_round
            row = self.affinity.setdefault(reply.client_id, {})
            for n, w in zip(self._downloads.get(reply.client_id, []), reply.extras.tolist()):
                row[n] = row.get(n, 0.0) + float(w)

    def server_state(self) -> dict[str, Any]:
        """The affinity matrix, by client."""
        return {"affinity": {cid: dict(row) for cid, row in self.affinity.items()}}
