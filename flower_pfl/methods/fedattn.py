"""FedAttn (Luo, Panchal, Guan; paper 003): a global model trained by FedAvg whose biases are
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
from typing import Sequence

import numpy as np
import torch
from torch import nn

from ..layout import ParamLayout
from ..solvers import LocalResult, local_sgd, proximal_term, trainable

#: config keys: run FedAttn's client step, the bias regularization weight, the global biases (bytes)
FEDATTN, BIAS_REG, GLOBAL_BIASES = "fedattn", "fedattn-bias-reg", "fedattn-global-biases"
#: reply keys: the representation Z_i and the gradient with respect to the received biases (bytes)
REPRESENTATION, BIAS_GRADIENT = "fedattn-representation", "fedattn-bias-gradient"
#: neighbour searches at least this large (clients x queries) use FAISS when it is installed
FAISS_MIN_WORK = 100_000


def bias_mask(layout: ParamLayout) -> torch.Tensor:
    """Which entries of a flat parameter vector are biases (the personalized part ``M``): the
    tensors named ``*bias``; without such names (legacy Flower sends none), the 1-D tensors."""
    named = any(name.endswith("bias") for name in layout.names)
    flags = [name.endswith("bias") if named else len(shape) == 1 for name, shape in zip(layout.names, layout.shapes)]
    parts = [torch.full((math.prod(shape),), flag) for flag, shape in zip(flags, layout.shapes)]
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


def last_layer_input(model: nn.Module, x: torch.Tensor, batch_size: int = 4096) -> torch.Tensor:
    """The client representation: mean over ``x`` of the input to the model's last ``nn.Linear``."""
    last = [m for m in model.modules() if isinstance(m, nn.Linear)][-1]
    total, seen = None, 0
    captured: list[torch.Tensor] = []
    handle = last.register_forward_hook(lambda _m, inputs, _out: captured.append(inputs[0].detach()))
    try:
        model.eval()
        with torch.no_grad():
            for start in range(0, len(x), batch_size):
                captured.clear()
                model(x[start:start + batch_size])
                s = captured[0].flatten(1).sum(0)
                total = s if total is None else total + s
                seen += captured[0].shape[0]
    finally:
        handle.remove()
    if total is None:
        raise ValueError("no data to compute a representation from")
    return total / seen


def fedattn_local_sgd(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    steps: int,
    lr: float,
    batch_size: int,
    generator: torch.Generator,
    bias_reg: float = 0.0,
    global_biases: Sequence[torch.Tensor] | None = None,
) -> tuple[LocalResult, torch.Tensor, torch.Tensor]:
    """Local SGD on ``(G, M̃_i)`` (Algorithm 1, localSolver), in place; optional stabiliser
    ``bias_reg / 2 · ||b − b_G||²`` toward the global model's biases.

    Returns the result, ``Z_i^{t+1}`` (after training) and the gradient with respect to the received
    biases, as the mean gradient over the steps: ``(M̃_i − M_i^{t+1}) / (η T)`` (exact for ``T = 1``;
    the same pseudo-gradient FedAvg uses for ``G``), flat in parameter order.
    """
    if bias_reg < 0:
        raise ValueError(f"bias_reg must be >= 0, got {bias_reg}")
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    params = trainable(model)
    biases = [p for n, p in zip(names, params) if n.endswith("bias")]
    received = [b.detach().clone() for b in biases]
    regularizer = None
    if bias_reg > 0:
        if global_biases is None or len(global_biases) != len(biases):
            raise ValueError("bias regularization needs the global model's biases, one tensor per bias")
        anchor = [g.to(b.device).view_as(b) for g, b in zip(global_biases, biases)]
        bias_ids = {id(b) for b in biases}

        def regularizer(ps: list[torch.Tensor]) -> torch.Tensor:
            return bias_reg * proximal_term([p for p in ps if id(p) in bias_ids], anchor)

    result = local_sgd(model, x, y, steps=steps, lr=lr, batch_size=batch_size, generator=generator, regularizer=regularizer)
    gradient = torch.cat([(r - b.detach()).flatten() for r, b in zip(received, biases)]) / (lr * steps)
    return result, last_layer_input(model, x), gradient
