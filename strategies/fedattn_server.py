"""FedAttn's server side: the global model ``G`` (FedAvg), every client's biases ``M_i`` and
representation ``Z_i``, and the trainable attention that personalizes biases (Algorithm 1)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Hashable, Mapping, Sequence

import torch

from flower_pfl.methods.fedattn import (
    BIAS_GRADIENT, BIAS_REG, FEDATTN, GLOBAL_BIASES, REPRESENTATION, BiasAttention, attention_step, bias_mask,
    nearest_neighbours,
)
from flower_pfl.wire import decode_flat, encode_vector

from .global_server import GlobalServer, weighted_mean


@dataclass
class _Sent:
    """What produced a client's ``M̃_i`` this round (to back-propagate its gradient later)."""

    query: torch.Tensor
    keys: torch.Tensor
    values: torch.Tensor


class FedAttnServer(GlobalServer):
    """``k``: neighbours per client (itself included); ``d_k``: attention key size;
    ``attention_lr``: SGD step of ``W_Q, W_K, W_V``; ``bias_reg``: clients add
    ``bias_reg / 2 ||b − b_G||²`` (stabiliser, 0 = as the paper); ``warmup_rounds``: rounds of plain
    FedAvg before biases are personalized (stabiliser, 0 = as the paper); ``learn_values=False``
    keeps ``W_V = I`` so ``M̃_i`` stays a convex combination of real biases (stabiliser, ``True`` = as
    the paper).

    A client without a representation yet (it has not trained) gets the global biases.
    """

    def __init__(self, k: int = 5, d_k: int = 16, attention_lr: float = 0.01, bias_reg: float = 0.0,
                 warmup_rounds: int = 0, learn_values: bool = True, seed: int = 0) -> None:
        super().__init__()
        if k < 1 or d_k < 1 or attention_lr <= 0 or bias_reg < 0 or warmup_rounds < 0:
            raise ValueError("FedAttn needs k >= 1, d_k >= 1, attention_lr > 0, bias_reg >= 0 and warmup_rounds >= 0")
        self.k, self.d_k, self.attention_lr = k, d_k, attention_lr
        self.bias_reg, self.warmup_rounds, self.learn_values, self.seed = bias_reg, warmup_rounds, learn_values, seed
        self.round = 0
        self.mask: torch.Tensor | None = None
        self.biases: dict[Hashable, torch.Tensor] = {}
        self.representations: dict[Hashable, torch.Tensor] = {}
        self.d_z = 0  # the representation size, from the first accepted reply
        self.module: BiasAttention | None = None
        self.optimizer: torch.optim.Optimizer | None = None
        self._sent: dict[Hashable, _Sent] = {}

    def on_initialize(self) -> None:
        self.mask = bias_mask(self.layout)  # type: ignore[arg-type]
        if not self.mask.any():
            raise ValueError("FedAttn personalizes biases, and this model has none")

    def begin_round(self, global_arrays: Sequence[Any], num_clients: int) -> None:
        super().begin_round(global_arrays, num_clients)
        self.round += 1
        self._sent.clear()

    @property
    def personalizing(self) -> bool:
        return self.round > self.warmup_rounds and self.module is not None

    def instructions(self, num_participants: int) -> dict[str, Any]:
        extras: dict[str, Any] = {FEDATTN: True, BIAS_REG: self.bias_reg}
        if self.bias_reg > 0:
            extras[GLOBAL_BIASES] = encode_vector(self.global_model[self.mask])  # type: ignore[index]
        return extras

    def personalized_biases(self, client_id: Hashable) -> tuple[torch.Tensor, _Sent] | None:
        """``M̃_i = Attention(Z_i, Z_N, M_N)`` over the ``k`` clients nearest to ``Z_i`` (Algorithm 1, lines 5-6)."""
        if not self.personalizing or client_id not in self.representations:
            return None
        known = list(self.representations)
        points = torch.stack([self.representations[c] for c in known])
        query = self.representations[client_id]
        idx = nearest_neighbours(points, query[None], self.k)[0]
        sent = _Sent(query[None], points[idx][None], torch.stack([self.biases[known[i]] for i in idx.tolist()])[None])
        with torch.no_grad():
            out, _ = self.module(sent.query, sent.keys, sent.values)  # type: ignore[misc]
        return out[0], sent

    def client_model(self, client_id: Hashable, training: bool) -> torch.Tensor | None:
        """``P_i = (G, M̃_i)`` (Algorithm 1, line 7); the global model while warming up or before
        the client has a representation."""
        made = self.personalized_biases(client_id)
        if made is None:
            return None
        biases, sent = made
        if training:
            self._sent[client_id] = sent
        model = self.global_model.clone()  # type: ignore[union-attr]
        model[self.mask] = biases  # type: ignore[index]
        return model

    def check_payload(self, payload: Mapping[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
        """``Z_i`` (the size of the first client's) and ``∂L_i/∂M̃_i`` (one value per bias), all finite."""
        for key in (REPRESENTATION, BIAS_GRADIENT):
            if key not in payload:
                raise ValueError(f"the reply lacks '{key}' (FedAttn)")
        data = payload[REPRESENTATION]
        size = self.d_z or (len(data) // 4 if isinstance(data, bytes) else 0)
        z = decode_flat(data, size)
        grad = decode_flat(payload[BIAS_GRADIENT], int(self.mask.sum()))  # type: ignore[union-attr]
        if size == 0 or not (torch.isfinite(z).all() and torch.isfinite(grad).all()):
            raise ValueError("FedAttn's representation or bias gradient is empty or holds NaN or Inf")
        self.d_z = size
        return z, grad

    def _ensure_module(self, d_z: int) -> None:
        if self.module is None:
            generator = torch.Generator().manual_seed(self.seed)
            self.module = BiasAttention(d_z, int(self.mask.sum()), self.d_k, generator, self.learn_values)  # type: ignore[union-attr]
            self.optimizer = torch.optim.SGD([p for p in self.module.parameters() if p.requires_grad], lr=self.attention_lr)

    def aggregate(self, ids: Sequence[Hashable], models: Sequence[torch.Tensor], payloads: Sequence[Any],
                  num_examples: Sequence[int]) -> torch.Tensor:
        """``G``: FedAvg of the returned models (weighted by samples); each client's ``M_i`` and ``Z_i``
        are stored; the attention takes one step on the gradients of the clients it personalized."""
        stacked = torch.stack(list(models))
        new_global = weighted_mean(stacked, num_examples)
        self._ensure_module(self.d_z)
        trained = [i for i, cid in enumerate(ids) if cid in self._sent]
        if trained:
            sent = [self._sent[ids[i]] for i in trained]
            attention_step(self.module, self.optimizer, torch.cat([s.query for s in sent]), torch.cat([s.keys for s in sent]),  # type: ignore[arg-type]
                           torch.cat([s.values for s in sent]), torch.stack([payloads[i][1] for i in trained]))
        for cid, model, (z, _) in zip(ids, stacked, payloads):
            self.biases[cid] = model[self.mask].clone()  # type: ignore[index]
            self.representations[cid] = z
        self.global_model = new_global  # what this round's evaluation personalizes
        return new_global

    def state_dict(self) -> dict[str, Any]:
        """The attention module and every client's biases and representation."""
        return {"attention": self.module.state_dict() if self.module is not None else None,
                "biases": dict(self.biases), "representations": dict(self.representations)}
