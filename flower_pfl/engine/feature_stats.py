"""Feature statistics sent up: what a client's representation looks like, class by class, on its
training data, as the representation methods (FedPAC's prototypes and classifier statistics,
FedProto's prototypes) send it to the server.

The representation is the input of the model's last ``nn.Linear`` (``model_split.forward_with_features``),
of size ``d``; the classes are that layer's ``C`` outputs. A client computes ``class_statistics`` over
its whole training split (each class's share of the samples, its mean representation and the trace
of its covariance), sends them as bytes (``FeatureStats.encode``); the server reads them back with
``received_statistics`` (checked: the right size, finite, shares in [0, 1] summing to 1, variances
>= 0) and pools them over its clients (``pooled_class_means``), weighting each
client's share of a class by its sample count.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from flower_pfl.engine.layout import ParamLayout
from flower_pfl.engine.model_split import forward_with_features, head_module
from flower_pfl.engine.reply_checks import AlgorithmOutputMissing
from flower_pfl.engine.wire import decode_flat, encode_vector


@dataclass(frozen=True)
class FeatureStats:
    """One client's class-wise statistics of its representation ``z``: ``shares (C,)`` (each class's
    share of the samples), ``means (C, d)`` (``E[z | y = c]``, 0 for a class it lacks) and ``variances
    (C,)`` (``E[||z − μ_c||² | y = c]``, the trace of the class's covariance)."""

    shares: torch.Tensor
    means: torch.Tensor
    variances: torch.Tensor

    def encode(self) -> bytes:
        """The statistics as one float32 vector: shares, then means, then variances."""
        return encode_vector(torch.cat([self.shares.flatten(), self.means.flatten(), self.variances.flatten()]))

    @classmethod
    def decode(cls, data: Any, classes: int, dim: int, name: str = "") -> FeatureStats:
        """``encode``'s bytes back (``ValueError`` for the wrong size, naming the field ``name``)."""
        flat = decode_flat(data, classes * (dim + 2), name)
        return cls(flat[:classes], flat[classes:classes * (dim + 1)].view(classes, dim), flat[classes * (dim + 1):])

    def check(self, name: str) -> FeatureStats:
        """``self``, or a ``ValueError`` naming the field when a value is not finite, a share is outside
        [0, 1], the shares do not sum to 1 or a variance is negative."""
        if not all(torch.isfinite(t).all() for t in (self.shares, self.means, self.variances)):
            raise ValueError(f"'{name}' holds NaN or Inf")
        if (self.shares < 0).any() or (self.shares > 1).any() or abs(float(self.shares.sum()) - 1) > 1e-3:
            raise ValueError(f"'{name}': the class shares must lie in [0, 1] and sum to 1")
        if (self.variances < 0).any():
            raise ValueError(f"'{name}': the class variances must be >= 0")
        return self

    def mean(self) -> torch.Tensor:
        """The ``(d,)`` mean representation over all the client's samples: ``Σ_c share_c μ_c``."""
        return self.shares @ self.means

    def second_moments(self) -> torch.Tensor:
        """``(C,)`` ``E[||z||² | y = c]``: the variance plus the squared norm of the mean."""
        return self.variances + (self.means ** 2).sum(1)

    @classmethod
    def example(cls, classes: int, dim: int, generator: torch.Generator) -> FeatureStats:
        """Random valid statistics (for fabricated replies)."""
        shares = torch.rand(classes, generator=generator)
        return cls(shares / shares.sum(), torch.randn(classes, dim, generator=generator), torch.rand(classes, generator=generator))


@torch.no_grad()
def class_statistics(model: nn.Module, x: torch.Tensor, y: torch.Tensor, batch_size: int = 4096) -> FeatureStats:
    """``FeatureStats`` of ``model``'s representation of the samples ``x`` with labels ``y``, in
    evaluation mode (the model's mode is restored), in chunks of ``batch_size`` samples."""
    if len(y) == 0:
        raise ValueError("no data to compute feature statistics from")
    classes = head_module(model).out_features
    was_training = model.training
    model.eval()
    try:
        z = torch.cat([forward_with_features(model, x[i:i + batch_size])[1] for i in range(0, len(y), batch_size)])
    finally:
        model.train(was_training)
    counts = torch.bincount(y, minlength=classes).to(z.dtype)
    means = torch.zeros(classes, z.shape[1], dtype=z.dtype, device=z.device).index_add_(0, y, z) / counts.clamp_min(1)[:, None]
    spread = ((z - means[y]) ** 2).sum(1)
    variances = torch.zeros(classes, dtype=z.dtype, device=z.device).index_add_(0, y, spread) / counts.clamp_min(1)
    return FeatureStats(counts / counts.sum(), means, variances)


def representation_size(layout: ParamLayout, who: str) -> tuple[int, int]:
    """``(C, d)``: the classes and the representation size, from the model's last weight matrix
    (``ValueError`` naming ``who`` for a model without one)."""
    last = next((shape for shape in reversed(layout.shapes) if len(shape) == 2), None)
    if last is None:
        raise ValueError(f"{who} needs a last linear layer (a weight matrix) for its feature statistics; shapes {list(layout.shapes)}")
    return int(last[0]), int(last[1])


def received_statistics(extras: Mapping[str, Any], key: str, classes: int, dim: int, algorithm: str) -> FeatureStats:
    """The checked ``FeatureStats`` a reply carries under ``key`` (``AlgorithmOutputMissing`` naming
    the client ``algorithm`` when the reply lacks them, ``ValueError`` when they are malformed)."""
    if key not in extras:
        raise AlgorithmOutputMissing(f"the reply lacks '{key}' (its feature statistics)", algorithm)
    return FeatureStats.decode(extras[key], classes, dim, key).check(key)


def aggregate_prototypes(weights: torch.Tensor, prototypes: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``C̄^(j) = Σ_i w_ij C_i^(j) / Σ_i w_ij`` over the clients ``i`` that hold class ``j`` (``weights
    (m, C)``: their sample counts of ``j``; ``prototypes (m, C, d)``). Returns the ``(C, d)``
    prototypes and which classes have one."""
    total = weights.sum(0)
    known = total > 0
    mean = torch.einsum("mc,mcd->cd", weights, prototypes) / total.clamp_min(1e-12)[:, None]
    return torch.where(known[:, None], mean, 0.0), known


def pooled_class_means(stats: Sequence[FeatureStats], num_examples: Sequence[float]) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``(C, d)`` class means over clients, each client's weighted by its samples of the class
    (``share × num_examples``), and which classes some client holds."""
    weights = torch.stack([s.shares * float(n) for s, n in zip(stats, num_examples)])
    return aggregate_prototypes(weights, torch.stack([s.means for s in stats]))


def prototype_loss(z: torch.Tensor, y: torch.Tensor, prototypes: torch.Tensor, known: torch.Tensor) -> torch.Tensor:
    """``mean_n ||z_n − C̄^(y_n)||² / d``, the mean squared error over the batch and the ``d`` features
    (samples of a class without a global prototype add 0)."""
    targets, mask = prototypes[y], known[y].to(z.dtype)
    return (((z - targets) ** 2).mean(1) * mask).mean()
