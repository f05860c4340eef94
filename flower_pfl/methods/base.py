"""What every personalized method provides to the shared server plumbing."""

from __future__ import annotations

from typing import Mapping, Protocol

import torch

from ..layout import ParamLayout

#: Config key of the proximal weight mu in ``min f_i(w) + mu/2 ||w - w_received||^2``
#: (the key Flower's Message-API FedProx uses; its legacy FedProx uses ``proximal_mu``).
PROXIMAL_MU = "proximal-mu"

#: Config key saying which model the proximal term pulls toward. Absent: the received
#: model. ``ANCHOR_SET``: the received model, and the client remembers it (client state).
#: ``ANCHOR_KEEP``: the model the client remembered last (FedMCSA's W_local for clients
#: that were not sampled this round; Algorithm 1, lines 8-14).
ANCHOR, ANCHOR_SET, ANCHOR_KEEP = "anchor", "set", "keep"


class ServerRule(Protocol):
    """A method's server step and client settings."""

    name: str
    #: True: every client trains every round; those not sampled continue from their own
    #: model (FedMCSA's Algorithm 1). False: only the sampled clients train.
    all_clients_train: bool

    def personalize(
        self, models: torch.Tensor, layout: ParamLayout
    ) -> tuple[torch.Tensor, Mapping[str, torch.Tensor] | None]:
        """Models to send and the ``(m, m)`` attention weights by component (``None`` if the
        method has none), from the ``(m, d)`` stored models of the round's participants."""
        ...

    def client_config(self) -> dict[str, float | int | str]:
        """Solver settings sent with every training instruction."""
        ...


def evaluation_config(rule: object) -> dict:
    """Settings a rule sends with evaluation instructions (optional; most rules have none)."""
    method = getattr(rule, "evaluation_config", None)
    return dict(method()) if method is not None else {}
