"""A generator trained on the server: ``G(ε, y)`` makes a feature (an input of the models' heads) of
class ``y`` from noise ``ε``, learned from an ensemble of the clients' heads, each trusted on a
class by its share of that class's examples (FedGen's data-free distillation; any method that
distills an ensemble of heads into features can use it).

``FeatureGenerator`` is the network, ``GeneratorTrainer`` its training (Adam, a learning rate decayed
once per call of ``train``) with the state a checkpoint keeps, and ``encode_generator`` /
``decode_generator`` its transport to the clients: the generator's tensors and the classes it was
trained on, as float32 bytes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from flower_pfl.engine.wire import decode_flat, encode_vector

#: what Adam keeps per parameter
ADAM_STATE = ("step", "exp_avg", "exp_avg_sq")
#: the ensemble: ``(n, d)`` features -> ``(K, n, C)`` logits, one row of logits per client head
Ensemble = Callable[[torch.Tensor], torch.Tensor]


class FeatureGenerator(nn.Module):
    """``G(ε, y)``: the noise ``ε ~ U[0, 1)^{noise_dim}`` beside the one-hot label, through one hidden
    layer (linear, batch normalization, ReLU) and a linear layer to a feature of size ``features``."""

    def __init__(self, noise_dim: int, classes: int, hidden: int, features: int) -> None:
        super().__init__()
        self.noise_dim, self.classes = noise_dim, classes
        self.hidden = nn.Sequential(nn.Linear(noise_dim + classes, hidden), nn.BatchNorm1d(hidden), nn.ReLU())
        self.out = nn.Linear(hidden, features)

    def forward(self, labels: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        one_hot = F.one_hot(labels, self.classes).to(noise.dtype)
        return self.out(self.hidden(torch.cat([noise, one_hot], dim=1)))

    def sample(self, labels: torch.Tensor, generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Features of ``labels`` from fresh noise (drawn on the CPU from ``generator``), and that noise."""
        device = self.out.weight.device
        noise = torch.rand(len(labels), self.noise_dim, generator=generator).to(device)
        return self(labels.to(device), noise), noise


