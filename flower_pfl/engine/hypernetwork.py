"""Hypernetworks on the server: an MLP from a client embedding to a hidden code, and one linear head per
part of what it generates (pFedHN: each tensor of the model; pFedLA: each layer's aggregation weights
over the clients).

A method turns the heads' outputs into the model it sends (``to_model``: the concatenation, a layer-wise
combination of stored models, ...), and learns from how local training changed that model: the step
of Algorithm 1 of pFedHN, ``(∇_φ θ_i)ᵀ (θ_i − θ̃_i)``, is the gradient of ``½ ||θ_i − θ̃_i||²`` with
the trained ``θ̃_i`` held fixed, taken through ``to_model`` by the chain rule (``hypernetwork_gradients``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import nn


class HyperNetwork(nn.Module):
    """``h(v; φ)``: ``mlp`` (a linear layer from the embedding to ``hidden``, then ``hidden_layers`` times
    ReLU and a hidden-to-hidden linear layer, then a ReLU if ``code_relu``) and one linear head per part,
    of the part's size (each followed by a ReLU if ``head_relu``)."""

    def __init__(self, embed_dim: int, hidden: int, hidden_layers: int, sizes: Sequence[int],
                 code_relu: bool = False, head_relu: bool = False) -> None:
        super().__init__()
        layers: list[nn.Module] = [nn.Linear(embed_dim, hidden)]
        for _ in range(hidden_layers):
            layers += [nn.ReLU(), nn.Linear(hidden, hidden)]
        if code_relu:
            layers.append(nn.ReLU())
        self.mlp = nn.Sequential(*layers)
        self.heads = nn.ModuleList(nn.Linear(hidden, size) for size in sizes)
        self.head_relu = head_relu

    def linear_heads(self) -> list[nn.Linear]:
        """The heads, in order."""
        return [head for head in self.heads if isinstance(head, nn.Linear)]

    def parts(self, embeddings: torch.Tensor) -> list[torch.Tensor]:
        """``(m, embed_dim)`` embeddings -> one ``(m, size)`` output per head."""
        code = self.mlp(embeddings)
        outputs = [head(code) for head in self.heads]
        return [torch.relu(out) for out in outputs] if self.head_relu else outputs

    def forward(self, embeddings: torch.Tensor) -> torch.Tensor:
        """``(m, embed_dim)`` embeddings -> the heads' outputs concatenated, ``(m, Σ sizes)``."""
        return torch.cat(self.parts(embeddings), dim=1)


def hypernetwork_gradients(hnet: nn.Module, embeddings: torch.Tensor, trained: torch.Tensor,
                           to_model: Callable[[torch.Tensor], torch.Tensor] | None = None) -> torch.Tensor:
    """Put ``Σ_i (∇_φ θ_i)ᵀ (θ_i − θ̃_i)`` into the hypernetwork's ``.grad`` (its update direction,
    summed over the rows) and return the embeddings' rows of ``(∇_{v_i} θ_i)ᵀ (θ_i − θ̃_i)``;
    ``θ_i = to_model(h(v_i; φ))`` (``h``'s output itself by default), ``θ̃_i`` the trained models (rows)."""
    v = embeddings.detach().clone().requires_grad_(True)
    generated = hnet(v) if to_model is None else to_model(hnet(v))
    hnet.zero_grad()
    (generated * (generated.detach() - trained)).sum().backward()
    return v.grad  # type: ignore[return-value]


def widen_heads(hnet: HyperNetwork, rows: Sequence[torch.Tensor]) -> None:
    """More outputs for each head (pFedLA's weights for clients that joined): head ``h`` gets ``rows[h]``
    (``(k, hidden)``) as the weights of its ``k`` new outputs, and biases 0."""
    for head, new in zip(hnet.linear_heads(), rows):
        with torch.no_grad():
            head.weight = nn.Parameter(torch.cat([head.weight, new.to(head.weight)]))
            head.bias = nn.Parameter(torch.cat([head.bias, new.new_zeros(len(new))]))
        head.out_features = head.weight.shape[0]
