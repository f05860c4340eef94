"""FedLC (Zhang et al. 2022): federated learning with label distribution skew via logits calibration."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from flower_pfl.engine.client_algorithm import ClientAlgorithm, ClientState, LossFn, TrainData, setting
from flower_pfl.engine.model_split import head_module
from flower_pfl.engine.params import NON_NEGATIVE, param
from flower_pfl.engine.server_algorithm import GlobalModelAlgorithm, Settings
from flower_pfl.methods.base import Method

#: config key: the calibration strength τ
TAU = "fedlc-tau"
#: the count of a class the client does not hold, in the calibration (its logit is lowered by τ · 100)
ABSENT = 1e-8


def calibration(counts: torch.Tensor, tau: float) -> torch.Tensor:
    """What FedLC subtracts from each class's logit: ``τ · n_{c,y}^{−1/4}``, ``n_{c,y}`` the client's
    count of class ``y`` (a class it does not hold counts ``ABSENT``, as in FL-bench: its logit is
    lowered by ``100 τ``, which takes it out of the softmax)."""
    return tau * counts.to(torch.float32).clamp_min(ABSENT).pow(-0.25)


def calibrated_loss(logits: torch.Tensor, y: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """The calibrated loss: the cross-entropy of the logits minus the calibration ``offsets`` (the
    softmax's sum over every class, true one included, as in FL-bench)."""
    return F.cross_entropy(logits - offsets.to(logits.dtype), y)


class FedLCClient(ClientAlgorithm):
    """FedLC's client: local SGD on the calibrated loss, the calibration from the class counts of the
    client's whole training split (``begin``), so only the package's ClientApp runs it. Evaluation is
    the received model's, uncalibrated."""

    name = "fedlc"
    batched_state = ("offsets",)
    hookable = False

    def __init__(self, model: nn.Module, config: Mapping[str, Any], state: ClientState | None = None,
                 loss_fn: LossFn = F.cross_entropy) -> None:
        super().__init__(model, config, state, loss_fn)
        self.tau = float(setting(config, TAU, "FedLC"))
        if not self.tau >= 0:
            raise ValueError(f"FedLC needs tau >= 0, got {self.tau}")
        self.classes = head_module(model).out_features
        self.offsets = torch.zeros(self.classes, device=self.received[0].device)  # until ``begin`` counts the split


    def begin(self, model: nn.Module, data: TrainData) -> TrainData:
        self.offsets = calibration(torch.bincount(data.y, minlength=self.classes), self.tau).to(data.y.device)
        return data

    def loss(self, logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return calibrated_loss(logits, y, self.offsets)


@dataclass
class FedLC(Method, GlobalModelAlgorithm):
    """FedLC (Zhang et al. 2022): FedAvg whose clients calibrate their logits by their own label counts,
    so that a client's frequent classes do not crowd out its rare ones.

    Client: local SGD on ``CE(f(x) − τ n_c^{−1/4}, y)``, ``n_c`` the vector of the client's class
    counts, ``τ`` the calibration strength; the model is evaluated uncalibrated. Server: FedAvg
    (weighted by sample counts). The calibration uses each client's own counts, as the paper and
    FL-bench do (PFLlib's uses the counts summed over all clients, the same for every client); a class
    the client lacks leaves its softmax, so no client pushes its logit down.
    """

    name = "fedlc"
    strategy = "FedLC"
    aggregate_only = True
    reads_head = True
    client = FedLCClient
    without_client_algorithm = "runs as FedAvg: the clients train uncalibrated"

    tau: float = param(1.0, key="fedlc-tau", must=NON_NEGATIVE, doc="calibration strength τ (0: FedAvg; FL-bench's and PFLlib's default 1)")

    def train_config(self, num_participants: int) -> Settings:
        return {TAU: self.tau}
