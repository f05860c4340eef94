"""pFedLA (Ma et al. 2022): layer-wised personalized aggregation by per-client hypernetworks."""

from __future__ import annotations

import copy
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from flower_pfl.engine.client_algorithm import ClientAlgorithm, sgd_step
from flower_pfl.engine.hypernetwork import HyperNetwork, hypernetwork_gradients, widen_heads
from flower_pfl.engine.layout import ParamLayout
from flower_pfl.engine.params import AT_LEAST_ONE, NON_NEGATIVE_INT, POSITIVE, param
from flower_pfl.engine.reply_checks import Reply
from flower_pfl.engine.server_algorithm import ClientId, Instruction, PersonalizedAlgorithm
from flower_pfl.methods.base import Method

#: hidden-to-hidden layers of each hypernetwork's MLP (FL-bench's: three linear layers, each with a ReLU)
HIDDEN_LAYERS = 2


def layer_weights(raw: torch.Tensor, own: int, local_layers: int = 0) -> torch.Tensor:
    """The ``(L, N)`` aggregation weights from a hypernetwork's ``(L, N)`` outputs ``α_i^l`` (ReLU'd):
    each layer's row divided by its sum, a row summing to 0 replaced by the client's own one-hot (as
    FL-bench); HeurpFedLA: the ``local_layers`` layers with the largest self weight ``α_ii^l`` take
    the one-hot too, with no gradient."""
    one_hot = torch.zeros_like(raw[0])
    one_hot[own] = 1.0
    local = torch.zeros(len(raw), dtype=torch.bool, device=raw.device)
    if local_layers:
        local[torch.topk(raw[:, own].detach(), local_layers).indices] = True
    sums = raw.sum(1, keepdim=True)
    normalized = raw / torch.where(sums > 0, sums, torch.ones_like(sums))
    keep_own = local[:, None] | (sums <= 0)
    return torch.where(keep_own, one_hot, normalized)


def combine_layers(weights: torch.Tensor, models: torch.Tensor, layers: Sequence[slice]) -> torch.Tensor:
    """``θ̂^l = Σ_j w_j^l θ_j^l`` for each layer ``l`` (its columns ``layers[l]``), from ``(L, N)``
    weights and the ``(N, d)`` clients' models: one flat model."""
    return torch.cat([weights[index] @ models[:, columns] for index, columns in enumerate(layers)])


