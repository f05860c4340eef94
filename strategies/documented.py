"""What both APIs' generic strategies share with the per-method classes made from them: each
method's class names its method (``method_class``) and gets a docstring made from the method's
declaration (its docstring, every hyperparameter with its type, default, run-config key and
allowed values) and the generic strategy's options (``OPTION_DOCS``) and client contract."""

from __future__ import annotations

import inspect
from typing import Any, ClassVar

from flower_pfl.engine.params import annotation_text, param_specs
from flower_pfl.methods.base import Method


class PerMethodDocs:
    """Mixed into a generic strategy: a subclass that sets ``method_class`` is documented by it."""

    #: the method a per-method class runs (``None`` on the generic strategy)
    method_class: ClassVar[type[Method] | None] = None
    #: the generic strategy's options after the method, with a line of documentation each
    OPTION_DOCS: ClassVar[dict[str, str]] = {}
    #: what a client must do, for the docstring
    CONTRACT: ClassVar[str] = ""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.__dict__.get("method_class") is not None:
            cls.__doc__ = method_docstring(cls)
            cls.__signature__ = method_signature(cls)  # type: ignore[attr-defined]  # help() and inspect read it


def _options(cls: type[PerMethodDocs]) -> list[inspect.Parameter]:
    """The generic strategy's options (after ``self`` and ``method``), with the method's own default
    number of clients per round."""
    method = cls.method_class
    assert method is not None
    generic = next(base for base in cls.__mro__[1:] if base.__dict__.get("OPTION_DOCS"))
    return [p.replace(default=method.default_clients_per_round) if p.name == "clients_per_round" else p
            for p in list(inspect.signature(generic).parameters.values())[1:]]


def method_signature(cls: type[PerMethodDocs]) -> inspect.Signature:
    """``cls``'s constructor with ``**options`` spelled out: the method's hyperparameters, then the options."""
    own = [p for p in inspect.signature(cls.__init__).parameters.values()
           if p.name != "self" and p.kind is not inspect.Parameter.VAR_KEYWORD]
    return inspect.Signature([*own, *(p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in _options(cls))])


def method_docstring(cls: type[PerMethodDocs]) -> str:
    """The docstring of ``cls``, a per-method class of a generic strategy (see the module docstring)."""
    method = cls.method_class
    assert method is not None
    lines = [inspect.getdoc(method) or method.__name__, "", "Parameters", "----------"]
    for s in param_specs(method):
        where = f"; run config ``{s.key}``" if s.key else ""
        allowed = f" Must be {s.must.text}." if s.must is not None else ""
        lines += [f"{s.name} : {annotation_text(method, s.name)} (default {s.default!r}{where})",
                  f"    {s.doc[0].upper() + s.doc[1:]}.{allowed}"]
    for p in _options(cls):
        lines += [f"{p.name} : {type_text(p.annotation)} (default {p.default!r})", f"    {cls.OPTION_DOCS.get(p.name, '')}"]
    lines += ["", cls.CONTRACT]
    return "\n".join(lines).rstrip() + "\n"


def type_text(annotation: Any) -> str:
    """An annotation as a reader writes it (``float``, ``str | None``)."""
    if isinstance(annotation, str):
        return annotation
    if isinstance(annotation, type):
        return annotation.__name__
    return str(annotation).replace("typing.", "").replace("collections.abc.", "")
