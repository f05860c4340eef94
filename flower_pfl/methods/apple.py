"""APPLE (Luo & Wu 2022): adaptive personalized cross-silo FL with learned directed relationships."""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

from flower_pfl.engine.client_algorithm import Batch, ClientAlgorithm, ClientState, LossFn, keep, setting, stored
from flower_pfl.engine.layout import ParamLayout, flatten_module, load_flat_
from flower_pfl.engine.params import NON_NEGATIVE, NON_NEGATIVE_INT, one_of, param
from flower_pfl.engine.server_algorithm import ClientId, Instruction, PersonalizedAlgorithm
from flower_pfl.engine.wire import decode_flat, encode_vector
from flower_pfl.methods.base import Method

#: config keys: the step size of p_i, the regularizer's
#: weight λ(r)·μ this round, the slots of the client and of the core models sent, those core models (bytes)
P_LR, REG, SLOTS, CORES = "apple-p-lr", "apple-reg", "apple-slots", "apple-cores"
#: client-state keys: [slots, p_i]; [slots, cached core models of the others]; [θ̂_i]
P_STATE, CORES_STATE, PERSONAL_STATE = "apple-p", "apple-cores", "apple-personal"
#: ε of the exponential schedule (the authors' code)
EXPONENTIAL_FLOOR = 0.001


def schedule(r: int, rounds: int, shape: str = "cosine") -> float:
    """``λ(r)`` of the loss scheduler, ``r`` counted from 0: ``(cos(π r / L) + 1) / 2`` ("cosine") or
    ``ε^{r/L}`` ("exponential", ε = 0.001) for ``r < L``, then 0."""
    if r >= rounds:
        return 0.0
    return (math.cos(math.pi * r / rounds) + 1) / 2 if shape == "cosine" else EXPONENTIAL_FLOOR ** (r / rounds)


def mixture_gradients(cores: torch.Tensor, p: torch.Tensor, p0: torch.Tensor, grad: torch.Tensor,
                      reg: float) -> tuple[torch.Tensor, torch.Tensor]:
    """With ``θ̂ = Σ_j p_j θ_j`` (``cores``: rows ``θ_j``, the client's own first) and ``g = ∂L/∂θ̂``:
    ``∂/∂θ_own = p_own g`` and ``∂/∂p_j = <g, θ_j> + 2 reg (p_j − p0_j)`` (the regularizer
    ``reg ||p − p0||²``, reg = λ(r) μ)."""
    return p[0] * grad, cores @ grad + 2 * reg * (p - p0)


