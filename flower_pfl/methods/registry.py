"""The methods of this package, found by looking: every ``Method`` class and every ``FlowerMethod``
in a module of ``flower_pfl.methods``, each with its variants. The run config, the strategy
factory, both Flower APIs' strategy classes, the ClientApp's lookup of client algorithms, the method
tables and the tests read this; none lists method names by hand."""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Mapping
from functools import lru_cache
from importlib import metadata
from typing import Any

from flower_pfl.engine.client_algorithm import CLIENT_ALGORITHM, ClientAlgorithm, Proximal, proximal_mu
from flower_pfl.engine.discovery import declared_classes
from flower_pfl.engine.params import ParamSpec
from flower_pfl.methods.base import Declaration, Entry, FlowerMethod, Method

_GROUPS = ("paper", "baseline", "flower")


_PACKAGE, _NOT_METHODS = "flower_pfl.methods", ("base", "registry")


@lru_cache(maxsize=1)
def method_classes() -> tuple[type[Method], ...]:
    """Every method class (one per strategy class of this package), papers first."""
    found = [cls for cls in declared_classes(_PACKAGE, Method, _NOT_METHODS) if "name" in vars(cls)]
    return tuple(sorted(found, key=lambda c: (_GROUPS.index(c.group), c.name)))


@lru_cache(maxsize=1)
def flower_methods() -> tuple[FlowerMethod, ...]:
    """Every method Flower ships that the run config maps to."""
    package = importlib.import_module(_PACKAGE)
    modules = [importlib.import_module(f"{_PACKAGE}.{info.name}") for info in pkgutil.iter_modules(package.__path__)
               if info.name not in _NOT_METHODS]
    found = {id(obj): obj for module in modules for obj in vars(module).values() if isinstance(obj, FlowerMethod)}
    return tuple(sorted(found.values(), key=lambda m: m.name))


@lru_cache(maxsize=1)
def entries() -> tuple[Entry, ...]:
    """Every ``(method, aggregation)`` the run config accepts, papers first."""
    declarations: list[Declaration] = [*method_classes(), *flower_methods()]
    out = [entry for d in declarations for entry in (Entry.of(d), *(Entry.of(d, v) for v in d.variants))]
    seen: set[tuple[str, str]] = set()
    for e in out:
        if (e.method, e.aggregation) in seen:
            raise RuntimeError(f"method {e.label} is declared twice")
        seen.add((e.method, e.aggregation))
    order = {id(d): i for i, d in enumerate(declarations)}
    return tuple(sorted(out, key=lambda e: (_GROUPS.index(e.declaration.group), e.aggregation != "default",
                                            order[id(e.declaration)], e.method)))


def methods() -> tuple[str, ...]:
    """The run config's ``method`` values."""
    return tuple(dict.fromkeys(e.method for e in entries()))


def aggregations() -> tuple[str, ...]:
    return tuple(dict.fromkeys(["default", *(e.aggregation for e in entries())]))


def entry(method: str, aggregation: str = "default") -> Entry:
    for e in entries():
        if (e.method, e.aggregation) == (method, aggregation):
            return e
    raise KeyError(f"no method {method!r} with aggregation {aggregation!r}")


@lru_cache(maxsize=1)
def option_specs() -> dict[str, ParamSpec]:
    """Every method hyperparameter the run config carries, by run-config key. Methods that share a
    key (``all-clients-train``, ``fedamp-lambda``) must agree on its default and type."""
    out: dict[str, ParamSpec] = {}
    for e in entries():
        for spec in e.params():
            if spec.key is None:
                continue
            known = out.setdefault(spec.key, spec)
            if (known.default, known.type) != (spec.default, spec.type):
                raise RuntimeError(f"run-config key '{spec.key}' is declared with two defaults or types "
                                   f"({known.default!r}, {spec.default!r})")
    return out


@lru_cache(maxsize=1)
def renamed_keys() -> dict[str, str]:
    """Earlier names of method run-config keys -> their current names (``param(..., old_keys=...)``)."""
    return {old: key for key, spec in option_specs().items() for old in spec.old_keys}


