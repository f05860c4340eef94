"""FedBN (Li, Jiang, Zhang, Kamp, Dou 2021): batch-normalization layers stay local, the rest is averaged."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from flower_pfl.engine.client_algorithm import ClientAlgorithm
from flower_pfl.engine.layout import ParamLayout
from flower_pfl.engine.model_facts import ModelFacts
from flower_pfl.engine.params import param
from flower_pfl.engine.reply_checks import Reply
from flower_pfl.methods.base import Method
from flower_pfl.methods.fedper import SharedPart

#: the buffers a batch-norm layer keeps besides its affine weight and bias: its running statistics
STATISTICS = ("running_mean", "running_var", "num_batches_tracked")


def is_statistic(name: str) -> bool:
    """A batch-norm running statistic (``bn1.running_mean``, ...), by its tensor name."""
    return name.rpartition(".")[2] in STATISTICS


def norm_layers(layout: ParamLayout) -> set[str]:
    """The batch-norm layers of a model, by module name: the modules that keep a ``running_mean``."""
    return {name.rpartition(".")[0] for name in layout.names if name.endswith(".running_mean")}


def name_mask(layout: ParamLayout, chosen: Callable[[str], bool]) -> torch.Tensor:
    """Which entries of the flat vector belong to tensors whose name is ``chosen``."""
    parts = [torch.full((math.prod(shape),), chosen(name)) for name, shape in zip(layout.names, layout.shapes)]
    return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.bool)


def norm_mask(layout: ParamLayout) -> torch.Tensor:
    """The entries FedBN keeps local: every tensor of a batch-norm layer (weight, bias, running statistics)."""
    layers = norm_layers(layout)
    return name_mask(layout, lambda name: name.rpartition(".")[0] in layers)


@dataclass
class FedBN(Method, SharedPart):
    """FedBN (Li et al. 2021): FedAvg of every layer but the batch-normalization ones, whose affine
    weights and running statistics stay each client's own.

    Algorithm 1: each client trains its model (plain local SGD); then for every layer ``l`` that is
    not batch normalization ``w^(l) ← (1/K) Σ_k w_k^(l)``, the BN layers keep ``w_k^(l)``. A
    participant gets the shared layers with its own BN layers (the initial ones before it first
    trains) and evaluates the same. BN layers are found by name (modules with a ``running_mean``);
    a model without any (``dnn``, ``mlr``, a ResNet with group normalization) is refused. The paper
    averages uniformly (its clients take part every round); PFLlib and FL-bench weight by sample
    count (``fedbn-weighted``).
    """

    name = "fedbn"
    strategy = "FedBN"
    client = ClientAlgorithm
    default_clients_per_round = 10

    weighted: bool = param(False, key="fedbn-weighted",
                           doc="weight the shared layers' mean by sample counts (PFLlib, FL-bench) instead of uniformly (the paper)")

    @classmethod
    def check_model(cls, facts: ModelFacts) -> str | None:
        if not facts.norm_statistics:
            return "a model with batch normalization (FedBN keeps its layers local; without them it is FedAvg with uniform weights)"
        return None

    def shared_columns(self, layout: ParamLayout) -> torch.Tensor:
        """The columns of every tensor that is not batch normalization."""
        return (~norm_mask(layout)).nonzero().flatten()

    def share_weights(self, replies: Sequence[Reply]) -> list[float]:
        """Uniform (Algorithm 1), or by sample count with ``fedbn-weighted``."""
        return [r.num_examples if self.weighted else 1.0 for r in replies]