def diversity_loss(noise: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
    """``exp(−mean_{i,j} d_ε(i, j) · d_G(i, j))``: ``d_ε`` the mean squared difference of two noises,
    ``d_G`` the mean absolute difference of their features (small when distinct noises give distinct
    features)."""
    noise_distance = (noise[:, None] - noise[None]).pow(2).mean(2)
    feature_distance = (features[:, None] - features[None]).abs().mean(2)
    return torch.exp(-(noise_distance * feature_distance).mean())


def label_weights(counts: torch.Tensor) -> torch.Tensor:
    """``(C, K)``: each client's share of each class's examples, from the ``(K, C)`` counts (a class
    nobody holds: zeros)."""
    return (counts / counts.sum(0).clamp_min(1e-12)).T


def ensemble_loss(logits: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """``Σ_k mean_n w_{y_n,k} CE(logits_{k,n}, y_n)``: the ``K`` heads' ``(K, n, C)`` logits on the
    features of ``labels``, each client's cross-entropy weighted by its share ``weights (C, K)`` of the
    label's examples."""
    k, n, _ = logits.shape
    ce = F.cross_entropy(logits.flatten(0, 1), labels.repeat(k), reduction="none").view(k, n)
    return (ce * weights[labels].T).mean(1).sum()


def linear_heads(weights: torch.Tensor, biases: torch.Tensor) -> Ensemble:
    """The ensemble of ``K`` linear heads, ``weights (K, C, d)`` and ``biases (K, C)``."""
    return lambda z: torch.einsum("kcd,nd->knc", weights, z) + biases[:, None]


class GeneratorTrainer:
    """A ``FeatureGenerator`` trained by Adam (``lr``, ``weight_decay``) on the ensemble loss plus
    ``diversity`` times the diversity loss, its learning rate multiplied by ``lr_decay`` after each
    call of ``train``. ``labels`` are the classes it was last trained on (the ones it generates)."""

    def __init__(self, generator: FeatureGenerator, lr: float, weight_decay: float = 0.0, lr_decay: float = 1.0) -> None:
        self.generator = generator
        self.optimizer = torch.optim.Adam(generator.parameters(), lr=lr, weight_decay=weight_decay)
        self.lr_decay = lr_decay
        #: 1 for each class the generator was last trained on, else 0
        self.labels = torch.zeros(generator.classes)

    @property
    def trained(self) -> bool:
        return bool(self.labels.any())

    @property
    def lr(self) -> float:
        """The learning rate of the next call of ``train``."""
        return float(self.optimizer.param_groups[0]["lr"])

    def train(self, ensemble: Ensemble, counts: torch.Tensor, *, steps: int, batch_size: int, diversity: float,
              rng: torch.Generator) -> dict[str, float]:
        """``steps`` Adam steps, each on ``batch_size`` labels drawn uniformly from the classes the
        ``(K, C)`` ``counts`` hold and noise from ``rng``; returns the mean losses."""
        held = counts.sum(0) > 0
        if not held.any():
            raise ValueError("the generator needs label counts with at least one example")
        classes, weights = held.nonzero().flatten(), label_weights(counts.to(torch.float32))
        self.generator.train()
        totals = torch.zeros(2)
        for _ in range(steps):
            labels = classes[torch.randint(len(classes), (batch_size,), generator=rng)]
            features, noise = self.generator.sample(labels, rng)
            teacher = ensemble_loss(ensemble(features), labels.to(features.device), weights.to(features.device))
            spread = diversity_loss(noise, features)
            self.optimizer.zero_grad()
            (teacher + diversity * spread).backward()
            self.optimizer.step()
            totals += torch.stack([teacher.detach(), spread.detach()]).cpu()
        for group in self.optimizer.param_groups:
            group["lr"] *= self.lr_decay
        self.generator.eval()
        self.labels = held.to(torch.float32).cpu()
        mean = totals / max(steps, 1)
        return {"teacher-loss": float(mean[0]), "diversity-loss": float(mean[1])}

    def get_state(self) -> dict[str, Any]:
        """The generator's tensors, Adam's step count and moments per parameter (``None`` before its first
        step), the learning rate and the classes: an exact resume."""
        moments = []
        for p in self.generator.parameters():
            kept = self.optimizer.state.get(p)
            moments.append(None if not kept else [kept[k].detach().clone() for k in ADAM_STATE])
        return {"generator": {k: v.detach().clone() for k, v in self.generator.state_dict().items()},
                "moments": moments, "lr": self.lr, "labels": self.labels.clone()}

    def set_state(self, state: dict[str, Any]) -> None:
        self.generator.load_state_dict(state["generator"])
        self.optimizer.state.clear()
        for p, kept in zip(self.generator.parameters(), state["moments"]):
            if kept is not None:
                self.optimizer.state[p] = {k: t.detach().clone() for k, t in zip(ADAM_STATE, kept)}
        for group in self.optimizer.param_groups:
            group["lr"] = float(state["lr"])
        self.labels = state["labels"].clone()


def _carried(generator: FeatureGenerator) -> list[torch.Tensor]:
    """The tensors that travel: parameters and running statistics (not the batch counter)."""
    return [t for t in generator.state_dict().values() if t.is_floating_point()]


def encode_generator(generator: FeatureGenerator, labels: torch.Tensor) -> bytes:
    """The classes ``labels (C,)`` (flags) and the generator's tensors as one float32 vector."""
    return encode_vector(torch.cat([labels.to(torch.float32).cpu(), *(t.detach().flatten().float().cpu() for t in _carried(generator))]))


def decode_generator(data: Any, generator: FeatureGenerator, name: str = "") -> torch.Tensor:
    """Load ``encode_generator``'s bytes into ``generator`` (of the sender's sizes; left in evaluation
    mode) and return the classes it generates; ``ValueError`` for bytes of another size or non-finite values."""
    tensors = _carried(generator)
    flat = decode_flat(data, generator.classes + sum(t.numel() for t in tensors), name)
    if not torch.isfinite(flat).all():
        raise ValueError(f"{f'{name!r}: ' if name else ''}the generator holds NaN or Inf")
    flags, rest = flat[:generator.classes], flat[generator.classes:]
    with torch.no_grad():
        for t, chunk in zip(tensors, rest.split([t.numel() for t in tensors])):
            t.copy_(chunk.view_as(t))
    generator.eval()
    return flags > 0
