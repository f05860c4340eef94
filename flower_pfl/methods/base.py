"""What a method module declares, and the registry entries built from it.

A method is one class in one module of this package: a dataclass whose fields are its
hyperparameters (``flower_pfl.engine.params.param``), whose base is its server algorithm
(``PersonalizedAlgorithm`` or ``GlobalModelAlgorithm``) and whose class attributes name it::

    @dataclass
    class FedFoo(Method, PersonalizedAlgorithm):
        '''FedFoo (Someone et al.): one line on what it does.'''
        name = "fedfoo"                 # run-config ``method``
        strategy = "FedFoo"             # class in ``strategies`` and ``strategies.message``
        client = Proximal               # its client algorithm (``flower_pfl.engine.client_algorithm``)
        tau: float = param(1.0, key="fedfoo-tau", doc="...", must=POSITIVE)

        def personalize(self, models, layout): ...

The registry (``flower_pfl.methods.registry``) finds the class: the run config gains
``fedfoo-tau``, both Flower APIs gain ``FedFoo`` with a typed, documented constructor, and the
package's ClientApp runs its client algorithm. What is derived as text (``pyproject.toml``'s defaults,
the editors' stubs, the README's table) is checked by tests that say how to regenerate it (see
``docs/adding-a-method.md``).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from flower_pfl.engine.params import ParamSpec, check_params, param_specs
from flower_pfl.engine.server_algorithm import ServerAlgorithm


class Method(ServerAlgorithm):
    """Class-level facts of a method, first among its server algorithm's bases (``class FedFoo(Method, PersonalizedAlgorithm)``)."""

    #: run-config ``method`` value
    name: ClassVar[str]
    #: class name in ``strategies`` and ``strategies.message``
    strategy: ClassVar[str]
    #: other run-config ``method`` values this class runs, with the constructor arguments they fix
    variants: ClassVar[Mapping[str, Mapping[str, Any]]] = {}
    #: participants per round when a strategy is built without ``clients_per_round``
    #: (``None``: Flower's ``fraction_train``, all nodes by default)
    default_clients_per_round: ClassVar[int | None] = None
    #: README table: the method's group (papers this package implements, or baselines)
    group: ClassVar[str] = "baseline"

    def __post_init__(self) -> None:
        check_params(self)

    @classmethod
    def check_run(cls, options: Mapping[str, Any]) -> tuple[str, str] | None:
        """A check across run-config keys (``options``: the whole run config): ``(key, what it must
        be)`` when the combination is invalid, else ``None``."""
        return None

    @classmethod
    def summary(cls) -> str:
        """The docstring's first paragraph, on one line."""
        return " ".join(inspect.getdoc(cls).split("\n\n")[0].split())  # type: ignore[union-attr]


@dataclass(frozen=True)
class FlowerMethod:
    """A method Flower ships (FedAvg, FedProx, FedAvgM, FedAdam): the package only maps run-config
    keys to its constructor (``strategies`` and ``strategies.message`` re-export Flower's class)."""

    name: str
    strategy: str
    summary_text: str
    params: tuple[ParamSpec, ...] = ()
    #: constructor arguments from the run config (kebab-case keys)
    arguments: Callable[[Mapping[str, Any]], dict[str, Any]] = lambda options: {}

    group: ClassVar[str] = "flower"

    def summary(self) -> str:
        return self.summary_text


@dataclass(frozen=True)
class Entry:
    """One value of the run config's ``(method, aggregation)``: which strategy runs it, and how its
    constructor arguments come from the run config."""

    method: str
    aggregation: str
    declaration: Any  #: the ``Method`` class or ``FlowerMethod`` behind it
    fixed: Mapping[str, Any] = field(default_factory=dict)
    #: custom mapping from the run config to constructor arguments (default: every declared
    #: parameter from its run-config key, then ``fixed``)
    custom: Callable[[Mapping[str, Any]], dict[str, Any]] | None = None
    summary_text: str = ""
    #: the run-config keys ``custom`` reads (for the README table; default: the declared parameters')
    reads: tuple[str, ...] = ()

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

    def run_config_keys(self) -> tuple[str, ...]:
        """The run-config keys this entry's strategy reads (its own hyperparameters)."""
        return self.reads or tuple(s.key for s in self.params() if s.key is not None and s.name not in self.fixed)

    def arguments(self, options: Mapping[str, Any]) -> dict[str, Any]:
        """The strategy's method arguments for the run config ``options`` (kebab-case keys)."""
        if self.custom is not None:
            return self.custom(options)
        if isinstance(self.declaration, FlowerMethod):
            return {**self.declaration.arguments(options), **self.fixed}
        return {**{s.name: options[s.key] for s in self.params() if s.key is not None and s.key in options}, **self.fixed}

    def summary(self) -> str:
        return self.summary_text or self.declaration.summary()


def one_layer_refusal(options: Mapping[str, Any], needs: str, otherwise: str) -> tuple[str, str] | None:
    """``check_run``'s refusal of a one-layer model (``mlr``) by a method that splits the model in parts:
    ``("model", "<needs> (mlr has one layer: <otherwise>)")``, else ``None``."""
    if options["model"] == "mlr":
        return "model", f"{needs} (mlr has one layer: {otherwise})"
    return None
