"""Every client trains every round (FedMCSA's Algorithm 1, lines 7-19), for methods that keep a
model per client: the server side (``AllClientsTrain``) and the anchor its proximal clients keep
(``AnchoredProximal``).

Each round the sampled clients train on the model ``personalize`` made for them and the other
connected clients on their own stored model. A proximal client algorithm pulls toward an anchor: a
sampled client's anchor is the model it received, which it remembers (``ANCHOR_SET``); a client
that was not sampled keeps the anchor it remembered when it was last sampled (``ANCHOR_KEEP``,
Algorithm 1's W_local), and falls back to the model it received when it has none yet.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from flower_pfl.engine.client_algorithm import Proximal, keep, like_params, stored
from flower_pfl.engine.params import param
from flower_pfl.engine.server_algorithm import ClientId, Instruction, PersonalizedAlgorithm

#: instruction entry: which model the proximal term pulls toward (absent: the received model)
ANCHOR = "anchor"
#: ``ANCHOR`` values: the received model, remembered in the client state / the model remembered last
ANCHOR_SET, ANCHOR_KEEP = "set", "keep"
#: client-state key of the remembered anchor
ANCHOR_STATE = "proximal-anchor"


@dataclass
class AllClientsTrain(PersonalizedAlgorithm):
    """A ``PersonalizedAlgorithm`` whose unsampled clients may train too (``all_clients_train``)."""

    all_clients_train: bool = param(False, key="all-clients-train",
                                    doc="every client trains every round; the unsampled ones continue from their own model (FedMCSA's Algorithm 1)")

    def train_instructions(self, server_round: int, sampled: Sequence[ClientId], others: Sequence[ClientId]) -> list[Instruction]:
        plan = super().train_instructions(server_round, sampled, others)
        if not self.all_clients_train:
            return plan
        settings, own = self.train_config(len(sampled)), self.stored(others)
        return ([Instruction(ins.client_id, ins.model, {**ins.config, ANCHOR: ANCHOR_SET}) for ins in plan]
                + [Instruction(cid, own[j], {**settings, ANCHOR: ANCHOR_KEEP}) for j, cid in enumerate(others)])


class AnchoredProximal(Proximal):
    """The proximal step with Algorithm 1's anchor: set and remembered when the client is sampled,
    kept from then on while it is not (see the module docstring)."""

    name = "anchored-proximal"
    needs_state = True
    keeps_state = True

    def choose_anchor(self) -> list[torch.Tensor]:
        mode = self.config.get(ANCHOR)
        if mode == ANCHOR_SET:
            keep(self.state, ANCHOR_STATE, self.received)
        remembered = stored(self.state, ANCHOR_STATE) if mode == ANCHOR_KEEP else None
        return self.received if remembered is None else like_params(remembered, self.received, "anchor")