@lru_cache(maxsize=1)
def client_algorithms() -> dict[str, type[ClientAlgorithm]]:
    """Every client algorithm an instruction can name, by name: each method's and the ones it refines
    (plain SGD, the proximal term Flower's FedProx asks for)."""
    out: dict[str, type[ClientAlgorithm]] = {}
    declared: list[type[ClientAlgorithm]] = [ClientAlgorithm, Proximal, *(cls.client for cls in method_classes())]
    for root in declared:
        for algorithm in root.__mro__:
            if not (isinstance(algorithm, type) and issubclass(algorithm, ClientAlgorithm)):
                continue
            if "name" not in vars(algorithm):
                raise RuntimeError(f"client algorithm {algorithm.__name__} declares no name")
            if out.setdefault(algorithm.name, algorithm) is not algorithm:
                raise RuntimeError(f"client algorithms {out[algorithm.name].__name__} and {algorithm.__name__} are both "
                                   f"named {algorithm.name!r}")
    return out


class UnknownClientAlgorithm(ValueError):
    """An instruction names a client algorithm this installation does not have."""


def client_algorithm_for(config: Mapping[str, Any]) -> type[ClientAlgorithm]:
    """The client algorithm an instruction names (``CLIENT_ALGORITHM``). An instruction that names none
    comes from a strategy that knows nothing of this package: Flower's FedProx asks for the proximal
    term by its own key (``proximal-mu``), any other for plain local SGD."""
    name = config.get(CLIENT_ALGORITHM)
    if name is None:
        return Proximal if proximal_mu(config) > 0 else ClientAlgorithm
    known = client_algorithms()
    if name not in known:
        raise UnknownClientAlgorithm(
            f"the server's method ({name!r}) asks this client to run its client algorithm {name!r}, which flower-pfl "
            f"{_version()} here does not have (it has {', '.join(sorted(known))}): install the flower-pfl release the "
            "server runs on this node, or run a method this release has (python -m flower_pfl methods)")
    return known[name]


def _version() -> str:
    try:
        return metadata.version("flower-pfl")
    except metadata.PackageNotFoundError:  # run from a checkout that was not installed
        return "(not installed)"


def method_table() -> str:
    """The README's method table: every run-config method, its strategy class and hyperparameters."""
    rows = ["| run config | strategy class | method | hyperparameters (run-config key = default) |", "|---|---|---|---|"]
    for e in entries():
        config = f"`method = \"{e.method}\"`" + (f", `aggregation = \"{e.aggregation}\"`" if e.aggregation != "default" else "")
        specs = option_specs()
        keys = ", ".join(f"`{key} = {toml_value(specs[key].default)}`" for key in e.run_config_keys() if key in specs) or "none"
        if e.fixed:
            keys += " (" + ", ".join(f"{k} = {v!r}" for k, v in e.fixed.items()) + ")"
        rows.append(f"| {config} | `{e.strategy}` | {e.summary().split(':')[0]} | {keys} |")
    return "\n".join(rows)


#: the marks around the method keys in ``pyproject.toml``'s ``[tool.flwr.app.config]`` (``run_config_block``)
BLOCK_START = "# --- every method's hyperparameters, from the methods' declarations (python -m tests.regenerate; do not edit)"
BLOCK_END = "# --- end of the methods' hyperparameters"


def run_config_block() -> str:
    """The method keys of ``pyproject.toml``'s ``[tool.flwr.app.config]`` (Flower reads the defaults, and
    accepts only the keys, listed there), each with its declared documentation, then the earlier names
    of renamed keys, not set."""
    users: dict[str, list[str]] = {}
    for e in entries():
        for key in e.run_config_keys():
            users.setdefault(key, []).append(e.label)
    lines = [BLOCK_START]
    for key, spec in option_specs().items():
        assignment = f"{key} = {toml_value(spec.default)}"
        lines.append(f"{assignment:<29} # {', '.join(users.get(key, []))}: {spec.doc}")
    lines.append('# earlier names of method keys, still read (with a warning) when set; "" = not set')
    lines += [f"{old + ' = ' + toml_value(''):<29} # now {new}" for old, new in renamed_keys().items()]
    return "\n".join([*lines, BLOCK_END])


def with_run_config_block(pyproject: str) -> str:
    """``pyproject.toml``'s text with its method keys replaced by ``run_config_block``."""
    head, start, rest = pyproject.partition(BLOCK_START)
    _, end, tail = rest.partition(BLOCK_END)
    if not (start and end):
        raise ValueError(f"pyproject.toml lacks the marks {BLOCK_START!r} ... {BLOCK_END!r}")
    return head + run_config_block() + tail


def toml_value(value: Any) -> str:
    """A run-config value as TOML writes it."""
    return str(value).lower() if isinstance(value, bool) else f'"{value}"' if isinstance(value, str) else str(value)


if __name__ == "__main__":
    print(method_table())
