"""Whether clients honour a method's client contract, and what the server tells the user when they do
not: whose receipt shows that a client ran the algorithm it was asked for (``receipt_expected``),
training settings no client can train with (``settings_problem``), replies without the algorithm's
output (``missing_algorithm_message``) and replies without its receipt (``ignored_algorithm_message``).
``MethodServer`` decides when to say them (once)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from flower_pfl.engine.client_algorithm import CLIENT_ALGORITHM, LOCAL_STEPS, LR, PROXIMAL_MU, ClientAlgorithm
from flower_pfl.engine.client_metrics import is_finite_number
from flower_pfl.engine.server_algorithm import ServerAlgorithm
from flower_pfl.engine.wording import agreeing, counted

#: where users read how to run a method's client algorithm in their own app
_DOCS = "see 'Using a strategy in your own Flower app' in the documentation (docs/strategies.md, docs/client-contract.md)"
#: a client's reply, counted (``wording.counted``)
REPLY, REPLIES = "client's reply", "clients' replies"
#: how a user's own loop runs the client algorithm a training instruction names
_USER_LOOP = "client_apps.own_loop.algorithm_for(config, model, context.state)"


def receipt_expected(algorithm: type[ClientAlgorithm]) -> type[ClientAlgorithm] | None:
    """``algorithm`` when its receipt (``ClientAlgorithm.finish``) alone shows that a client ran it;
    ``None`` for plain SGD and for algorithms whose reply keys show it."""
    return algorithm if algorithm.receipt() is not None and not algorithm.reply_keys else None


def _proximal_mu_text(method: ServerAlgorithm) -> str:
    """How ``method`` makes its ``proximal-mu`` from its arguments (its ``proximal_mu_text``, where it says)."""
    return getattr(method, "proximal_mu_text", "proximal-mu")


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
        return (f"lr · proximal-mu = {lr:g} · {mu:g} = {lr * mu:g} >= 1, with proximal-mu = {_proximal_mu_text(method)}: "
                "every local step pulls a client's model onto (or past) its anchor, so clients cannot train; "
                f"lower lr or raise the arguments so that lr · ({_proximal_mu_text(method)}) < 1")
    return None


def _fix(algorithm: type[ClientAlgorithm], send: str = "") -> str:
    """How a user runs ``algorithm``: through their own loop where it is a hook on one (``send``: what to
    add to the reply), else only with the package's ClientApp (``algorithm_for`` refuses it)."""
    if algorithm.hookable:
        return f"train with {_USER_LOOP}{send} (or use the package's ClientApp)"
    return (f"use the package's ClientApp (clientapp = \"client_apps.app:app\" in your app's pyproject.toml): "
            f"{algorithm.__name__} trains a second model or takes a second minibatch per step, so it is not a hook on "
            "a user's loop (algorithm_for refuses it)")


def missing_algorithm_message(method: ServerAlgorithm, algorithm: str, count: int) -> str:
    """``count`` replies lacked what ``method``'s client algorithm ``algorithm`` returns (their clients do not run it)."""
    name = type(method).__name__
    return (f"{counted(count, REPLY, REPLIES)} {agreeing(count, 'lacks', 'lack')} what {name}'s client algorithm {algorithm} "
            f"returns: {agreeing(count, 'its', 'their')} ClientApp does not "
            f"run it. {name} cannot work without it; {_fix(method.client_algorithm())}; {_DOCS}")


def ignored_algorithm_message(method: ServerAlgorithm, algorithm: type[ClientAlgorithm], ignored: int, accepted: int) -> str:
    """``ignored`` of ``accepted`` replies lacked the receipt of ``algorithm``, the client algorithm their
    instructions named: their clients trained without it, so the method ran as another one."""
    name = type(method).__name__
    fix = _fix(algorithm, " and send what its finish() returns with the reply")
    return (f"{ignored} of {counted(accepted, REPLY, REPLIES)} {agreeing(ignored, 'lacks', 'lack')} the receipt "
            f"'{CLIENT_ALGORITHM}' = '{algorithm.name}': {agreeing(ignored, 'its', 'their')} ClientApp ignored the training config's '{CLIENT_ALGORITHM}' = '{algorithm.name}', which names {name}'s "
            f"client algorithm {algorithm.__name__}. {name} then {method.ignored_algorithm_consequence(algorithm)}. "
            f"To run it, {fix}; {_DOCS}")
