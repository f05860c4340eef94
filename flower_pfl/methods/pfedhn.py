"""pFedHN (Shamsian, Navon, Fetaya, Chechik 2021): personalized federated hypernetworks."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from flower_pfl.engine.client_algorithm import ClientAlgorithm
from flower_pfl.engine.hypernetwork import HyperNetwork, hypernetwork_gradients
from flower_pfl.engine.layout import ParamLayout
from flower_pfl.engine.model_facts import ModelFacts
from flower_pfl.engine.params import AT_LEAST_ONE, HALF_OPEN_UNIT, NON_NEGATIVE, NON_NEGATIVE_INT, POSITIVE, param
from flower_pfl.engine.reply_checks import Reply
from flower_pfl.engine.server_algorithm import ClientId, Instruction, ServerAlgorithm
from flower_pfl.methods.base import Method


@dataclass
class PFedHN(Method, ServerAlgorithm):
    """pFedHN (Shamsian et al. 2021): a hypernetwork on the server generates each client's model from
    a learned client embedding; it learns from how the clients' local training changed those models.

    Algorithm 1: ``θ_i = h(v_i; φ)`` is sent to client i, which runs local SGD to ``θ̃_i`` (plain
    training); the server steps ``φ`` along ``(∇_φ θ_i)ᵀ (θ_i − θ̃_i)`` and ``v_i`` along
    ``(∇_{v_i} θ_i)ᵀ (θ_i − θ̃_i)`` (the authors' code's sign; Algorithm 1 prints ``Δθ_i = θ̃_i − θ_i``
    with a descent step, which would ascend). A client evaluates its generated model. The paper
    samples one client per step; here a round's clients are one step on the sum of their terms (each
    ``v_i`` gets its own). ``φ`` takes SGD steps with momentum and weight decay and the round's
    gradient is clipped in norm, as in the authors' code; embeddings take plain SGD steps of
    ``embed_lr``, start N(0, 1) and are made for a client when it is first seen. The authors' embedding
    size is 1 + n/4 for n clients, unknown when the server starts: here a hyperparameter. Every
    tensor of the model is generated (FL-bench keeps batch-norm buffers on the clients).

    Default embedding size: 16, the authors' rule for 60 clients, so that the hypernetwork's input
    does not change with the federation's size. FL-bench applies the rule (``embed_dim = -1``: 26 for
    100 clients); give ``pfedhn-embed-dim = 1 + n/4`` to follow it, as the reference check does.
    """

    name = "pfedhn"
    strategy = "PFedHN"
    client = ClientAlgorithm
    default_clients_per_round = 10
    state_attributes = ("embeddings",)

    embed_dim: int = param(16, key="pfedhn-embed-dim", must=AT_LEAST_ONE, doc="size of each client's embedding v_i")
    hidden: int = param(100, key="pfedhn-hidden", must=AT_LEAST_ONE, doc="width of the hypernetwork's hidden layers")
    hidden_layers: int = param(3, key="pfedhn-hidden-layers", must=NON_NEGATIVE_INT,
                               doc="hidden-to-hidden layers of the hypernetwork's MLP")
    hn_lr: float = param(0.01, key="pfedhn-lr", must=POSITIVE, doc="step α of the hypernetwork φ")
    embed_lr: float = param(0.01, key="pfedhn-embed-lr", must=NON_NEGATIVE, doc="step of the client embeddings v_i")
    momentum: float = param(0.9, key="pfedhn-momentum", must=HALF_OPEN_UNIT, doc="SGD momentum of φ (the authors' 0.9)")
    weight_decay: float = param(0.001, key="pfedhn-weight-decay", must=NON_NEGATIVE, doc="weight decay of φ (the authors' 1e-3)")
    clip: float = param(50.0, key="pfedhn-clip", must=POSITIVE, doc="largest norm of a round's gradient of φ and the embeddings")

    @classmethod
    def check_model(cls, facts: ModelFacts) -> str | None:
        if facts.norm_statistics:
            return "a model without batch normalization (pFedHN generates every tensor, its running statistics too)"
        return None

    def setup(self, layout: ParamLayout, initial: torch.Tensor, device: torch.device, seed: int = 0) -> None:
        super().setup(layout, initial, device, seed)
        self.seed = seed
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.hnet = HyperNetwork(self.embed_dim, self.hidden, self.hidden_layers, layout.sizes)
        self.optimizer = torch.optim.SGD(self.hnet.parameters(), lr=self.hn_lr, momentum=self.momentum, weight_decay=self.weight_decay)
        #: every client's embedding v_i, in the order clients were first seen
        self.embeddings: dict[ClientId, torch.Tensor] = {}

    def embedding(self, client_id: ClientId) -> torch.Tensor:
        """``v_i``, drawn N(0, 1) (seeded by the run's seed and how many clients came before) when first asked for."""
        if client_id not in self.embeddings:
            generator = torch.Generator().manual_seed(self.seed * 1_000_003 + len(self.embeddings))
            self.embeddings[client_id] = torch.randn(self.embed_dim, generator=generator)
        return self.embeddings[client_id]

    def generated(self, ids: Sequence[ClientId]) -> list[torch.Tensor]:
        """``θ_i = h(v_i; φ)`` for each of ``ids``, in one batch."""
        if not ids:
            return []
        with torch.no_grad():
            return list(self.hnet(torch.stack([self.embedding(cid) for cid in ids])))

    def train_instructions(self, server_round: int, sampled: Sequence[ClientId], others: Sequence[ClientId]) -> list[Instruction]:
        """Each sampled client trains its generated model (plain local SGD)."""
        settings = self.train_config(len(sampled))
        return [Instruction(cid, model, settings) for cid, model in zip(sampled, self.generated(sampled))]

    def evaluation_instructions(self, server_round: int, ids: Sequence[ClientId]) -> list[Instruction]:
        """Each client evaluates its generated model."""
        return [Instruction(cid, model, self.evaluation_config()) for cid, model in zip(ids, self.generated(ids))]

    new_client_rule = "the hypernetwork's model for the mean of the participating clients' embeddings"

    def new_client_instructions(self, server_round: int, ids: Sequence[ClientId]) -> list[Instruction]:
        """``h(v̄; φ)``, ``v̄`` the mean embedding of the participating clients (a new client's own would be
        untrained: the paper learns one for a novel client, which evaluation alone cannot); none is stored."""
        known = list(self.embeddings.values()) or [torch.zeros(self.embed_dim)]  # none yet: the embeddings' mean, 0
        with torch.no_grad():
            model = self.hnet(torch.stack(known).mean(0)[None])[0]
        return [Instruction(cid, model, self.evaluation_config()) for cid in ids]

    def aggregate(self, server_round: int, replies: Sequence[Reply]) -> None:
        """One step of ``φ`` and of each participant's ``v_i`` (Algorithm 1, lines 8-9)."""
        ids = [r.client_id for r in replies]
        grads = hypernetwork_gradients(self.hnet, torch.stack([self.embedding(c) for c in ids]), torch.stack([r.model for r in replies]))
        holder = nn.Parameter(torch.zeros_like(grads))
        holder.grad = grads
        torch.nn.utils.clip_grad_norm_([*self.hnet.parameters(), holder], self.clip)
        self.optimizer.step()
        for cid, g in zip(ids, holder.grad):
            self.embeddings[cid] = self.embeddings[cid] - self.embed_lr * g

    def get_state(self) -> dict[str, Any]:
        """With the hypernetwork's parameters and the momentum of its optimizer."""
        params = list(self.hnet.parameters())
        return {**super().get_state(), "hypernetwork": {k: v.detach().clone() for k, v in self.hnet.state_dict().items()},
                "momentum": [self._momentum(p) for p in params]}

    def _momentum(self, p: torch.Tensor) -> torch.Tensor | None:
        buffer = self.optimizer.state.get(p, {}).get("momentum_buffer")
        return None if buffer is None else buffer.clone()

    def set_state(self, state: dict[str, Any]) -> None:
        state = dict(state)
        hnet, momentum = state.pop("hypernetwork"), state.pop("momentum")
        super().set_state(state)
        self.hnet.load_state_dict(hnet)
        for p, buffer in zip(self.hnet.parameters(), momentum):
            if buffer is not None:
                self.optimizer.state[p]["momentum_buffer"] = buffer.clone()

    def server_state(self) -> dict[str, Any]:
        """The hypernetwork and every client's embedding."""
        return {"hypernetwork": dict(self.hnet.state_dict()), "embeddings": dict(self.embeddings)}
