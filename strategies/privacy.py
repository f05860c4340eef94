"""Flower's privacy mechanisms around a strategy of this package, found when they call it: the central
differential-privacy wrappers of both APIs and the legacy secure-aggregation workflows (SecAgg+, SecAgg).
A method that cannot give what one of them assumes is refused at its first call, before any client
trains, with the reason ``flower_pfl.engine.composition`` gives (docs/privacy.md)."""

from __future__ import annotations

import sys
from types import FrameType
from typing import Any

import flwr.server.strategy as legacy_strategy
import flwr.serverapp.strategy as message_strategy
from flwr.server.workflow import SecAggPlusWorkflow

from flower_pfl.engine.composition import central_dp_refusal, secure_aggregation_refusal
from flower_pfl.engine.server_algorithm import ServerAlgorithm

#: Flower's central-DP wrappers: they clip the replies' models and add noise to the global model returned
CENTRAL_DP: tuple[type, ...] = tuple(getattr(module, name) for module in (message_strategy, legacy_strategy) for name in (
    "DifferentialPrivacyServerSideFixedClipping", "DifferentialPrivacyClientSideFixedClipping",
    "DifferentialPrivacyServerSideAdaptiveClipping", "DifferentialPrivacyClientSideAdaptiveClipping",
)) + (legacy_strategy.DPFedAvgFixed,)  # DPFedAvgAdaptive is one
#: Flower's secure-aggregation workflows (SecAggWorkflow is a SecAggPlusWorkflow): the server gets the replies' sum
SECURE_AGGREGATION: tuple[type, ...] = (SecAggPlusWorkflow,)


def _runs(outer: Any, strategy: Any) -> bool:
    """``outer`` is ``strategy`` or wraps it (through wrappers' ``strategy`` attributes)."""
    for _ in range(16):
        if outer is strategy:
            return True
        if (outer := getattr(outer, "strategy", None)) is None:
            return False
    return False


def _mechanisms(strategy: Any, frame: FrameType | None) -> list[Any]:
    """Flower's central-DP wrappers and secure-aggregation workflows on the call stack from ``frame`` up that
    run ``strategy``, innermost first."""
    found = []
    while frame is not None:
        caller = frame.f_locals.get("self")
        if isinstance(caller, CENTRAL_DP) and _runs(caller, strategy):
            found.append(caller)
        elif isinstance(caller, SECURE_AGGREGATION) and _runs(getattr(frame.f_locals.get("context"), "strategy", None), strategy):
            found.append(caller)
        frame = frame.f_back
    return list({id(m): m for m in found}.values())


def check_privacy_mechanisms(strategy: Any, method: ServerAlgorithm) -> bool:
    """Refuse (``ValueError``) a central-DP wrapper or a secure-aggregation workflow that calls ``strategy``
    when its method cannot give what the mechanism assumes; ``True`` when a secure-aggregation workflow runs
    the call (the round's replies then all carry the replies' mean)."""
    secure = False
    for mechanism in _mechanisms(strategy, sys._getframe(1)):
        name = type(mechanism).__name__
        if isinstance(mechanism, SECURE_AGGREGATION):
            secure, refusal = True, secure_aggregation_refusal(type(method), name)
        else:
            refusal = central_dp_refusal(type(method), name)
        if refusal is not None:
            raise ValueError(f"{type(strategy).__name__} cannot run inside Flower's {name}: {refusal}")
    return secure
