"""Method parameters declared once: default, run-config key, documentation and allowed values.

A method declares each hyperparameter as a dataclass field made by ``param``::

    sigma: float = param(50.0, key="fedmcsa-sigma", doc="attention scale σ", must=POSITIVE, old_keys=("sigma",))

The run config (``flower_pfl.experiment.config``), the strategies' constructor signatures and
docstrings (``strategies``, ``strategies.message``), the README's method table and the method pages of the
documentation (``docs/hooks.py``) all
read these declarations; ``check_params`` validates an instance against them.
"""

from __future__ import annotations

import dataclasses
import numbers
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

_SPEC = "flower_pfl.param"


@dataclass(frozen=True)
class Rule:
    """An allowed-values rule: ``test(value)`` and how to say it (``"a number > 0"``)."""

    test: Callable[[Any], bool]
    text: str

    def __call__(self, value: Any) -> bool:
        try:
            return bool(self.test(value))
        except TypeError:
            return False


POSITIVE = Rule(lambda v: v > 0, "a number > 0")
NON_NEGATIVE = Rule(lambda v: v >= 0, "a number >= 0")
AT_LEAST_ONE = Rule(lambda v: isinstance(v, numbers.Integral) and not isinstance(v, bool) and int(v) >= 1, "an integer >= 1")
NON_NEGATIVE_INT = Rule(lambda v: isinstance(v, numbers.Integral) and not isinstance(v, bool) and int(v) >= 0, "an integer >= 0")
UNIT_INTERVAL = Rule(lambda v: 0 <= v <= 1, "a number in [0, 1]")
HALF_OPEN_UNIT = Rule(lambda v: 0 <= v < 1, "a number in [0, 1)")
#: a percent (FedALA's ``s``): other libraries write some of these as fractions, so a value in (0, 1] is
#: allowed but said (``flower_pfl.experiment.config``)
PERCENT = Rule(lambda v: 0 < v <= 100, "a number in (0, 100]")


def one_of(*choices: Any) -> Rule:
    return Rule(lambda v: v in choices, "one of " + ", ".join(str(c) for c in choices))


def comma_list(value: str) -> list[str]:
    """A run-config value ``"a, b,c"`` as ``["a", "b", "c"]``."""
    return [d.strip() for d in value.split(",") if d.strip()]


def some_of(choices: Iterable[str], what: str) -> Rule:
    """A comma-separated list (``comma_list``) of one or more distinct ``what`` among ``choices``."""
    options = tuple(choices)
    return Rule(lambda v: isinstance(v, str) and bool(comma_list(v)) and set(comma_list(v)) <= set(options)
                and len(set(comma_list(v))) == len(comma_list(v)),
                f"a comma-separated list of distinct {what} among {', '.join(options)}")


@dataclass(frozen=True)
class ParamSpec:
    """What a method says about one of its hyperparameters."""

    name: str                #: the constructor argument (``sigma``)
    key: str | None          #: the run-config key (``heurfedamp-sigma``); ``None``: not in the run config
    default: Any
    type: type
    doc: str
    must: Rule | None
    #: earlier names of ``key``, still read from a run config with a deprecation warning
    old_keys: tuple[str, ...] = ()

    def check(self, value: Any) -> str | None:
        """``None`` when ``value`` is allowed, else what it must be."""
        if self.must is not None and not self.must(value):
            return self.must.text
        return None


def param(default: Any, *, doc: str, key: str | None = None, must: Rule | None = None, old_keys: tuple[str, ...] = ()) -> Any:
    """A method hyperparameter (a dataclass field); ``key`` exposes it in the run config (prefixed
    by the method, ``fedmcsa-sigma``), ``old_keys`` are names it had before."""
    return field(default=default, metadata={_SPEC: (key, doc, must, old_keys)})


def param_specs(cls: type) -> list[ParamSpec]:
    """The declared hyperparameters of a method class, in declaration order."""
    out = []
    for f in dataclasses.fields(cls):
        if _SPEC in f.metadata and f.init:
            key, doc, must, old_keys = f.metadata[_SPEC]
            default = f.default if f.default_factory is dataclasses.MISSING else f.default_factory()
            kind = type(default) if default is not None else object
            out.append(ParamSpec(f.name, key, default, kind, doc, must, old_keys))
    return out


def annotation_text(cls: type, name: str) -> str:
    """The annotation of ``cls``'s field ``name`` as written in its source (``"float"``, ``"str | None"``)."""
    for klass in cls.__mro__:
        text = vars(klass).get("__annotations__", {}).get(name)
        if text is not None:
            return text if isinstance(text, str) else getattr(text, "__name__", str(text))
    raise KeyError(f"{cls.__name__} has no field {name!r}")


def iter_values(obj: Any) -> Iterator[tuple[ParamSpec, Any]]:
    for spec in param_specs(type(obj)):
        yield spec, getattr(obj, spec.name)


def check_params(obj: Any) -> None:
    """Raise ``ValueError`` naming the first hyperparameter of ``obj`` whose value is not allowed."""
    for spec, value in iter_values(obj):
        if (must := spec.check(value)) is not None:
            raise ValueError(f"{type(obj).__name__}: {spec.name} = {value!r} is invalid: must be {must}")
