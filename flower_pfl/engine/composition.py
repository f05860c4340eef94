"""Which of the mechanisms Flower puts around a strategy a method's server composes with, read from its
declaration (``ServerAlgorithm.has_global_model``, ``ServerAlgorithm.aggregate_only``), and what is said
when it does not (docs/privacy.md):

- central differential privacy (Flower's ``DifferentialPrivacy*Clipping`` wrappers): each reply's model
  is clipped against the global model Flower's loop holds, and noise is added to the global model the
  strategy returns; it takes a server that makes the next global model from the replies' mean alone;
- secure aggregation (SecAgg+): the server gets the replies' sample-weighted mean, never one reply;
  it takes the same server;
- server-side evaluation (``evaluate_fn``): evaluates the global model the strategy returns; it takes
  a method that has one.

Local differential privacy (Flower's ``LocalDpMod`` on the clients) changes each reply before the server
sees it, and composes with every method. Both Flower APIs' strategies ask here.
"""

from __future__ import annotations

from typing import TypeVar

from flower_pfl.engine.server_algorithm import ServerAlgorithm

T = TypeVar("T")

#: where a refusal sends its reader
SEE = "see 'Privacy' in the documentation (docs/privacy.md)"


def _own_models(method: type[ServerAlgorithm]) -> str:
    """What a method without a global model does instead."""
    return f"{method.__name__} sends each client a model of its own and has no global model to hand Flower's loop"


def individual_needs(method: type[ServerAlgorithm]) -> str:
    """What ``method``'s server needs of each reply on its own, which a server that needs only the replies' mean
    does not (for a method whose ``aggregate_only`` is False)."""
    name = method.__name__
    if not method.has_global_model:
        return _own_models(method)
    if keys := method.client.reply_keys:
        sent = ", ".join(f"'{key}'" for key in keys)
        return f"{name}'s server reads what each client sends besides its model ({sent})"
    return f"{name}'s server makes the next global model from the replies themselves, not from their sample-weighted mean alone"


def central_dp_refusal(method: type[ServerAlgorithm], wrapper: str) -> str | None:
    """Why ``method`` cannot run inside ``wrapper``, one of Flower's central-DP wrappers; ``None`` when it can."""
    if method.aggregate_only:
        return None
    if method.has_global_model:
        consequence = (f"{wrapper}'s clipping and noise, made for a server that needs only the replies' mean, would "
                       f"not cover what {method.__name__}'s server takes from each reply")
    else:
        consequence = (f"{wrapper} would clip every client's model against the initial one, round after round, "
                       "and add its noise to nothing: the run would give no privacy")
    return (f"{individual_needs(method)}: {consequence}. Central differential privacy composes with the methods whose "
            "server needs only the replies' mean; local differential privacy (Flower's LocalDpMod on the clients' "
            f"training messages) with every method; {SEE}")


def secure_aggregation_refusal(method: type[ServerAlgorithm], workflow: str) -> str | None:
    """Why ``method`` cannot run under ``workflow``, a secure-aggregation workflow; ``None`` when it can."""
    if method.aggregate_only:
        return None
    if method.has_global_model and method.client.reply_keys:
        consequence = f"{workflow} masks the models only: what each client sends besides would reach the server in the clear"
    else:
        made = "its next global model" if method.has_global_model else "every client's model"
        consequence = (f"{workflow} hides each reply and hands the server only their mean, as every client's reply: "
                       f"{method.__name__} would make {made} of that mean, as FedAvg does")
    return (f"{individual_needs(method)}, and {consequence}. Secure aggregation composes with the methods whose server "
            f"needs only the replies' mean; {SEE}")


def checked_evaluate_fn(evaluate_fn: T, method: ServerAlgorithm, strategy: str) -> T:
    """``evaluate_fn``, a server-side evaluation of the global model given to ``strategy``; a ``ValueError``
    saying why when ``method`` has no global model (Flower's loop would hand it the initial model every round)."""
    if evaluate_fn is None or method.has_global_model:
        return evaluate_fn
    raise ValueError(f"{strategy}: {_own_models(type(method))}: evaluate_fn, which evaluates the global model on the "
                     f"server, would get the initial model every round. The clients evaluate their own models "
                     f"(fraction_evaluate); {SEE}")
