"""Strategy classes made from the method declarations, the same way for both Flower APIs.

For every method class in ``flower_pfl.methods`` (see its ``registry``), ``strategy_class``
makes a subclass of an API's generic strategy whose constructor takes the method's
hyperparameters as typed keyword arguments, with their declared defaults, followed by the
API's own options, and whose docstring documents every argument. ``strategies`` and
``strategies.message`` export these classes under the methods' names, so the two twins come
from one definition and cannot drift.
"""

from __future__ import annotations

import functools
import inspect
import typing
from pathlib import Path
from typing import Any

from flower_pfl.methods.base import Method
from flower_pfl.params import param_specs


def _annotations(cls: type) -> dict[str, Any]:
    try:
        return typing.get_type_hints(cls)
    except Exception:  # an annotation that cannot be evaluated here: keep its text
        return {k: v for c in reversed(cls.__mro__) for k, v in getattr(c, "__annotations__", {}).items()}


def _default_text(value: Any) -> str:
    return repr(value)


def strategy_class(method: type[Method], base: type, module: str) -> type:
    """``base`` (an API's generic strategy, constructed as ``base(method_instance, **options)``)
    specialised to ``method``: ``NewClass(**hyperparameters, **options)``."""
    specs = param_specs(method)
    hints = _annotations(method)
    option_params = list(inspect.signature(base.__init__).parameters.values())[2:]  # after self, method
    option_params = [p.replace(default=method.default_clients_per_round) if p.name == "clients_per_round" else p
                     for p in option_params]
    signature = inspect.Signature([
        inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD),
        *(inspect.Parameter(s.name, inspect.Parameter.KEYWORD_ONLY, default=s.default, annotation=hints.get(s.name, s.type))
          for s in specs),
        *option_params,
    ])
    names = {s.name for s in specs}

    def __init__(self: Any, **kwargs: Any) -> None:
        bound = signature.bind(self, **kwargs)  # a clear TypeError for unknown or misspelled arguments
        bound.apply_defaults()
        values = dict(bound.arguments)
        values.pop("self")
        base.__init__(self, method(**{k: values.pop(k) for k in list(values) if k in names}), **values)

    __init__.__signature__ = signature  # type: ignore[attr-defined]
    lines = [inspect.getdoc(method) or method.__name__, "", "Parameters", "----------"]
    for s in specs:
        where = f"; run config ``{s.key}``" if s.key else ""
        allowed = f" Must be {s.must.text}." if s.must is not None else ""
        lines += [f"{s.name} : {_type_text(hints.get(s.name, s.type))} (default {_default_text(s.default)}{where})",
                  f"    {s.doc[0].upper() + s.doc[1:]}.{allowed}"]
    for p in option_params:
        doc = base.OPTION_DOCS.get(p.name, "")
        lines += [f"{p.name} : {_type_text(p.annotation)} (default {_default_text(p.default)})", f"    {doc}"]
    lines += ["", getattr(base, "CONTRACT", "")]
    return type(method.strategy, (base,), {
        "__init__": __init__, "__doc__": "\n".join(lines).rstrip() + "\n", "__module__": module,
        "__qualname__": method.strategy, "method_class": method,
    })


def _type_text(annotation: Any) -> str:
    if isinstance(annotation, str):
        return annotation
    if isinstance(annotation, type):
        return annotation.__name__
    return str(annotation).replace("typing.", "")


@functools.cache
def strategy_classes(base: type, module: str) -> dict[str, type]:
    """Every method's strategy class for ``base``'s API, by class name (made once)."""
    from flower_pfl.methods.registry import method_classes

    return {cls.strategy: strategy_class(cls, base, module) for cls in method_classes()}


def stub(base: type, module: str, header: str) -> str:
    """The ``.pyi`` text that shows editors and type checkers every class made for ``module``, with
    its typed constructor and docstring (``python -m strategies.declared`` writes both stubs)."""
    lines = [header.rstrip(), ""]
    for name, cls in strategy_classes(base, module).items():
        params = [f"{p.name}: {_source_type(cls.method_class, p)} = {p.default!r}"
                  for p in inspect.signature(cls).parameters.values()]
        doc = cls.__doc__.rstrip().replace('"""', "'''").replace("\n", "\n    ")
        lines += ["", f"class {name}({base.__name__}):", f'    r"""{doc}\n    """',
                  f"    method_class: type[_{cls.method_class.__name__}]",
                  "    def __init__(self, *, " + ", ".join(params) + ") -> None: ...", ""]
    return "\n".join(line.rstrip() for line in "\n".join(lines).splitlines()) + "\n"


def _source_type(method: type, parameter: inspect.Parameter) -> str:
    """An annotation as source text (the declaring class's own text when it has one)."""
    for klass in method.__mro__:
        text = getattr(klass, "__annotations__", {}).get(parameter.name)
        if isinstance(text, str):
            return text
    annotation = parameter.annotation
    return annotation if isinstance(annotation, str) else _type_text(annotation)


_HEADER = '''"""Generated by ``python -m strategies.declared`` from the method declarations; do not edit."""

from typing import Any, Mapping

import torch
{flower}

{methods}
{local}
PersonalizedStrategy = {base}
GlobalModelStrategy = {base}
'''


def stubs() -> dict[Path, str]:
    """Both APIs' stub files and their text."""
    from flower_pfl.methods.registry import method_classes

    from .legacy import LegacyMethodStrategy
    from .message.method_strategy import MethodStrategy

    methods = "\n".join(f"from {c.__module__} import {c.__name__} as _{c.__name__}" for c in method_classes())
    flower = "{0} as {0}".format
    here = Path(__file__).parent
    legacy = _HEADER.format(
        flower="from flwr.common import Parameters\nfrom flwr.server.strategy import " + ", ".join(
            flower(n) for n in ("FedAdam", "FedAvg", "FedAvgM", "FedProx")),
        methods=methods + "\nfrom flower_pfl.server_step import UpdateRejected as UpdateRejected",
        local="\nfrom .legacy import ConfigFn, EvaluateFn, LegacyMethodStrategy as LegacyMethodStrategy, MetricsFn\n",
        base="LegacyMethodStrategy")
    message = _HEADER.format(
        flower="from flwr.serverapp.strategy import " + ", ".join(
            flower(n) for n in ("FedAdam", "FedAvg", "FedAvgM", "FedProx")),
        methods=methods, local="\nfrom .method_strategy import MethodStrategy as MethodStrategy, MetricsFn\n",
        base="MethodStrategy")
    return {here / "__init__.pyi": stub(LegacyMethodStrategy, "strategies", legacy),
            here / "message" / "__init__.pyi": stub(MethodStrategy, "strategies.message", message)}


if __name__ == "__main__":
    for path, text in stubs().items():
        path.write_text(text)
        print(f"wrote {path}")
