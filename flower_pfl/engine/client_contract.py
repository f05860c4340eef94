"""Whether clients honour a method's client contract, and what the server tells the user when they do
not: the client algorithm an instruction asks for (``algorithm_asked``), training settings no client can train
with (``settings_problem``), replies without the step's output (``missing_step_message``) and replies
without its receipt (``ignored_step_message``). ``MethodServer`` decides when to say them (once)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from flower_pfl.engine.client_algorithm import CLIENT_ALGORITHM, LOCAL_STEPS, LR, PROXIMAL_MU, ClientAlgorithm
from flower_pfl.engine.client_metrics import is_finite_number
from flower_pfl.engine.server_algorithm import ServerAlgorithm

#: where users read how to run a method's client algorithm in their own app
_DOCS = "see 'Using a strategy in your own Flower app' in the documentation (docs/strategies.md, docs/client-contract.md)"
#: how a user's own loop runs the client algorithm a training instruction asks for
_USER_LOOP = "client_apps.own_loop.algorithm_for(config, model, context.state)"


def algorithm_asked(step: type[ClientAlgorithm], config: Mapping[str, Any]) -> type[ClientAlgorithm] | None:
    """The class in ``step``'s lineage (``step`` or a base it refines) that the training instruction
    ``config`` asks for; ``None`` when it asks for plain SGD (e.g. FedMCSA with λ = 0)."""
    return next((s for s in step.__mro__ if isinstance(s, type) and issubclass(s, ClientAlgorithm) and s.wanted(config)), None)


def receipt_expected(step: type[ClientAlgorithm], config: Mapping[str, Any]) -> type[ClientAlgorithm] | None:
    """The step whose receipt (``ClientAlgorithm.finish``) alone shows that a client ran what ``config``
    asks for; ``None`` for plain SGD and for steps whose reply keys show it."""
    asked = algorithm_asked(step, config)
    return asked if asked is not None and asked.receipt() is not None and not asked.reply_keys else None


def settings_problem(method: ServerAlgorithm, settings: Mapping[str, Any]) -> str | None:
    """Why a client cannot train with a round's settings (the user's and the method's together), or
    ``None``. The proximal step ``w -= lr · μ (w − anchor)`` overshoots its anchor for
    ``lr · μ >= 1``, so the model cannot move toward its own data."""
    client = method.client_algorithm()
    missing = [k for k in (LR, LOCAL_STEPS) if k not in settings]
    if client.needs_plain_sgd and missing:
        return (f"the training config lacks {missing}, which {client.__name__} (this method's client algorithm) reads: "
                f"pass them to the strategy (lr=..., local_steps=...) or in train_config / on_fit_config_fn, with the "
                "values the clients train with; without them every client fails")
    lr, mu = settings.get(LR), settings.get(PROXIMAL_MU)
    if is_finite_number(lr) and is_finite_number(mu) and lr * mu >= 1:
        return (f"lr · proximal-mu = {lr:g} · {mu:g} = {lr * mu:g} >= 1, with proximal-mu = {method.proximal_mu_text}: "
                "every local step pulls a client's model onto (or past) its anchor, so clients cannot train; "
                f"lower lr or raise the arguments so that lr · ({method.proximal_mu_text}) < 1")
    return None


def missing_step_message(method: ServerAlgorithm, step: str, count: int) -> str:
    """``count`` replies lacked what ``method``'s client algorithm ``step`` returns (their clients do not run it)."""
    name = type(method).__name__
    return (f"{count} clients' replies lack what {name}'s client algorithm {step} returns: their ClientApp does not run it. "
            f"{name} cannot work without it; train with {_USER_LOOP} (or the package's ClientApp), {_DOCS}")


def ignored_step_message(method: ServerAlgorithm, step: type[ClientAlgorithm], ignored: int, accepted: int) -> str:
    """``ignored`` of ``accepted`` replies lacked the receipt of ``step``, the client algorithm their
    instructions asked for: their clients trained without it, so the method ran as another one."""
    name, key = type(method).__name__, step.receipt()
    fix = (f"train with {_USER_LOOP} and send what its finish() returns with the reply (or use the package's ClientApp)"
           if step.hookable else f"use the package's ClientApp (client_apps.app): {step.__name__} is not a hook on a user's loop")
    return (f"{ignored} of {accepted} clients' replies lack the receipt '{CLIENT_ALGORITHM}' = '{key}': their "
            f"ClientApp ignored the training config's '{key}', which asks for {name}'s client algorithm {step.__name__}. "
            f"{name} then {method.ignored_step_consequence(step)}. To run it, {fix}; {_DOCS}")
