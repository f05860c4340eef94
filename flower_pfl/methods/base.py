"""What a method module declares, and the registry entries built from it.

A method is one class in one module of this package: a dataclass whose fields are its
hyperparameters (``flower_pfl.engine.params.param``), whose base is its server algorithm
(``PersonalizedAlgorithm`` or ``GlobalModelAlgorithm``) and whose class attributes name it::

    @dataclass
    class FedFoo(Method, PersonalizedAlgorithm):
        '''FedFoo (Someone et al.): one line on what it does.'''
        name = "fedfoo"                 # run-config ``method``
        strategy = "FedFoo"             # class in ``strategies`` and ``strategies.message``
        client = FedFooClient           # its client algorithm (``flower_pfl.engine.client_algorithm``)
        variants = (Variant("fedfoo-lite", fixed={"tau": 0.0}),)   # other run-config values it runs
        tau: float = param(1.0, key="fedfoo-tau", doc="...", must=POSITIVE)

        def personalize(self, models, layout): ...

The registry (``flower_pfl.methods.registry``) finds the class: the run config gains ``method =
"fedfoo"`` (and its variants) and ``fedfoo-tau``, both Flower APIs gain ``FedFoo`` with a typed,
documented constructor, and the package's ClientApp runs its client algorithm. Flower's own methods
are declared the same way, as ``FlowerMethod`` objects. What is derived as text (``pyproject.toml``'s
run-config keys) is checked by tests that say how to regenerate it (``docs/adding-a-method.md``).
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from flower_pfl.engine.model_facts import ModelFacts
from flower_pfl.engine.params import ParamSpec, check_params, param_specs
from flower_pfl.engine.server_algorithm import ServerAlgorithm


@dataclass(frozen=True)
class Variant:
    """Another run-config value a method's class runs: ``method = "<method>"`` (and ``aggregation``)
    with some constructor arguments ``fixed``, some read from other run-config keys (``keys``:
    argument -> key), and arguments that are methods built from their own keys (``uses``: argument ->
    method class, e.g. FedMCSA's ``client_method``)."""

    method: str
    aggregation: str = "default"
    fixed: Mapping[str, Any] = field(default_factory=dict)
    keys: Mapping[str, str] = field(default_factory=dict)
    uses: Mapping[str, type[Method]] = field(default_factory=dict)
    #: the line in the method tables (default: the method's summary)
    summary: str = ""


class Method(ServerAlgorithm):
    """Class-level facts of a method, first among its server algorithm's bases (``class FedFoo(Method, PersonalizedAlgorithm)``)."""

    #: run-config ``method`` value
    name: ClassVar[str]
    #: class name in ``strategies`` and ``strategies.message``
    strategy: ClassVar[str]
    #: other run-config values this class runs
    variants: ClassVar[tuple[Variant, ...]] = ()
    #: participants per round when a strategy is built without ``clients_per_round``
    #: (``None``: Flower's ``fraction_train``, all nodes by default)
    default_clients_per_round: ClassVar[int | None] = None
    #: README table: the method's group (papers this package implements, or baselines)
    group: ClassVar[str] = "baseline"
    #: it reads the model's head (``flower_pfl.engine.model_split``): the head's input as the representation,
    #: or the head module itself; a model without a usable head is refused (``check_model``)
    reads_head: ClassVar[bool] = False

    def __post_init__(self) -> None:
        check_params(self)

    @classmethod
    def check_run(cls, options: Mapping[str, Any]) -> tuple[str, str] | None:
        """A check across run-config keys (``options``: the whole run config): ``(key, what it must
        be)`` when the combination is invalid, else ``None``."""
        return None

    @classmethod
    def check_model(cls, facts: ModelFacts) -> str | None:
        """What the method needs that a model with ``facts`` lacks (``"a model with ..."``), or ``None``
        when it can run on it; checked before a run starts, and when a strategy first sees the model."""
        if cls.reads_head and facts.head_problem is not None:
            return f"a model with a head it can read ({facts.head_problem})"
        return None

    @classmethod
    def summary(cls) -> str:
        """The docstring's first paragraph, on one line."""
        return " ".join(inspect.getdoc(cls).split("\n\n")[0].split())  # type: ignore[union-attr]


@dataclass(frozen=True)
class FlowerMethod:
    """A method Flower ships (FedAvg, FedProx, FedAvgM, FedAdam): the package only maps run-config
    keys to its constructor (``strategies`` and ``strategies.message`` re-export Flower's class):
    each of ``params`` from its key, the general run-config keys of ``keys`` (argument -> key) and
    ``fixed`` values."""

    name: str
    strategy: str
    summary_text: str
    params: tuple[ParamSpec, ...] = ()
    fixed: Mapping[str, Any] = field(default_factory=dict)
    keys: Mapping[str, str] = field(default_factory=dict)
    variants: tuple[Variant, ...] = ()

    group: ClassVar[str] = "flower"

    def summary(self) -> str:
        return self.summary_text


Declaration = type[Method] | FlowerMethod


@dataclass(frozen=True)
class Entry:
    """One value of the run config's ``(method, aggregation)``: the declaration whose strategy runs it
    and how its constructor arguments come from the run config (``Variant``)."""

    method: str
    aggregation: str
    declaration: Any  #: the ``Method`` class or ``FlowerMethod`` behind it
    fixed: Mapping[str, Any] = field(default_factory=dict)
    keys: Mapping[str, str] = field(default_factory=dict)
    uses: Mapping[str, Any] = field(default_factory=dict)
    summary_text: str = ""

    @classmethod
    def of(cls, declaration: Declaration, variant: Variant | None = None) -> Entry:
        """The entry of ``declaration`` itself (``variant`` ``None``) or of one of its variants."""
        if variant is None:
            own = declaration if isinstance(declaration, FlowerMethod) else None
            return cls(declaration.name, "default", declaration, dict(own.fixed) if own else {}, dict(own.keys) if own else {})
        return cls(variant.method, variant.aggregation, declaration, variant.fixed, variant.keys, variant.uses, variant.summary)

    @property
    def label(self) -> str:
        """``fedavg``, or ``fedavg+mcsa`` for a non-default aggregation (the results folder's prefix)."""
        return self.method if self.aggregation == "default" else f"{self.method}+{self.aggregation}"

    @property
    def strategy(self) -> str:
        return self.declaration.strategy

    @property
    def builtin(self) -> bool:
        """Run by Flower's own strategy class."""
        return isinstance(self.declaration, FlowerMethod)

    def params(self) -> list[ParamSpec]:
        decl = self.declaration
        return list(decl.params) if isinstance(decl, FlowerMethod) else param_specs(decl)

    def _read(self) -> list[ParamSpec]:
        """The declared parameters this entry reads from their own run-config keys."""
        return [s for s in self.params() if s.key is not None and s.name not in {*self.fixed, *self.keys, *self.uses}]

    def run_config_keys(self) -> tuple[str, ...]:
        """The run-config keys this entry's strategy reads (its own hyperparameters and those of the
        methods it uses)."""
        used = [key for m in self.uses.values() for key in Entry.of(m).run_config_keys()]
        return tuple(dict.fromkeys([*(s.key for s in self._read() if s.key), *self.keys.values(), *used]))

    def arguments(self, options: Mapping[str, Any]) -> dict[str, Any]:
        """The strategy's method arguments for the run config ``options`` (kebab-case keys)."""
        out = {s.name: options[s.key] for s in self._read() if s.key is not None and s.key in options}
        out.update({name: options[key] for name, key in self.keys.items() if key in options})
        out.update({name: m(**Entry.of(m).arguments(options)) for name, m in self.uses.items()})
        return {**out, **self.fixed}

    def summary(self) -> str:
        return self.summary_text or self.declaration.summary()

    def check_model(self, facts: ModelFacts) -> str | None:
        """What this entry's method needs that a model with ``facts`` lacks (``None``: nothing; Flower's
        own methods run on any model)."""
        return None if self.builtin else self.declaration.check_model(facts)


def one_layer_refusal(facts: ModelFacts, needs: str, otherwise: str) -> str | None:
    """``check_model``'s refusal of a one-layer model (``mlr``) by a method that splits the model in parts:
    ``"<needs> (this one has one layer: <otherwise>)"``, else ``None``."""
    if facts.layers < 2:
        return f"{needs} (this one has one layer: {otherwise})"
    return None
