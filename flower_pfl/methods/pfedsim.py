"""pFedSim (Tan et al. 2023): similarity-aware model aggregation towards personalized federated learning."""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from flower_pfl.engine.client_algorithm import ClientAlgorithm
from flower_pfl.engine.layout import ParamLayout
from flower_pfl.engine.model_facts import ModelFacts
from flower_pfl.engine.model_split import body_slice
from flower_pfl.engine.params import NON_NEGATIVE_INT, param
from flower_pfl.engine.reply_checks import Reply
from flower_pfl.engine.server_algorithm import ClientId, Instruction, PersonalizedAlgorithm, weighted_mean
from flower_pfl.methods.attention import cosine_similarity_matrix
from flower_pfl.methods.base import Method, one_layer_refusal

#: the similarity a client has with itself in its weights, and the most any pair's counts (FL-bench's 0.9999:
#: ``−log(1 − s)`` stays finite)
SELF_SIMILARITY = 0.9999


def classifier_similarity(classifiers: torch.Tensor) -> torch.Tensor:
    """``(m, m)`` similarities of the clients' ``(m, C, h)`` classifier weights: ``s_ij = max(0,
    mean_c cos(W_i[c], W_j[c]))``, the mean over classes of the cosine similarity of their rows."""
    per_class = torch.stack([cosine_similarity_matrix(classifiers[:, c]) for c in range(classifiers.shape[1])])
    return per_class.mean(0).clamp_min(0.0)


def similarity_weights(similarities: torch.Tensor) -> torch.Tensor:
    """Rows of aggregation weights from ``(m, n)`` similarities (the diagonal of the leading ``(m, m)`` block
    is each client itself, counted as ``SELF_SIMILARITY``): ``w_ij ∝ −log(1 − s_ij)``, each row summing
    to 1. A similarity of 0 gives weight 0; the similarities are capped at ``SELF_SIMILARITY``."""
    s = similarities.clamp(0.0, SELF_SIMILARITY).clone()
    s.diagonal().fill_(SELF_SIMILARITY)
    w = -torch.log1p(-s)
    return w / w.sum(1, keepdim=True)


