"""FedRep (Collins et al. 2021): a shared representation, personal heads trained first each round."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from flower_pfl.engine.client_algorithm import LOCAL_STEPS, Batch, ClientAlgorithm, ClientState, LossFn, setting
from flower_pfl.engine.model_split import drop_frozen, head_flags
from flower_pfl.engine.params import AT_LEAST_ONE, param
from flower_pfl.engine.reply_checks import Reply
from flower_pfl.engine.server_algorithm import Settings
from flower_pfl.methods.fedper import FedPer

#: config keys: the head's size in modules, and how many of the round's last local steps train the body
HEAD_LAYERS, BODY_STEPS = "fedrep-head-layers", "fedrep-body-steps"


class FedRepClient(ClientAlgorithm):
    """FedRep's client (Algorithm 1): of the round's ``local-steps`` SGD steps, the first
    ``local-steps − fedrep-body-steps`` train the head with the body frozen, the last
    ``fedrep-body-steps`` the body with the head frozen. A hook on any loop: the frozen part's
    gradients are dropped in ``adjust_gradients``."""

    name = "fedrep"

    def __init__(self, model: nn.Module, config: Mapping[str, Any], state: ClientState | None = None,
                 loss_fn: LossFn = F.cross_entropy) -> None:
        super().__init__(model, config, state, loss_fn)
        self.head = head_flags(model, int(setting(config, HEAD_LAYERS, "FedRep")))
        total, body = int(setting(config, LOCAL_STEPS, "FedRep")), int(config[BODY_STEPS])
        if not 1 <= body < total:
            raise ValueError(f"FedRep needs 1 <= {BODY_STEPS} < {LOCAL_STEPS} (a head step and a body step), "
                             f"got {body} of {total}")
        #: the steps that train the head (τ_h), before the body's τ_φ = ``fedrep-body-steps``
        self.head_steps = total - body

    def gradients(self, params: Sequence[torch.Tensor], grads: Sequence[torch.Tensor | None],
                  batch: Batch | None) -> list[torch.Tensor | None]:
        training_head = self.steps < self.head_steps
        return drop_frozen(super().gradients(params, grads, batch), [is_head != training_head for is_head in self.head])


@dataclass
class FedRep(FedPer):
    """FedRep (Collins et al. 2021): a representation (the body) shared by FedAvg and a head per client;
    each round a client first fits its head to the current body, then updates the body.

    Algorithm 1: the server sends the participants the representation φ^t with their own heads; client
    i takes τ_h steps ``h_i ← h_i − α ∇_h f_i(h_i, φ^t)`` (body frozen), then τ_φ steps
    ``φ_i ← φ_i − α ∇_φ f_i(h_i, φ_i)`` (head frozen); the server sets ``φ^{t+1} = (1/|I^t|) Σ_i φ_i``,
    the uniform mean over the participants as the paper writes it (PFLlib and FL-bench weight by
    samples), and keeps each head for its client (server-side, as FedPer, so that evaluation and
    resumed runs need no client state). Steps, not epochs: of the ``local-steps`` SGD steps, the last
    ``fedrep-body-steps`` (τ_φ) train the body and the others (τ_h) the head (the paper's experiments:
    10 head epochs, 1 body epoch; FL-bench's default: the last epoch trains the body). A client
    evaluates the current body with its own head.
    """

    name = "fedrep"
    strategy = "FedRep"
    client = FedRepClient
    group = "baseline"
    default_clients_per_round = 10
    without_client_algorithm = "runs as FedPer with a uniform mean: head and body are trained together"

    head_layers: int = param(1, key="fedrep-head-layers", must=AT_LEAST_ONE,
                             doc="trailing layers (modules) each client keeps as its own head")
    body_steps: int = param(1, key="fedrep-body-steps", must=AT_LEAST_ONE,
                            doc="τ_φ: the round's last local steps, which train the body (the others train the head)")

    @classmethod
    def check_run(cls, options: Mapping[str, Any]) -> tuple[str, str] | None:
        if options["fedrep-body-steps"] >= options["local-steps"]:
            return "fedrep-body-steps", f"below local-steps ({options['local-steps']}), so that the head trains too"
        return None

    def train_config(self, num_participants: int) -> Settings:
        return {HEAD_LAYERS: self.head_layers, BODY_STEPS: self.body_steps}

    def share_weights(self, replies: Sequence[Reply]) -> list[float]:
        """The body is the participants' uniform mean (each client's head is kept)."""
        return [1.0] * len(replies)
