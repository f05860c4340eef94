"""FedAttn (Luo, Panchal, Guan): a global model trained by FedAvg whose biases are
personalized, per client, by a trainable attention over its nearest clients' biases.

- client representation ``Z_i``: the mean over the client's training data of the last layer's
  input (the second-to-last layer's output; for a model with one layer, the input itself);
- neighbours ``N_i``: the ``K`` clients nearest to ``Z_i`` in L2 (FAISS's exact index when
  installed and the search is large, else one ``cdist``; the same neighbours either way);
- ``M̃_i = softmax((Z_N W_K)(Z_i W_Q)ᵀ / √d_k) (M_N W_V)`` (Def. 3.1), ``W_V`` initialised to the
  identity so ``K = 1`` gives a client its own biases back;
- the client trains ``(G, M̃_i)`` and reports the gradient with respect to ``M̃_i``; the server
  back-propagates it through the attention and steps ``W_Q, W_K, W_V`` (Algorithm 1, lines 8-10).
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from flower_pfl.engine.client_algorithm import Batch, ClientAlgorithm, ClientState, LossFn, setting, trainable
from flower_pfl.engine.layout import ParamLayout
from flower_pfl.engine.model_split import mean_features
from flower_pfl.engine.params import AT_LEAST_ONE, NON_NEGATIVE, NON_NEGATIVE_INT, POSITIVE, param
from flower_pfl.engine.reply_checks import AlgorithmOutputMissing, Reply, norm
from flower_pfl.engine.server_algorithm import GlobalModelAlgorithm, Settings
from flower_pfl.engine.wire import decode_flat, decode_vector, encode_vector
from flower_pfl.methods.base import Method

#: config keys: the bias regularization weight, the global biases (bytes)
BIAS_REG, GLOBAL_BIASES = "fedattn-bias-reg", "fedattn-global-biases"
#: reply keys: the representation Z_i and the gradient with respect to the received biases (bytes)
REPRESENTATION, BIAS_GRADIENT = "fedattn-representation", "fedattn-bias-gradient"
#: neighbour searches at least this large (clients x queries) use FAISS when it is installed
FAISS_MIN_WORK = 100_000


def is_bias(name: str) -> bool:
    """The personalized part ``M``: parameters named ``*bias``, the same rule on the server and the client."""
    return name.endswith("bias")


def bias_mask(layout: ParamLayout) -> torch.Tensor:
    """Which entries of a flat parameter vector are biases (tensors named ``*bias``)."""
    parts = [torch.full((math.prod(shape),), is_bias(name)) for name, shape in zip(layout.names, layout.shapes)]
    return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.bool)


def nearest_neighbours(points: torch.Tensor, queries: torch.Tensor, k: int) -> torch.Tensor:
    """``(m, k)`` indices of the ``k`` rows of ``points`` nearest to each query (L2, exact), nearest first."""
    k = min(k, points.shape[0])
    if k < 1:
        raise ValueError("need at least one point and k >= 1")
    if points.shape[0] * queries.shape[0] >= FAISS_MIN_WORK:
        try:
            import faiss
        except ImportError:
            pass
        else:
            index = faiss.IndexFlatL2(points.shape[1])
            index.add(np.ascontiguousarray(points.detach().cpu().numpy(), dtype=np.float32))
            _, idx = index.search(np.ascontiguousarray(queries.detach().cpu().numpy(), dtype=np.float32), k)
            return torch.as_tensor(idx, dtype=torch.long)
    dist = torch.cdist(queries.double(), points.double())
    return torch.topk(dist, k, dim=1, largest=False, sorted=True).indices


class BiasAttention(nn.Module):
    """Scaled dot-product attention from client representations to biases (Def. 3.1)."""

    def __init__(self, d_z: int, d_bias: int, d_k: int, generator: torch.Generator | None = None,
                 learn_values: bool = True) -> None:
        """``learn_values=False`` keeps ``W_V = I`` (a stabiliser): ``M̃_i`` is then always a convex
        combination of the neighbours' biases, so the attention can only re-weight real biases."""
        super().__init__()
        self.d_k = d_k
        self.w_q = nn.Parameter(torch.randn(d_z, d_k, generator=generator) / math.sqrt(d_z))
        self.w_k = nn.Parameter(torch.randn(d_z, d_k, generator=generator) / math.sqrt(d_z))
        self.w_v = nn.Parameter(torch.eye(d_bias), requires_grad=learn_values)

    def forward(self, query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``query (m, d_z)``, ``keys (m, K, d_z)``, ``values (m, K, d_bias)`` -> ``(M̃ (m, d_bias), weights (m, K))``."""
        scores = torch.einsum("mkd,md->mk", keys @ self.w_k, query @ self.w_q) / math.sqrt(self.d_k)
        weights = torch.softmax(scores, dim=1)
        return torch.einsum("mk,mkb->mb", weights, values @ self.w_v), weights


def attention_step(module: BiasAttention, optimizer: torch.optim.Optimizer, query: torch.Tensor, keys: torch.Tensor,
                   values: torch.Tensor, gradients: torch.Tensor) -> None:
    """Back-propagate the clients' ``∂L_i/∂M̃_i`` (rows of ``gradients``) through the attention
    and take one optimizer step: the gradient of ``Σ_i <g_i, M̃_i(W)>`` is ``Σ_i (∂M̃_i/∂W)ᵀ g_i``."""
    optimizer.zero_grad()
    out, _ = module(query, keys, values)
    (out * gradients).sum().backward()
    optimizer.step()


class FedAttnClient(ClientAlgorithm):
    """FedAttn's client (Algorithm 1, localSolver): local SGD on ``(G, M̃_i)`` with the optional
    stabiliser ``ρ/2 ||b − b_G||²`` toward the global biases (gradient ``ρ (b − b_G)``). ``finish``
    returns ``Z_i`` (after training) and the gradient with respect to the received biases as the
    mean gradient over the steps, ``(M̃_i − M_i) / (η T)`` (exact for ``T = 1``; the same
    pseudo-gradient FedAvg uses for ``G``), flat in parameter order."""

    name = "fedattn"
    batched_state = ("global_biases",)
    needs_plain_sgd = True
    reply_keys = (REPRESENTATION, BIAS_GRADIENT)

    def __init__(self, model: nn.Module, config: Mapping[str, Any], state: ClientState | None = None,
                 loss_fn: LossFn = F.cross_entropy) -> None:
        super().__init__(model, config, state, loss_fn)
        self.is_bias = [is_bias(n) for n, p in model.named_parameters() if p.requires_grad]
        self.reg = float(config.get(BIAS_REG, 0.0))
        if self.reg < 0:
            raise ValueError(f"bias_reg must be >= 0, got {self.reg}")
        biases = [r for r, b in zip(self.received, self.is_bias) if b]
        anchors = decode_vector(setting(config, GLOBAL_BIASES, "FedAttn"), biases) if self.reg > 0 else biases
        self.global_biases = [a.to(device=b.device, dtype=b.dtype) for a, b in zip(anchors, biases)]


    def gradient_terms(self, params: Sequence[torch.Tensor], batch: Batch | None) -> Sequence[torch.Tensor | None]:
        if self.reg <= 0:
            return []
        anchors = iter(self.global_biases)
        return [self.reg * (p - next(anchors)) if b else None for p, b in zip(params, self.is_bias)]

    def end_round(self, model: nn.Module, inputs: torch.Tensor | Iterable[Any] | None = None) -> dict[str, bytes]:
        if inputs is None:
            raise ValueError("FedAttn's client reports a representation of its training inputs: pass them to finish()")
        if self.steps < 1:
            raise ValueError("FedAttn's bias gradient needs at least one step")
        x = inputs if isinstance(inputs, torch.Tensor) else torch.cat([b[0] if isinstance(b, (tuple, list)) else b for b in inputs])
        device = self.received[0].device
        gradient = torch.cat([(r - p.detach()).flatten() for r, p, b in zip(self.received, trainable(model), self.is_bias) if b])
        return {REPRESENTATION: encode_vector(mean_features(model, x.to(device))),
                BIAS_GRADIENT: encode_vector(gradient / (self.lr * self.steps))}


@dataclass
class _Sent:
    """What produced a client's ``M̃_i`` this round (to back-propagate its gradient later)."""

    query: torch.Tensor
    keys: torch.Tensor
    values: torch.Tensor


@dataclass
class FedAttn(Method, GlobalModelAlgorithm):
    """FedAttn (Luo, Panchal, Guan): a global model by FedAvg, each client's biases personalized by
    attention over its k nearest clients (Algorithm 1). Clients return ``fedattn-representation``
    and ``fedattn-bias-gradient`` (float32 bytes) with their model; a client without a
    representation yet (it has not trained) gets the global biases."""

    name = "fedattn"
    strategy = "FedAttn"
    reads_head = True
    client = FedAttnClient
    group = "paper"
    state_attributes = ("round", "d_z", "biases", "representations")

    k: int = param(5, key="fedattn-k", must=AT_LEAST_ONE, doc="nearest clients attended over (itself included)")
    d_k: int = param(16, key="fedattn-dk", must=AT_LEAST_ONE, doc="attention key size d_k")
    attention_lr: float = param(0.01, key="fedattn-lr", must=POSITIVE, doc="SGD step of the attention module (W_Q, W_K, W_V)")
    bias_reg: float = param(0.0, key="fedattn-bias-reg", must=NON_NEGATIVE,
                            doc="stabiliser: clients add bias_reg/2 ||b − b_global||² (0 = as the paper)")
    warmup_rounds: int = param(0, key="fedattn-warmup", must=NON_NEGATIVE_INT,
                               doc="stabiliser: rounds of plain FedAvg before biases are personalized (0 = as the paper)")
    learn_values: bool = param(True, key="fedattn-learn-values",
                               doc="False keeps W_V = I, so personalized biases stay a convex mix of real ones (stabiliser)")
    def setup(self, layout: ParamLayout, initial: torch.Tensor, device: torch.device, seed: int = 0) -> None:
        super().setup(layout, initial, device, seed)
        self.mask = bias_mask(layout)
        #: the biases' positions in the flat vector (indexing by them skips scanning the whole mask)
        self.bias_index = self.mask.nonzero().flatten()
        if not self.mask.any():
            raise ValueError(f"FedAttn personalizes the tensors named '*bias', and this model has none ({list(layout.names)}): "
                             "give the strategy the initial model with its parameter names")
        #: the representation's size: the last weight matrix's inputs (the last ``nn.Linear``'s)
        self.seed, self.round, self.d_z = seed, 0, next((shape[1] for shape in reversed(layout.shapes) if len(shape) == 2), 0)
        #: every client's last biases M_i and representation Z_i, the attention module and its optimizer
        self.biases: dict[Hashable, torch.Tensor] = {}
        self.representations: dict[Hashable, torch.Tensor] = {}
        self._points: tuple[list[Hashable], torch.Tensor] | None = None
        self.module: BiasAttention | None = None
        self.optimizer: torch.optim.Optimizer | None = None
        self._sent: dict[Hashable, _Sent] = {}

    def begin_round(self, server_round: int) -> None:
        self.round = server_round
        self._sent.clear()

    @property
    def personalizing(self) -> bool:
        return self.round > self.warmup_rounds and self.module is not None

    def train_config(self, num_participants: int) -> Settings:
        extras: Settings = {BIAS_REG: self.bias_reg}
        if self.bias_reg > 0:
            extras[GLOBAL_BIASES] = encode_vector(self.model.index_select(0, self.bias_index))
        return extras

    def personalized_biases(self, ids: Sequence[Hashable]) -> dict[Hashable, tuple[torch.Tensor, _Sent]]:
        """``M̃_i = Attention(Z_i, Z_N, M_N)`` over the ``k`` clients nearest to ``Z_i`` (Algorithm 1,
        lines 5-6) for those of ``ids`` with a representation (none while warming up): one forward
        pass of the attention over all of their neighbourhoods."""
        chosen = [cid for cid in dict.fromkeys(ids) if cid in self.representations] if self.personalizing else []
        if not chosen:
            return {}
        known, points = self.known_points()
        sent = []
        for cid in chosen:
            query = self.representations[cid]
            idx = nearest_neighbours(points, query[None], self.k)[0]
            sent.append(_Sent(query[None], points[idx][None], torch.stack([self.biases[known[i]] for i in idx.tolist()])[None]))
        with torch.no_grad():
            out, _ = self.module(torch.cat([s.query for s in sent]), torch.cat([s.keys for s in sent]),  # type: ignore[misc]
                                 torch.cat([s.values for s in sent]))
        return {cid: (biases, s) for cid, biases, s in zip(chosen, out, sent)}

    def known_points(self) -> tuple[list[Hashable], torch.Tensor]:
        """The clients with a representation and their ``(n, d_z)`` representations, stacked once
        until the representations change (not once per client asking)."""
        if self._points is None:
            known = list(self.representations)
            self._points = known, torch.stack([self.representations[c] for c in known])
        return self._points

    def client_models(self, ids: Sequence[Hashable], training: bool) -> list[torch.Tensor | None]:
        """``P_i = (G, M̃_i)`` (Algorithm 1, line 7) for each of ``ids``; ``None`` (the global model)
        while warming up or before a client has a representation."""
        made = self.personalized_biases(ids)
        out: list[torch.Tensor | None] = []
        for cid in ids:
            if cid not in made:
                out.append(None)
                continue
            biases, sent = made[cid]
            if training:
                self._sent[cid] = sent
            out.append(self.model.clone().index_copy_(0, self.bias_index, biases))
        return out

    def client_model(self, client_id: Hashable, training: bool) -> torch.Tensor | None:
        return self.client_models([client_id], training)[0]

    def check_extras(self, extras: Mapping[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
        """``Z_i`` (the size of the first client's) and ``∂L_i/∂M̃_i`` (one value per bias), all finite."""
        for key in (REPRESENTATION, BIAS_GRADIENT):
            if key not in extras:
                raise AlgorithmOutputMissing(f"the reply lacks '{key}' (FedAttn)", FedAttnClient.__name__)
        data = extras[REPRESENTATION]
        size = self.d_z or (len(data) // 4 if isinstance(data, bytes) else 0)
        z = decode_flat(data, size, REPRESENTATION)
        grad = decode_flat(extras[BIAS_GRADIENT], int(self.mask.sum()), BIAS_GRADIENT)
        if size == 0:
            raise ValueError(f"'{REPRESENTATION}' is empty")
        for key, values in ((REPRESENTATION, z), (BIAS_GRADIENT, grad)):
            if not torch.isfinite(values).all():
                raise ValueError(f"'{key}' holds NaN or Inf")
        return z, grad

    def example_extras(self, generator: torch.Generator) -> dict[str, bytes]:
        return {REPRESENTATION: encode_vector(0.01 * torch.randn(self.d_z, generator=generator)),
                BIAS_GRADIENT: encode_vector(0.01 * torch.randn(int(self.mask.sum()), generator=generator))}

    def update_norms(self, reply: Reply, sent: torch.Tensor) -> dict[str, tuple[float, float]]:
        """The model's change, and ``Z_i`` and the bias gradient against the round's median."""
        z, grad = reply.extras
        return {**super().update_norms(reply, sent), REPRESENTATION: (norm(z), 0.0), BIAS_GRADIENT: (norm(grad), 0.0)}

    def _ensure_module(self, d_z: int) -> None:
        if self.module is None:
            generator = torch.Generator().manual_seed(self.seed)
            self.module = BiasAttention(d_z, int(self.mask.sum()), self.d_k, generator, self.learn_values)
            self.optimizer = torch.optim.SGD([p for p in self.module.parameters() if p.requires_grad], lr=self.attention_lr)

    def combine(self, replies: Sequence[Reply]) -> torch.Tensor:
        """``G``: FedAvg of the returned models (weighted by samples); each client's ``M_i`` and ``Z_i``
        are stored; the attention takes one step on the gradients of the clients it personalized."""
        ids = [r.client_id for r in replies]
        new_global = super().combine(replies)
        self.d_z = self.d_z or replies[0].extras[0].numel()  # a model without weight matrices
        self._ensure_module(self.d_z)
        trained = [i for i, cid in enumerate(ids) if cid in self._sent]
        if trained:
            sent = [self._sent[ids[i]] for i in trained]
            attention_step(self.module, self.optimizer, torch.cat([s.query for s in sent]), torch.cat([s.keys for s in sent]),  # type: ignore[arg-type]
                           torch.cat([s.values for s in sent]), torch.stack([replies[i].extras[1] for i in trained]))
        for cid, reply in zip(ids, replies):
            self.biases[cid] = reply.model.index_select(0, self.bias_index)
            self.representations[cid] = reply.extras[0]
        self._points = None
        return new_global

    def get_state(self) -> dict[str, Any]:
        return {**super().get_state(), "module": self.module.state_dict() if self.module is not None else None}

    def set_state(self, state: dict[str, Any]) -> None:
        state = dict(state)
        module = state.pop("module")
        super().set_state(state)
        self._points = None
        if module is not None:
            self._ensure_module(self.d_z)
            self.module.load_state_dict(module)  # type: ignore[union-attr]

    def server_state(self) -> dict[str, Any]:
        """The attention module and every client's biases and representation."""
        return {"attention": self.module.state_dict() if self.module is not None else None,
                "biases": dict(self.biases), "representations": dict(self.representations)}
