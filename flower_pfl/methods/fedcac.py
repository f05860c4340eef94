"""FedCAC (Wu et al., ICCV 2023): each parameter is critical or not for its client; the critical ones are
shared only with the clients whose critical parameters overlap, the others with every client."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from flower_pfl.engine.client_algorithm import ClientAlgorithm, ClientState, LossFn, setting
from flower_pfl.engine.layout import ParamLayout
from flower_pfl.engine.params import AT_LEAST_ONE, UNIT_INTERVAL, param
from flower_pfl.engine.reply_checks import AlgorithmOutputMissing, Reply
from flower_pfl.engine.server_algorithm import ClientId, Instruction, PersonalizedAlgorithm, Settings, weighted_mean
from flower_pfl.engine.wire import decode_flat, encode_vector
from flower_pfl.methods.base import Method

#: config key: the fraction τ of each layer's parameters that are critical
TAU = "fedcac-tau"
#: reply key: the client's critical-parameter mask (``encode_mask``: a 0/1 float32 value per parameter of the flat model)
CRITICAL = "fedcac-critical"
#: a layer's ``τ``-quantile at or below this counts as no threshold: every parameter that moved is critical
ZERO_THRESHOLD, ZERO_SENSITIVITY = 1e-10, 1e-20


def critical_mask(start: torch.Tensor, end: torch.Tensor, tau: float) -> torch.Tensor:
    """One layer's (parameter tensor's) critical parameters: the ``⌊τ n⌋`` of largest sensitivity
    ``|θ ⊙ (θ − θ_start)|`` (ties at the threshold included); where that threshold is ``≤ 1e-10``, every
    parameter of sensitivity ``> 1e-20`` (none if no parameter moved). ``⌊τ n⌋ = 0``: none."""
    sensitivity = (end * (end - start)).abs().flatten()
    k = int(tau * sensitivity.numel())
    if k == 0:
        return torch.zeros_like(sensitivity, dtype=torch.bool)
    threshold = torch.topk(sensitivity, k).values[-1]
    if threshold <= ZERO_THRESHOLD:
        return sensitivity > ZERO_SENSITIVITY
    return sensitivity >= threshold


def encode_mask(mask: torch.Tensor) -> bytes:
    """A flat boolean mask as float32 bytes of 0s and 1s (``flower_pfl.engine.wire``)."""
    return encode_vector(mask.to(torch.float32))


def decode_mask(data: Any, size: int, name: str = CRITICAL) -> torch.Tensor:
    """``encode_mask``'s bytes as a boolean mask of ``size`` entries (``ValueError`` for other bytes)."""
    values = decode_flat(data, size, name)
    if not torch.isfinite(values).all():
        raise ValueError(f"'{name}' holds NaN or Inf")
    if not ((values == 0) | (values == 1)).all():
        raise ValueError(f"'{name}' is not a 0/1 mask (one value per parameter: 1 critical, 0 not)")
    return values == 1


def overlap_rates(masks: torch.Tensor) -> torch.Tensor:
    """``o_ij = 1 − ||m_i − m_j||_1 / (2 ||m_i||_1)`` between the ``(m, d)`` 0/1 masks (row ``i``: the
    overlap of ``j``'s critical parameters with ``i``'s; 0 where ``i`` has none)."""
    m = masks.to(torch.float64)
    counts = m.sum(1)
    differ = counts[:, None] + counts[None, :] - 2 * (m @ m.T)
    return torch.where(counts[:, None] > 0, 1 - differ / (2 * counts.clamp_min(1)[:, None]), torch.zeros_like(differ))


def collaborators(overlaps: torch.Tensor, server_round: int, beta: int) -> torch.Tensor:
    """The ``(m, m)`` collaboration matrix: ``i`` takes ``j`` (and itself) where ``o_ij`` reaches the
    threshold ``ō + (t / β)(o_max − ō)``, ``ō`` and ``o_max`` the mean and maximum over pairs ``i ≠ j``."""
    m = overlaps.shape[0]
    own = torch.eye(m, dtype=torch.bool)
    if m == 1:
        return own
    pairs = overlaps[~own]
    mean, top = pairs.mean(), pairs.max()
    return own | (overlaps >= mean + server_round / beta * (top - mean))


class FedCACClient(ClientAlgorithm):
    """FedCAC's client: plain local SGD, then the critical-parameter mask of each trained layer against
    the model received (``critical_mask``), sent as ``fedcac-critical``; buffers (batch-norm statistics)
    are never critical, so they are averaged with every client, as PFLlib's masks cover parameters only."""

    name = "fedcac"
    reply_keys = (CRITICAL,)

    def __init__(self, model: nn.Module, config: Mapping[str, Any], state: ClientState | None = None,
                 loss_fn: LossFn = F.cross_entropy) -> None:
        super().__init__(model, config, state, loss_fn)
        self.tau = float(setting(config, TAU, "FedCAC"))
        if not 0 <= self.tau <= 1:
            raise ValueError(f"FedCAC needs 0 <= tau <= 1, got {self.tau}")

    def end_round(self, model: nn.Module, inputs: Any = None) -> dict[str, bytes]:
        """The mask over the flat model (its ``state_dict``): buffers and frozen parameters are never critical."""
        start = dict(zip([n for n, p in model.named_parameters() if p.requires_grad], self.received))
        masks = [critical_mask(start[name], value.detach(), self.tau) if name in start else torch.zeros(value.numel(), dtype=torch.bool)
                 for name, value in model.state_dict(keep_vars=True).items()]
        return {CRITICAL: encode_mask(torch.cat(masks))}


