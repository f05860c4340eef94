"""One strategy class per method and Flower API, made from the method's declaration when
``strategies`` or ``strategies.message`` is imported: ``strategies.FedMCSA(sigma=..., lam=...,
**options)`` is the generic strategy (``LegacyMethodStrategy``, ``MethodStrategy``) running
``fedmcsa.FedMCSA(sigma=..., lam=...)``. Its signature (``inspect.signature``, ``help()``, the API
reference) and docstring list the method's hyperparameters, with their types, defaults, run-config
keys and allowed values, then the generic strategy's options (``OPTION_DOCS``) and the client contract.
"""

from __future__ import annotations

import inspect
from typing import Any, ClassVar

from flower_pfl.engine.params import annotation_text, param_specs
from flower_pfl.methods.base import Method
from flower_pfl.methods.registry import method_classes
from strategies.tracking import TRACKER_DIR_DOC, TRACKER_DOC

#: the options both APIs' generic strategies share, documented once (each adds its own in ``OPTION_DOCS``)
SHARED_OPTION_DOCS: dict[str, str] = {
    "seed": "Seed of the sampling generator (and of the method's own random initialisation).",
    "device": "Device of the per-client store and its aggregation (a global model is kept on the CPU).",
    "store_dir": "A folder for the per-client models on disk (memory-mapped; server memory then grows with the "
                 "round's participants, not the federation); None keeps them in memory.",
    "accuracy_key": "The clients' evaluation metric the personalized summary is made of (e.g. ``eval-acc``); "
                    "a fraction in [0, 1], a reply claiming more is left out.",
    "max_update_ratio": "Refuse an update whose model changed by more than this multiple of the norm of the model its "
                        "client was sent; ``math.inf``: off (see ``flower_pfl.engine.reply_checks.ReplyBounds``).",
    "max_median_ratio": "Refuse extras (e.g. SCAFFOLD's Δc_i) whose norm, or a change of a model sent as zeros, exceeds "
                        "this multiple of the round's median; ``math.inf``: off.",
    "lr": "The clients' learning rate, sent as ``lr`` with every training instruction unless the training config "
          "has it (client algorithms that correct gradients or report per-step quantities need it).",
    "local_steps": "The clients' local steps, sent as ``local-steps`` unless the training config has them.",
    "unseen_clients": "The rank (partition id) of each client that never trains: never sampled for training, it evaluates "
                      "what the method gives a new client (``ServerAlgorithm.new_client_instructions``), reported apart as "
                      "``unseen-accuracy-*``.",
    "new_client_finetune_steps": "Local SGD steps each client of ``unseen_clients`` takes on its training data before it "
                                 "evaluates (sent as ``finetune-steps``); 0: none.",
    "tracker": TRACKER_DOC,
    "tracker_dir": TRACKER_DIR_DOC,
}

class PerMethodDocs:
    """Mixed into a generic strategy: what its per-method classes document besides the method."""

    #: the method a per-method class runs (``None`` on the generic strategy)
    method_class: ClassVar[type[Method] | None] = None
    #: the generic strategy's options after the method, with a line of documentation each
    OPTION_DOCS: ClassVar[dict[str, str]] = {}
    #: what a client must do, for the docstring
    CONTRACT: ClassVar[str] = ""


def method_strategies(generic: type[Any], module: str) -> dict[str, type[Any]]:
    """Every method's class for the API of ``generic`` (a ``PerMethodDocs`` strategy taking
    ``(method, **options)``), by class name, as if defined in ``module``."""
    return {method.strategy: method_strategy(method, generic, module) for method in method_classes()}


def method_strategy(method: type[Method], generic: type[Any], module: str) -> type[Any]:
    """``generic`` running ``method``: the method's hyperparameters by keyword, then ``generic``'s options."""
    names = [s.name for s in param_specs(method)]

    def __init__(self: Any, **arguments: Any) -> None:
        own = {name: arguments.pop(name) for name in names if name in arguments}
        if method.default_clients_per_round is not None:
            arguments.setdefault("clients_per_round", method.default_clients_per_round)
        generic.__init__(self, method(**own), **arguments)

    cls = type(method.strategy, (generic,), {"__init__": __init__, "__module__": module, "__qualname__": method.strategy,
                                             "method_class": method})
    __init__.__qualname__, __init__.__module__ = f"{method.strategy}.__init__", module
    cls.__signature__ = method_signature(cls)  # type: ignore[attr-defined]  # help() and inspect read it
    cls.__doc__ = method_docstring(cls)
    return cls


def _options(cls: type) -> list[inspect.Parameter]:
    """The generic strategy's options (after ``self`` and ``method``), with the method's own default
    number of clients per round."""
    method = cls.method_class  # type: ignore[attr-defined]
    generic = next(base for base in cls.__mro__[1:] if base.__dict__.get("OPTION_DOCS"))
    return [p.replace(default=method.default_clients_per_round) if p.name == "clients_per_round" else p
            for p in list(inspect.signature(generic).parameters.values())[1:]]


def method_signature(cls: type) -> inspect.Signature:
    """``cls``'s constructor: the method's hyperparameters, then the generic strategy's options, all by keyword."""
    method = cls.method_class  # type: ignore[attr-defined]
    own = [inspect.Parameter(s.name, inspect.Parameter.KEYWORD_ONLY, default=s.default, annotation=annotation_text(method, s.name))
           for s in param_specs(method)]
    return inspect.Signature([*own, *(p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in _options(cls))])


def method_docstring(cls: type) -> str:
    """The docstring of ``cls``, a per-method class of a generic strategy (see the module docstring)."""
    method = cls.method_class  # type: ignore[attr-defined]
    lines = [inspect.getdoc(method) or method.__name__, "", "Parameters", "----------"]
    for s in param_specs(method):
        where = f"; run config ``{s.key}``" if s.key else ""
        allowed = f" Must be {s.must.text}." if s.must is not None else ""
        lines += [f"{s.name} : {annotation_text(method, s.name)} (default {s.default!r}{where})",
                  f"    {s.doc[0].upper() + s.doc[1:]}.{allowed}"]
    for p in _options(cls):
        lines += [f"{p.name} : {type_text(p.annotation)} (default {p.default!r})", f"    {cls.OPTION_DOCS.get(p.name, '')}"]  # type: ignore[attr-defined]
    lines += ["", cls.CONTRACT]  # type: ignore[attr-defined]
    return "\n".join(lines).rstrip() + "\n"


def type_text(annotation: Any) -> str:
    """An annotation as a reader writes it (``float``, ``str | None``)."""
    if isinstance(annotation, str):
        return annotation
    if isinstance(annotation, type):
        return annotation.__name__
    return str(annotation).replace("typing.", "").replace("collections.abc.", "")
