"""A griffe extension for the API reference (named in ``mkdocs.yml``): the per-method strategy classes of
``strategies`` and ``strategies.message`` get their docstrings and signatures when they are made
(``strategies.per_method``), so they are read at run time (``force_inspection``); this shows them as
``help()`` does: the class's own signature (every option spelled out, with its default) instead of
``__init__``'s ``**options``, and each parameter's run-config key in its description."""

from __future__ import annotations

import inspect
import re
from typing import Any

import griffe

_PARAM = re.compile(r"^(\w+) : (.+?) \(default (.+?)(?:; run config ``(.+?)``)?\)$")


def _docstring(text: str) -> str:
    """The per-method docstring with the parameter lines in numpy style and the closing paragraph
    (the client contract) moved before the parameters, where the numpy parser leaves it as text."""
    head, _, params = text.partition("\nParameters\n----------\n")
    body, _, tail = params.rpartition("\n\n")
    lines = []
    for line in body.split("\n"):
        m = _PARAM.match(line)
        if m:
            name, kind, _default, key = m.groups()  # the default is the signature's
            lines += [f"{name} : {kind}"] + ([f"    Run config ``{key}``."] if key else [])
        else:
            lines.append(line)
    return "\n".join([head.rstrip(), "", tail.strip(), "", "Parameters", "----------", *lines])


class PerMethodStrategies(griffe.Extension):
    def on_class_members(self, *, node: Any, cls: griffe.Class, agent: Any, **kwargs: Any) -> None:
        obj = getattr(node, "obj", None)
        if not (inspect.isclass(obj) and obj.__dict__.get("method_class") is not None and cls.docstring is not None):
            return
        cls.docstring.value = _docstring(inspect.getdoc(obj) or "")
        init = cls.members.get("__init__")
        if isinstance(init, griffe.Function):
            kinds = {inspect.Parameter.KEYWORD_ONLY: griffe.ParameterKind.keyword_only,
                     inspect.Parameter.POSITIONAL_OR_KEYWORD: griffe.ParameterKind.positional_or_keyword}
            params = [griffe.Parameter("self", kind=griffe.ParameterKind.positional_or_keyword)]
            for p in inspect.signature(obj).parameters.values():
                annotation = p.annotation if isinstance(p.annotation, str) else getattr(p.annotation, "__name__", str(p.annotation))
                params.append(griffe.Parameter(p.name, annotation=annotation, kind=kinds.get(p.kind, griffe.ParameterKind.keyword_only),
                                               default=None if p.default is inspect.Parameter.empty else repr(p.default)))
            init.parameters = griffe.Parameters(*params)