@dataclass
class FedCAC(Method, PersonalizedAlgorithm):
    """FedCAC (Wu et al. 2023): each client's critical parameters (per layer, the τ of largest |θ ⊙ Δθ|)
    are averaged with the clients whose critical parameters overlap most, the others with every client.

    Client ``i`` trains its model by local SGD from the one it received, ``θ_i^0``, to ``θ_i``; in every
    layer its critical parameters are the ``⌊τ n⌋`` of largest sensitivity ``|θ_i ⊙ (θ_i − θ_i^0)|``
    (the paper's parameter sensitivity), a 0/1 mask ``m_i`` it sends with its model.
    Server, over the round's participants: the global model ``θ_g`` is their sample-weighted mean
    (FedAvg); the overlap ``o_ij = 1 − ||m_i − m_j||_1 / (2 ||m_i||_1)``; client ``i`` collaborates on
    its critical parameters with itself and every ``j`` with ``o_ij ≥ ō + (t/β)(o_max − ō)``, ``ō`` and
    ``o_max`` the mean and maximum overlap over pairs and ``t`` the round: every client with an
    above-average overlap at first, fewer as the threshold rises to ``o_max`` at round β, none but
    itself after. Its customized model ``θ̄_i`` is its collaborators' plain mean. Client ``i``
    then trains and evaluates ``m_i ⊙ θ̄_i + (1 − m_i) ⊙ θ_g``, from its last mask and customized model
    and the newest global model (a client that never trained: ``θ_g``). τ = 0 (no critical parameter)
    is FedAvg.

    As PFLlib's ``clientcac``/``servercac``: a layer whose threshold is ``≤ 1e-10`` takes every parameter
    that moved as critical (a layer none of whose parameters moved has none; PFLlib takes all of its
    parameters, its threshold being 0); the mean and maximum are over the participants, whose
    customized models are made each round. A client without critical parameters overlaps 0 with
    every other (PFLlib divides by zero there). PFLlib has no usable defaults (``-tau`` 1.0 shared with MOON, ``-bt`` 0, which
    it refuses); τ = 0.5 (the paper's) and β = 170 are the defaults that ports of the authors' code
    carry (the paper tunes β per data set).
    """

    name = "fedcac"
    strategy = "FedCAC"
    has_global_model = True  # θ_g, beside each client's customized model
    client = FedCACClient
    group = "baseline"
    default_clients_per_round = 10
    state_attributes = ("model", "masks")
    without_client_algorithm = "cannot aggregate: the replies lack the critical-parameter masks"

    tau: float = param(0.5, key="fedcac-tau", must=UNIT_INTERVAL,
                       doc="τ: fraction of each layer's parameters that are critical (0: FedAvg)")
    beta: int = param(170, key="fedcac-beta", must=AT_LEAST_ONE,
                      doc="β: rounds over which the collaboration threshold rises from the mean to the maximum overlap")
    masks: dict[ClientId, torch.Tensor] = field(default_factory=dict, init=False, repr=False)

    def setup(self, layout: ParamLayout, initial: torch.Tensor, device: torch.device, seed: int = 0) -> None:
        super().setup(layout, initial, device, seed)
        self.model = initial.detach().to(device=self.store.device, dtype=torch.float32).clone()
        self.masks = {}

    def set_state(self, state: dict[str, Any]) -> None:
        super().set_state(state)
        self.model = self.model.to(self.store.device)
        self.masks = {cid: mask.to(torch.bool).cpu() for cid, mask in self.masks.items()}

    def train_config(self, num_participants: int) -> Settings:
        return {TAU: self.tau}

    def global_model(self) -> torch.Tensor | None:
        return self.model

    def models_for_evaluation(self, ids: Sequence[ClientId]) -> torch.Tensor:
        """``m_i ⊙ θ̄_i + (1 − m_i) ⊙ θ_g`` for each of ``ids`` (``θ_g`` for a client without a mask)."""
        customized = self.stored(ids)
        empty = torch.zeros(self.layout.dim, dtype=torch.bool)
        masks = torch.stack([self.masks.get(cid, empty) for cid in ids]).to(customized.device)
        return torch.where(masks, customized, self.model.to(customized.device))

    def train_instructions(self, server_round: int, sampled: Sequence[ClientId], others: Sequence[ClientId]) -> list[Instruction]:
        settings, models = self.train_config(len(sampled)), self.models_for_evaluation(sampled)
        return [Instruction(cid, models[i], settings) for i, cid in enumerate(sampled)]

    def check_extras(self, extras: Mapping[str, Any]) -> torch.Tensor:
        """The client's critical-parameter mask: a 0/1 value per entry of the flat model."""
        if CRITICAL not in extras:
            raise AlgorithmOutputMissing(f"the reply lacks '{CRITICAL}' (FedCAC's critical-parameter mask)", FedCACClient.__name__)
        return decode_mask(extras[CRITICAL], self.layout.dim)

    def example_extras(self, generator: torch.Generator) -> dict[str, bytes]:
        return {CRITICAL: encode_mask(torch.rand(self.layout.dim, generator=generator) < self.tau)}

    def aggregate(self, server_round: int, replies: Sequence[Reply]) -> None:
        models = torch.stack([r.model.to(self.store.device) for r in replies])
        masks = torch.stack([r.extras for r in replies])
        self.model = weighted_mean(models, [r.num_examples for r in replies])
        together = collaborators(overlap_rates(masks), server_round, self.beta).to(models)
        self.keep([r.client_id for r in replies], (together / together.sum(1, keepdim=True)) @ models)
        self.masks.update({r.client_id: mask.clone() for r, mask in zip(replies, masks)})