@dataclass
class PFedLA(Method, PersonalizedAlgorithm):
    """pFedLA (Ma et al. 2022): the server keeps a hypernetwork per client that weighs, layer by layer,
    every client's model into that client's personalized model, and learns the weights from how local
    training changed it.

    For client ``i`` (of the ``N`` known), ``α_i = HN_i(v_i; φ_i)`` gives each layer ``l`` a weight
    ``α_ij^l ≥ 0`` per client (an MLP and one ReLU'd linear head of ``N`` outputs per layer), and the
    client gets ``θ̂_i^l = Σ_j (α_ij^l / Σ_k α_ik^l) θ_j^l``, ``θ_j`` the model client ``j`` last
    trained (the initial model before). It runs plain local SGD to ``θ̃_i``; the server stores
    ``θ_i ← θ̃_i`` and steps ``φ_i`` and ``v_i`` along ``(∇_{φ_i} θ̂_i)ᵀ (θ̂_i − θ̃_i)`` and
    ``(∇_{v_i} θ̂_i)ᵀ (θ̂_i − θ̃_i)`` (the chain rule through the weights ``α_i``), with plain SGD of
    step ``hn_lr``. HeurpFedLA (``k > 0``): the ``k`` layers with the largest self weight ``α_ii^l``
    stay the client's own. Clients evaluate their stored model. A layer is a module (weight and bias
    together; FL-bench: each tensor); a layer whose weights are all 0 is the client's own, as in
    FL-bench.

    Against FL-bench: it steps along ``(∇θ̂)ᵀ (θ̃ − θ̂)`` (``grad_outputs = −diff``), which moves
    ``θ̂_i`` away from what the client trained, and its client loads its stored model over ``θ̂_i``,
    so that ``θ̂_i`` is never trained; here the descent direction of pFedHN's authors is taken and the
    client trains ``θ̂_i``. Clients join the ``N`` as they are first connected (FL-bench knows them
    all at the start: the same when every client is connected in the first round); a new client's
    column of every head starts as FL-bench's do, U(0, 1) weights and a 0 bias. A round's
    participants are personalized from the models stored at its start (FL-bench: one after another).
    """

    name = "pfedla"
    strategy = "PFedLA"
    client = ClientAlgorithm
    default_clients_per_round = 10
    state_attributes = ("embeddings",)

    embed_dim: int = param(100, key="pfedla-embed-dim", must=AT_LEAST_ONE, doc="size of each client's embedding v_i (FL-bench's 100)")
    hidden: int = param(100, key="pfedla-hidden", must=AT_LEAST_ONE, doc="width of the hypernetworks' hidden layers (FL-bench's 100)")
    hn_lr: float = param(0.005, key="pfedla-hn-lr", must=POSITIVE, doc="SGD step of each hypernetwork φ_i and embedding v_i (FL-bench's 5e-3)")
    k: int = param(0, key="pfedla-k", must=NON_NEGATIVE_INT,
                   doc="HeurpFedLA: layers each client keeps its own, those with the largest self weight (0: pFedLA)")

    def setup(self, layout: ParamLayout, initial: torch.Tensor, device: torch.device, seed: int = 0) -> None:
        super().setup(layout, initial, device, seed)
        self.layers = [columns for _, columns in layout.components("module")]
        if self.k > len(self.layers):
            raise ValueError(f"pFedLA: k = {self.k} layers kept local, but the model has {len(self.layers)}")
        self.seed = seed
        with torch.random.fork_rng(devices=[]), warnings.catch_warnings():
            warnings.filterwarnings("ignore", "Initializing zero-element tensors")
            torch.manual_seed(seed)
            self.start = self._hypernetwork(0)  # every client's hypernetwork starts as this one (FL-bench: copies)
        #: every client's embedding v_i (the known clients, in the order of their weights: first connected
        #: first) and hypernetwork HN_i
        self.embeddings: dict[ClientId, torch.Tensor] = {}
        self.hypernetworks: dict[ClientId, HyperNetwork] = {}

    def _hypernetwork(self, clients: int) -> HyperNetwork:
        return HyperNetwork(self.embed_dim, self.hidden, HIDDEN_LAYERS, [clients] * len(self.layers), code_relu=True, head_relu=True)

    def join(self, ids: Sequence[ClientId]) -> None:
        """Add the clients of ``ids`` not known yet: a column of every head, an embedding N(0, 1) and a
        hypernetwork (seeded by the run's seed and the client's place)."""
        for cid in ids:
            if cid not in self.embeddings:
                generator = torch.Generator().manual_seed(self.seed * 1_000_003 + len(self.clients))
                self.embeddings[cid] = torch.randn(self.embed_dim, generator=generator)
                self.hypernetworks[cid] = copy.deepcopy(self.start)

    @property
    def clients(self) -> list[ClientId]:
        """The known clients, in the order of their weights (first connected first)."""
        return list(self.embeddings)

    def hypernetwork(self, cid: ClientId) -> HyperNetwork:
        """``HN_i`` with one output per known client: the columns of clients that joined since it last
        ran start as U(0, 1) weights and a 0 bias, the same in every hypernetwork."""
        hnet = self.hypernetworks[cid]
        have = hnet.linear_heads()[0].out_features
        if have < len(self.clients):
            rows = [torch.rand(len(self.layers), self.hidden, generator=torch.Generator().manual_seed(self.seed * 1_000_003 + j))
                    for j in range(have, len(self.clients))]
            widen_heads(hnet, list(torch.stack(rows, 1)))
        return hnet

    def personalized(self, cid: ClientId, models: torch.Tensor) -> tuple[HyperNetwork, Any]:
        """``HN_i`` and the function from its output to ``θ̂_i`` over the known clients' ``(N, d)`` models."""
        own = self.clients.index(cid)
        n = len(self.clients)

        def to_model(raw: torch.Tensor) -> torch.Tensor:
            weights = layer_weights(raw.view(len(self.layers), n), own, self.k).to(models.device)  # the hypernetworks live on the CPU
            return combine_layers(weights, models, self.layers)[None]

        return self.hypernetwork(cid), to_model

    def train_instructions(self, server_round: int, sampled: Sequence[ClientId], others: Sequence[ClientId]) -> list[Instruction]:
        """Each sampled client trains its ``θ̂_i`` (plain local SGD); every connected client is known."""
        self.join([*sampled, *others])
        models, settings = self.stored(self.clients), self.train_config(len(sampled))
        out = []
        with torch.no_grad():
            for cid in sampled:
                hnet, to_model = self.personalized(cid, models)
                out.append(Instruction(cid, to_model(hnet(self.embeddings[cid][None]))[0], settings))
        return out

    def aggregate(self, server_round: int, replies: Sequence[Reply]) -> None:
        """A step of each participant's ``φ_i`` and ``v_i`` (from the models stored at the round's start),
        then its trained model stored."""
        models = self.stored(self.clients)
        for reply in replies:
            hnet, to_model = self.personalized(reply.client_id, models)
            v = self.embeddings[reply.client_id]
            grad = hypernetwork_gradients(hnet, v[None], reply.model[None].to(models.device), to_model)
            sgd_step(list(hnet.parameters()), self.hn_lr)
            self.embeddings[reply.client_id] = v - self.hn_lr * grad[0]
        super().aggregate(server_round, replies)

    def get_state(self) -> dict[str, Any]:
        """With every client's hypernetwork."""
        nets = {cid: {k: v.detach().clone() for k, v in hnet.state_dict().items()} for cid, hnet in self.hypernetworks.items()}
        return {**super().get_state(), "hypernetworks": nets}

    def set_state(self, state: dict[str, Any]) -> None:
        state = dict(state)
        nets = state.pop("hypernetworks")
        super().set_state(state)
        self.hypernetworks = {}
        for cid, weights in nets.items():
            self.hypernetworks[cid] = hnet = self._hypernetwork(int(weights["heads.0.weight"].shape[0]))
            hnet.load_state_dict(weights)

    def server_state(self) -> dict[str, Any]:
        """Every client's embedding and current layer weights ``(L, N)``, over the clients in join order."""
        with torch.no_grad():
            weights = {cid: layer_weights(self.hypernetwork(cid)(self.embeddings[cid][None]).view(len(self.layers), -1),
                                          self.clients.index(cid), self.k) for cid in self.clients}
        return {"embeddings": dict(self.embeddings), "layer-weights": weights}
