"""What a model family module declares.

A model family is one class in one module of ``flower_pfl.experiment.models``: a dataclass whose fields
are its run-config keys (``flower_pfl.engine.params.param``, each key starting with the family's name),
whose class attributes say which ``model`` values it builds and what input they take, and whose
``build`` makes one::

    @dataclass
    class ResNets(ModelFamily):
        '''ResNet-18 and -34 (He et al. 2016), torchvision's blocks ...'''
        models = {"resnet18": "ResNet-18 ...", "resnet34": "ResNet-34 ..."}
        takes = ("image",)
        norm: str = param("batch", key="resnet-norm", must=one_of("batch", "group"), doc="...")

        def build(self, name, data, settings): ...

``flower_pfl.experiment.models.registry`` finds it: the run config gains the ``model`` values and the
keys. Every model a family builds says where its head begins: its class attribute ``head_name`` names
the ``nn.Linear`` whose input is the model's representation (``flower_pfl.engine.model_split``), and
that head's tensors come last in its ``state_dict``.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

from torch import nn

from flower_pfl.engine.params import check_params
from flower_pfl.experiment.data.info import DataInfo


@dataclass(frozen=True)
class ModelSettings:
    """The run-config keys every family of the package reads: ``model-width`` (a multiplier of its
    channels and units) and ``dropout`` (where its architecture has dropout)."""

    width: float = 1.0
    dropout: float = 0.0


def scaled(units: int, width: float, multiple: int = 1) -> int:
    """``units × width``, rounded to a multiple of ``multiple`` (at least one multiple)."""
    return max(multiple, multiple * round(units * width / multiple))


@dataclass
class ModelFamily:
    """Class-level facts of a model family, and how it builds a model."""

    #: the run config's ``model`` values it builds, each with its line in the model table
    models: ClassVar[Mapping[str, str]]
    #: the kinds of input its models take (``flower_pfl.experiment.data.info.KINDS``)
    takes: ClassVar[tuple[str, ...]]

    def __post_init__(self) -> None:
        check_params(self)

    def build(self, name: str, data: DataInfo, settings: ModelSettings) -> nn.Module:
        """Model ``name`` for samples described by ``data`` (its initialization draws from torch's global
        random state, which the caller seeds)."""
        raise NotImplementedError

    @classmethod
    def summary(cls) -> str:
        """The docstring's first paragraph, on one line."""
        return " ".join(inspect.getdoc(cls).split("\n\n")[0].split())  # type: ignore[union-attr]


def shape_error(name: str, data: DataInfo, needs: str) -> ValueError:
    """The error of a model that cannot take this data's samples."""
    return ValueError(f"model {name!r} needs {needs}; the data's samples have shape {data.input_shape}")