@dataclass
class PFedSim(Method, PersonalizedAlgorithm):
    """pFedSim (Tan et al. 2023): after a FedAvg warm-up, each client's feature extractor is averaged
    with those of the clients whose classifiers are similar to its own; classifiers stay personal.

    Warm-up (rounds ``1 … T_w``): FedAvg, every client trains and evaluates the global model, which then
    becomes every client's own model ``θ_i = (φ_i, W_i)`` (body ``φ_i``, classifier ``W_i``, the last
    layer). Personalization: after each round, ``s_ij = max(0, mean_c cos(W_i[c], W_j[c]))`` for every
    pair of the round's participants (from their trained classifiers' weights; other pairs keep their
    last ``s_ij``, 0 until they trained together). A participant ``i`` gets its own classifier and
    ``φ_i ← Σ_j w_ij φ_j`` over every client ``j`` (their last trained bodies), ``w_ij ∝ −log(1 − s_ij)``
    with ``s_ii = 0.9999`` (a client similar to none keeps its body). Clients train the whole model with
    local SGD, the server keeps it and clients evaluate it.

    As FL-bench's, including its ``−log(1 − s)`` transform and its similarity of the
    classifiers' weight rows (biases left out); ``s_ij`` is capped at 0.9999 too, so that identical
    classifiers get a finite weight. Its warm-up is a fraction of the rounds (0.5); here it is a count
    of rounds, 50 for the package's 100-round benchmarks.
    """

    name = "pfedsim"
    strategy = "PFedSim"
    client = ClientAlgorithm
    default_clients_per_round = 10
    state_attributes = ("model", "similarity")

    warmup: int = param(50, key="pfedsim-warmup-rounds", must=NON_NEGATIVE_INT,
                        doc="T_w: rounds of FedAvg before personalization (FL-bench: half the rounds, 50 of 100)")

    @classmethod
    def check_model(cls, facts: ModelFacts) -> str | None:
        return super().check_model(facts) or one_layer_refusal(facts, "a model with a feature extractor besides its classifier",
                                 "there is no feature extractor to share")

    def setup(self, layout: ParamLayout, initial: torch.Tensor, device: torch.device, seed: int = 0) -> None:
        super().setup(layout, initial, device, seed)
        self.body = body_slice(layout, 1)
        last = max((i for i, shape in enumerate(layout.shapes) if len(shape) == 2), default=None)
        if last is None:
            raise ValueError(f"pFedSim needs a last linear layer (a weight matrix); shapes {list(layout.shapes)}")
        self.classifier, self.classifier_shape = layout.tensor_slices()[last], layout.shapes[last]
        #: the global model (warm-up), then every client's starting model
        self.model = initial.detach().to(device=self.store.device, dtype=torch.float32).clone()
        #: s_ij by client pair (symmetric), for the pairs that trained together
        self.similarity: dict[Hashable, dict[Hashable, float]] = {}

    def set_state(self, state: dict[str, Any]) -> None:
        super().set_state(state)
        self.model = self.model.to(self.store.device)

    def warming_up(self, server_round: int) -> bool:
        return server_round <= self.warmup

    def _own_models(self, ids: Sequence[ClientId]) -> torch.Tensor:
        """The clients' own models; a client that has none yet gets the warm-up's global model."""
        new = [cid for cid in dict.fromkeys(ids) if cid not in self.store]
        if new:
            self.keep(new, self.model.expand(len(new), -1))
        return self.stored(ids)

    def aggregated(self, sampled: Sequence[ClientId]) -> torch.Tensor:
        """The participants' own models with ``φ_i ← Σ_j w_ij φ_j`` over the clients they are similar to."""
        own = self._own_models(sampled)
        rows = [{j: s for j, s in self.similarity.get(cid, {}).items() if j != cid and s > 0} for cid in sampled]
        if not any(rows):
            return own
        others = list(dict.fromkeys(j for row in rows for j in row if j not in sampled))
        ids = [*sampled, *others]
        column = {cid: k for k, cid in enumerate(ids)}
        s = torch.zeros(len(sampled), len(ids), dtype=torch.float64)
        for i, row in enumerate(rows):
            for j, value in row.items():
                s[i, column[j]] = value
        bodies = torch.cat([own, self._own_models(others)])[:, self.body] if others else own[:, self.body]
        own[:, self.body] = similarity_weights(s).to(bodies) @ bodies
        return own

    def train_instructions(self, server_round: int, sampled: Sequence[ClientId], others: Sequence[ClientId]) -> list[Instruction]:
        settings = self.train_config(len(sampled))
        if self.warming_up(server_round):
            return [Instruction(cid, self.model, settings) for cid in sampled]
        models = self.aggregated(sampled)
        return [Instruction(cid, models[i], settings) for i, cid in enumerate(sampled)]

    def evaluation_instructions(self, server_round: int, ids: Sequence[ClientId]) -> list[Instruction]:
        """The global model during the warm-up, then each client's own."""
        settings = self.evaluation_config()
        if self.warming_up(server_round):
            return [Instruction(cid, self.model, settings) for cid in ids]
        models = self._own_models(ids)
        return [Instruction(cid, models[i], settings) for i, cid in enumerate(ids)]

    def aggregate(self, server_round: int, replies: Sequence[Reply]) -> None:
        models = torch.stack([r.model.to(self.store.device) for r in replies])
        if self.warming_up(server_round):
            self.model = weighted_mean(models, [r.num_examples for r in replies])
            return
        super().aggregate(server_round, replies)
        sims = classifier_similarity(models[:, self.classifier].view(len(replies), *self.classifier_shape)).tolist()
        ids = [r.client_id for r in replies]
        for a, i in enumerate(ids):
            for b, j in enumerate(ids):
                if a != b:
                    self.similarity.setdefault(i, {})[j] = sims[a][b]

    def server_state(self) -> dict[str, Any]:
        """The similarities, by client pair."""
        return {"similarity": {cid: dict(row) for cid, row in self.similarity.items()}}

