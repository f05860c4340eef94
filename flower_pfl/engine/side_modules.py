"""Trainable modules beside the model, federated as one more flat vector: a method's extra networks
(FedCP's global head and policy network, GPFL's category embeddings and conditional valve) that its
clients train with the model and the server averages.

The modules are one ``nn.ModuleDict`` built by the method from the model's representation size ``d``
and class count ``C`` (the shape of the model's last linear layer, found on the server from the layout
and on the client from the model). They travel beside the model as float32 bytes
(``flower_pfl.engine.wire``): the server sends its vector in the instruction's config (``key``), an
honest client returns its trained one in the reply's extras (``reply_key``); the server checks it
(length, finite; ``AlgorithmOutputMissing`` when absent), bounds its change against the round's median
and sets the next vector to the participants' weighted mean (``WithSideModules`` does all of this for a
server algorithm). What a method keeps personal stays in its model's columns (a personal head in a
``SharedPart`` model store), beside which the shared side modules train.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import nn

from flower_pfl.engine.layout import ParamLayout, flatten_module, load_flat_
from flower_pfl.engine.model_split import head_module
from flower_pfl.engine.reply_checks import Reply, norm, received_vector
from flower_pfl.engine.server_algorithm import ServerAlgorithm
from flower_pfl.engine.wire import decode_flat, encode_vector

#: builds the side modules from the representation size ``d`` and the class count ``C``
Build = Callable[[int, int], nn.ModuleDict]


def head_shape(layout: ParamLayout) -> tuple[int, int]:
    """``(d, C)`` of a flat model: the representation size and class count, from its last weight matrix."""
    last = next((shape for shape in reversed(layout.shapes) if len(shape) == 2), None)
    if last is None:
        raise ValueError(f"side modules need a model whose last layer is linear (a weight matrix); shapes {list(layout.shapes)}")
    return last[1], last[0]


def built(build: Build, features: int, classes: int, seed: int | None = None) -> nn.ModuleDict:
    """``build(d, C)`` with its initialisation drawn from ``seed`` (``None``: a throwaway draw, for modules
    whose values are loaded next); the global random state is left as it was."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0 if seed is None else seed)
        return build(features, classes)


class SideModules:
    """The server's side of a method's side modules: their current flat vector and what it does with
    the replies' (see the module docstring). A ``state_attributes`` entry: ``get_state``/``set_state``."""

    def __init__(self, build: Build, key: str, reply_key: str, who: str) -> None:
        self.build, self.key, self.reply_key, self.who = build, key, reply_key, who
        self.vector = torch.zeros(0)

    def setup(self, layout: ParamLayout, seed: int) -> nn.ModuleDict:
        """The modules initialised from ``seed`` for the model of ``layout`` (returned, so that a method
        may set some of their values before ``take``); their vector becomes the current one."""
        modules = built(self.build, *head_shape(layout), seed)
        self.take(modules)
        return modules

    def take(self, modules: nn.Module) -> None:
        """Make ``modules``' values the current vector."""
        self.vector = flatten_module(modules)

    @property
    def dim(self) -> int:
        return int(self.vector.numel())

    def settings(self) -> dict[str, bytes]:
        """The instruction entry that carries the current vector to a client."""
        return {self.key: encode_vector(self.vector)}

    def check(self, extras: Mapping[str, Any]) -> torch.Tensor:
        """A reply's trained vector: float32 bytes of the current vector's length, all finite."""
        return received_vector(extras, self.reply_key, self.dim, f"{self.who}'s side modules", self.who)

    def example(self, generator: torch.Generator) -> dict[str, bytes]:
        """An honest client's reply entry, made up: the current vector slightly moved."""
        return {self.reply_key: encode_vector(self.vector + 0.01 * torch.randn(self.dim, generator=generator))}

    def change(self, vector: torch.Tensor) -> dict[str, tuple[float, float]]:
        """``ReplyBounds``' entry: the reply's change of the vector, bounded by the round's median change."""
        return {self.reply_key: (norm(vector - self.vector), 0.0)}

    def aggregate(self, vectors: Sequence[torch.Tensor], weights: Sequence[float]) -> None:
        """The next vector: the ``weights``-weighted mean of the participants' ``vectors``."""
        w = torch.tensor([float(x) for x in weights], dtype=torch.float32)
        self.vector = (w / w.sum()) @ torch.stack([v.to(torch.float32) for v in vectors])

    def get_state(self) -> torch.Tensor:
        return self.vector.clone()

    def set_state(self, state: torch.Tensor) -> None:
        self.vector = torch.as_tensor(state, dtype=torch.float32).clone()


def received_modules(build: Build, model: nn.Module, config: Mapping[str, Any], key: str, who: str) -> nn.ModuleDict:
    """The client's side modules for ``model`` (sized by its last ``nn.Linear``) with the values the
    instruction carries under ``key``, on the model's device."""
    if key not in config:
        raise ValueError(f"{who}'s client needs '{key}' in its instruction (the side modules the server sends)")
    head = head_module(model)
    modules = built(build, head.in_features, head.out_features)
    size = ParamLayout.from_module(modules).dim
    load_flat_(modules, decode_flat(config[key], size, key))
    return modules.to(device=head.weight.device, dtype=head.weight.dtype)


def reply_entry(modules: nn.Module, reply_key: str) -> dict[str, bytes]:
    """The reply entry carrying the client's trained side modules."""
    return {reply_key: encode_vector(flatten_module(modules))}


class WithSideModules(ServerAlgorithm):
    """A server algorithm whose clients train side modules too (first among its bases, before its model
    algorithm, e.g. ``SharedPart``): they are set up with the model, their vector goes into ``side_settings``
    (a method puts it in its train and evaluation configs), replies are refused without a valid one,
    ``aggregate`` averages them weighted by sample counts after the model's own aggregation, and the
    server's state holds them (``side``)."""

    def side_modules(self) -> SideModules:
        """The method's ``SideModules`` (made once, in ``setup``)."""
        raise NotImplementedError

    def setup(self, layout: ParamLayout, initial: torch.Tensor, device: torch.device, seed: int = 0) -> None:
        super().setup(layout, initial, device, seed)
        self.side = self.side_modules()
        self.side.take(self.initial_side_modules(self.side.setup(layout, seed), layout, initial))

    def initial_side_modules(self, modules: nn.ModuleDict, layout: ParamLayout, initial: torch.Tensor) -> nn.ModuleDict:
        """The side modules' starting values (``modules``: freshly initialised; changed in place or replaced)."""
        return modules

    def get_state(self) -> dict[str, Any]:
        return {**super().get_state(), "side": self.side.get_state()}

    def set_state(self, state: dict[str, Any]) -> None:
        state = dict(state)
        self.side.set_state(state.pop("side"))
        super().set_state(state)

    def side_settings(self) -> dict[str, bytes]:
        return self.side.settings()

    def check_extras(self, extras: Mapping[str, Any]) -> torch.Tensor:
        return self.side.check(extras)

    def example_extras(self, generator: torch.Generator) -> dict[str, bytes]:
        return self.side.example(generator)

    def update_norms(self, reply: Reply, sent: torch.Tensor) -> dict[str, tuple[float, float]]:
        return {**super().update_norms(reply, sent), **self.side.change(reply.extras)}

    def aggregate(self, server_round: int, replies: Sequence[Reply]) -> None:
        super().aggregate(server_round, replies)
        self.side.aggregate([r.extras for r in replies], [r.num_examples for r in replies])
