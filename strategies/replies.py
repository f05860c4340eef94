"""What both APIs' strategies say about replies they cannot use."""

from __future__ import annotations

from logging import WARNING
from typing import Any

from flwr.common.logger import log


def log_rejected(client_id: Any, server_round: int, reason: str) -> None:
    log(WARNING, "round %s: update of client %s rejected (%s); its stored model is unchanged", server_round, client_id, reason)