class APPLEClient(ClientAlgorithm):
    """APPLE's client: per minibatch, the loss of ``θ̂_i = Σ_j p_ij θ_j`` over its own core model (the
    received model, the only one it trains) and the others' (``apple-cores``, cached in the client
    state between rounds) steps the own core with the round's ``lr`` and ``p_i`` with ``apple-p-lr``
    (``mixture_gradients``). ``p_i`` starts uniform over the cores the client knows, a core it meets
    later at 0; ``p0`` is uniform. The client keeps ``p_i``, the cores and ``θ̂_i``, and evaluates ``θ̂_i``."""

    name = "apple"
    evaluated_state = PERSONAL_STATE  # θ̂_i of the client's last round
    keeps_state = needs_state = True
    hookable = False

    def __init__(self, model: nn.Module, config: Mapping[str, Any], state: ClientState | None = None,
                 loss_fn: LossFn = F.cross_entropy) -> None:
        super().__init__(model, config, state, loss_fn)
        self.p_lr, self.reg = float(config[P_LR]), float(setting(config, REG, "APPLE"))
        if not self.p_lr >= 0 or not self.reg >= 0:
            raise ValueError(f"APPLE needs {P_LR} >= 0 and {REG} >= 0")
        own = flatten_module(model)
        slots = decode_flat(setting(config, SLOTS, "APPLE"), len(config[SLOTS]) // 4, SLOTS).long().tolist()
        received = decode_flat(setting(config, CORES, "APPLE"), (len(slots) - 1) * own.numel(), CORES).view(-1, own.numel())
        cache = dict(zip(*self._kept(CORES_STATE, own.numel()))) if stored(state, CORES_STATE) else {}
        cache.update(zip(slots[1:], received))
        cache.pop(slots[0], None)
        self.own_slot, self.slots = slots[0], sorted(cache)
        self.others = torch.stack([cache[s] for s in self.slots]).to(own) if cache else own.new_zeros((0, own.numel()))
        known = dict(zip(*self._kept(P_STATE, 1))) if stored(state, P_STATE) else {}
        n = 1 + len(self.slots)
        order = [self.own_slot, *self.slots]
        self.p = torch.tensor([float(known.get(s, torch.zeros(1))) if known else 1.0 / n for s in order])
        self.p0 = torch.full((n,), 1.0 / n)
        self.layout = ParamLayout.from_module(model)
        self.param_names = {name for name, p in model.named_parameters() if p.requires_grad}

    def _kept(self, key: str, width: int) -> tuple[list[int], list[torch.Tensor]]:
        slots, values = stored(self.state, key)  # type: ignore[misc]
        return slots.long().tolist(), list(values.reshape(-1, width).unbind(0))

    def personal(self, own: torch.Tensor) -> torch.Tensor:
        """``θ̂ = Σ_j p_j θ_j`` with the client's own core ``own``."""
        return self.p[0] * own + self.p[1:].to(own) @ self.others

    def train_step(self, model: nn.Module, next_batch: Callable[[], Batch], lr: float) -> float:
        x, y = next_batch()
        before = flatten_module(model)
        mixed = self.personal(before).detach().requires_grad_(True)
        params = {k: v for k, v in self.layout.unflatten(mixed).items() if k in self.param_names}
        loss = self.loss_fn(functional_call(model, params, (x,)), y)
        (grad,) = torch.autograd.grad(loss, mixed)
        own_grad, p_grad = mixture_gradients(torch.cat([before[None], self.others]), self.p.to(before),
                                             self.p0.to(before), grad, self.reg)
        load_flat_(model, flatten_module(model) - lr * own_grad)  # buffers as the forward pass left them
        self.p = (self.p - self.p_lr * p_grad.cpu()).float()
        self.steps += 1
        return float(loss.detach())

    def end_round(self, model: nn.Module, inputs: Any = None) -> dict[str, bytes]:
        slots = torch.tensor([self.own_slot, *self.slots], dtype=torch.float32)
        keep(self.state, P_STATE, [slots, self.p])
        keep(self.state, CORES_STATE, [slots[1:], self.others.flatten()])
        keep(self.state, PERSONAL_STATE, [self.personal(flatten_module(model))])
        return {}


@dataclass
class APPLE(Method, PersonalizedAlgorithm):
    """APPLE (Luo & Wu 2022): each client trains its core model through a personalized mixture of
    every client's core model, with mixing weights (directed relationships) it learns itself.

    Client ``i`` keeps ``p_i`` and predicts with ``θ̂_i = Σ_j p_ij θ_j``; per minibatch it steps its
    own core ``θ_i`` and ``p_i`` on ``L_i(θ̂_i) + λ(r) μ ||p_i − p0||²`` with separate step sizes
    (``lr`` and ``apple-p-lr``; PFLlib's default ``dr_learning_rate = 0`` never moves ``p_i``), where
    the loss scheduler ``λ(r)`` fades the pull toward ``p0`` out over ``L`` rounds. Server: keeps the
    core models, gives every client a slot, and sends each participant its own core with the others'
    (all, or ``M`` at random; the client keeps stale copies of the rest). ``p0`` and ``p_i``'s start
    are uniform, where the authors' code uses the clients' sample shares, which the server does not
    know; with ``M`` the authors choose by ``p_i``, which stays on the client, so ours are random.
    The regularizer has no ½ (the authors' code). Only the round's sampled clients train (the paper
    trains every client every round: ``clients-per-round`` = all nodes); with a fraction of N clients
    per round, a client's mixture starts with weight 1/N on its own core, which also scales that
    core's gradient step, and holds the initial cores of clients that have not trained yet, so it
    learns slowly until ``p_i`` moves (the reference check's ``apple`` and ``apple-all-clients`` rows).

    Default personal learning rate: ``apple-p-lr = 0.001``, the authors' code's step for ``p_i``
    (``lr_coef``). PFLlib's ``dr_learning_rate`` defaults to 0, under which ``p_i`` never moves and
    APPLE is a fixed uniform mixture; FL-bench has no APPLE. The reference check gives PFLlib 0.001.
    """

    name = "apple"
    strategy = "APPLE"
    client = APPLEClient
    default_clients_per_round = 10
    state_attributes = ("slots",)
    without_client_algorithm = "runs as Local: each client trains and evaluates its own core model"

    p_lr: float = param(0.001, key="apple-p-lr", must=NON_NEGATIVE,
                        doc="SGD step of the directed relationships p_i (the authors' lr_coef; 0 keeps them uniform)")
    mu: float = param(0.1, key="apple-mu", must=NON_NEGATIVE, doc="μ: weight of the pull of p_i toward p0 (0: none)")
    schedule_rounds: int = param(16, key="apple-schedule-rounds", must=NON_NEGATIVE_INT,
                                 doc="L: rounds over which the loss scheduler λ(r) fades the pull out (0: never on)")
    schedule: str = param("cosine", key="apple-schedule", must=one_of("cosine", "exponential"),
                          doc="shape of λ(r): (cos(π r/L) + 1)/2 or 0.001^(r/L) for r < L, then 0")
    downloads: int = param(0, key="apple-downloads", must=NON_NEGATIVE_INT,
                           doc="M: other clients' core models a participant downloads per round (0: all)")

    def setup(self, layout: ParamLayout, initial: torch.Tensor, device: torch.device, seed: int = 0) -> None:
        super().setup(layout, initial, device, seed)
        self.seed = seed
        #: every client's slot: its index in the clients' relationship vectors p_i
        self.slots: dict[Hashable, int] = {}

    def train_config(self, num_participants: int) -> dict[str, Any]:
        return {P_LR: self.p_lr}

    def downloaded(self, client: ClientId, generator: torch.Generator) -> list[Hashable]:
        """The clients whose core models ``client`` gets this round."""
        others = [c for c in self.slots if c != client]
        if not self.downloads or self.downloads >= len(others):
            return others
        return [others[j] for j in sorted(torch.randperm(len(others), generator=generator)[: self.downloads].tolist())]

    def train_instructions(self, server_round: int, sampled: Sequence[ClientId], others: Sequence[ClientId]) -> list[Instruction]:
        for cid in [*sampled, *others]:
            self.slots.setdefault(cid, len(self.slots))
        reg = self.mu * schedule(server_round - 1, self.schedule_rounds, self.schedule)
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + server_round)
        settings = {**self.train_config(len(sampled)), REG: reg}
        own = self.store.get(sampled)
        out = []
        for i, cid in enumerate(sampled):
            chosen = self.downloaded(cid, generator)
            cores = self.store.get(chosen) if chosen else own.new_zeros((0, own.shape[1]))
            slots = torch.tensor([self.slots[c] for c in [cid, *chosen]], dtype=torch.float32)
            out.append(Instruction(cid, own[i], {**settings, SLOTS: encode_vector(slots), CORES: encode_vector(cores.flatten())}))
        return out
