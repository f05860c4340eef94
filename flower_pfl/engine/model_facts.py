"""What a method may ask of a model before a run starts: how many layers it has, whether it keeps
batch-norm running statistics, and whether it has a head that the body/head and representation
methods can use. A method's ``check_model`` reads these and says why it cannot run on a model."""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from flower_pfl.engine.layout import ParamLayout
from flower_pfl.engine.model_split import head_problem

#: the tensor-name suffix of a batch-norm layer's running mean
RUNNING_MEAN = ".running_mean"


@dataclass(frozen=True)
class ModelFacts:
    """``layers``: modules with tensors (``ParamLayout.components("module")``); ``norm_statistics``: it keeps
    batch-norm running statistics; ``head_problem``: why its head cannot serve (``None``: it can, or only
    the layout is known)."""

    layers: int
    norm_statistics: bool
    head_problem: str | None = None

    @classmethod
    def of_layout(cls, layout: ParamLayout) -> ModelFacts:
        """What a flat model's names and shapes tell (a strategy in a user's app sees no more)."""
        return cls(len(layout.components("module")) if layout.named else len(layout.names),
                   any(name.endswith(RUNNING_MEAN) for name in layout.names))

    @classmethod
    def of_model(cls, model: nn.Module) -> ModelFacts:
        return cls.of_layout(ParamLayout.from_module(model)).with_head(head_problem(model))

    def with_head(self, problem: str | None) -> ModelFacts:
        return ModelFacts(self.layers, self.norm_statistics, problem)
