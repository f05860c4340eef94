"""CFL (Sattler, Müller, Samek 2020): clustered federated learning by recursive bi-partitioning."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from flower_pfl.engine.client_algorithm import CLIENT_ALGORITHM, ClientAlgorithm
from flower_pfl.engine.layout import ParamLayout
from flower_pfl.engine.params import AT_LEAST_ONE, HALF_OPEN_UNIT, NON_NEGATIVE, NON_NEGATIVE_INT, param
from flower_pfl.engine.reply_checks import Reply, norm
from flower_pfl.engine.server_algorithm import ClientId, GlobalModelAlgorithm, Instruction, weighted_mean
from flower_pfl.engine.wire import encode_vector
from flower_pfl.methods.base import Method
from flower_pfl.methods.ifca import MODELS, IFCAClient


def cosine_matrix(updates: torch.Tensor) -> torch.Tensor:
    """``α_{i,j} = <Δθ_i, Δθ_j> / (||Δθ_i|| ||Δθ_j||)`` for the ``(m, d)`` updates (float64)."""
    unit = F.normalize(updates.double(), dim=1)
    return unit @ unit.T


def bipartition(similarity: torch.Tensor) -> tuple[list[int], list[int], float]:
    """``c_1, c_2 = argmin_{c_1 ∪ c_2 = c} max_{i ∈ c_1, j ∈ c_2} α_{i,j}`` and that maximum
    ``α_cross^max``: the two sides of a maximum spanning tree of ``similarity`` without its weakest
    edge (every other bi-partition cuts a tree edge at least as similar). ``c_1`` holds row 0."""
    m = similarity.shape[0]
    used = torch.zeros(m, dtype=torch.bool)
    used[0] = True
    best, link = similarity[0].clone(), torch.zeros(m, dtype=torch.long)
    edges: list[tuple[int, int, float]] = []
    for _ in range(m - 1):  # Prim's algorithm, most similar first
        j = int(best.masked_fill(used, -math.inf).argmax())
        edges.append((int(link[j]), j, float(similarity[link[j], j])))
        used[j] = True
        closer = (similarity[j] > best) & ~used
        best, link = torch.where(closer, similarity[j], best), torch.where(closer, j, link)
    cut = min(range(len(edges)), key=lambda e: edges[e][2])
    side, grown = {0}, True
    while grown:
        grown = False
        for e, (a, b, _) in enumerate(edges):
            if e != cut and (a in side) != (b in side):
                side |= {a, b}
                grown = True
    first, second = sorted(side), [i for i in range(m) if i not in side]
    return first, second, float(similarity[first][:, second].max())


@dataclass
class CFL(Method, GlobalModelAlgorithm):
    """CFL (Sattler et al. 2020): FedAvg within clusters; a cluster near a stationary point whose
    members still move apart is split in two by the cosine similarity of their updates.

    Algorithm 1, per round and cluster ``c`` (its members that took part): ``Δθ_i`` = trained minus
    received model; when ``||Σ_{i∈c} (|D_i|/|D_c|) Δθ_i|| < ε_1`` and ``max_{i∈c} ||Δθ_i|| > ε_2``,
    ``c_1, c_2 = argmin max_{i∈c_1, j∈c_2} α_{i,j}`` with ``α_{i,j}`` the updates' cosine
    similarity, kept when ``γ_max < sqrt((1 − α_cross^max) / 2)``; then every cluster's model moves by
    its participants' sample-weighted mean update, ``θ_c ← θ_c + Σ_{i∈c} |D_i|/|D_c| Δθ_i``.
    The paper has every client train every round; with partial participation a split is decided on
    the round's participants, and each non-participating member joins the side of the participant
    whose update is most similar to its own last one (a member that never trained stays in ``c_1``).
    The bi-partition is the exact argmin (a maximum spanning tree's weakest edge, i.e. single
    linkage); the authors' code and FL-bench use complete linkage, which need not attain it (FL-bench
    also takes an unweighted mean).

    Defaults are the paper's and its authors' code's: ``ε_1 = 0.4``, ``ε_2 = 1.6``, no split before round 20,
    and only a cluster of which at least 3 members took part is split. They were chosen for the paper's
    CNNs and step sizes: on small models with small updates (Synthetic's DNN here: update norms ~0.1-0.4)
    nothing is ever split and CFL is FedAvg; smaller ε's split early and on few clients, which on
    Synthetic makes dozens of clusters, i.e. local training. ``round_metrics`` reports the cluster
    count each round (``cfl-clusters`` in ``metrics.jsonl``).
    """

    name = "cfl"
    strategy = "CFL"
    has_global_model = False  # a model per cluster
    client = ClientAlgorithm
    default_clients_per_round = 10
    state_attributes = ("models", "assignment", "updates")

    eps1: float = param(0.4, key="cfl-eps1", must=NON_NEGATIVE,
                        doc="ε_1: split only when the norm of a cluster's mean update is below it (near a stationary point; "
                            "the paper's value, for its CNNs and step sizes)")
    eps2: float = param(1.6, key="cfl-eps2", must=NON_NEGATIVE,
                        doc="ε_2: split only when some member's update norm is above it (the paper's value, as ε_1)")
    gamma_max: float = param(0.0, key="cfl-gamma-max", must=HALF_OPEN_UNIT,
                             doc="γ_max: keep a split only when sqrt((1 − α_cross^max) / 2) exceeds it")
    warmup: int = param(20, key="cfl-warmup", must=NON_NEGATIVE_INT,
                        doc="no cluster is split before this round (the authors' code: 20)")
    min_members: int = param(3, key="cfl-min-members", must=AT_LEAST_ONE,
                             doc="a cluster is split only when at least this many of its members took part in the round "
                                 "(the authors' code: more than 2)")

    def setup(self, layout: ParamLayout, initial: torch.Tensor, device: torch.device, seed: int = 0) -> None:
        super().setup(layout, initial, device, seed)
        #: one model per cluster (rows), each client's cluster (absent: 0) and last update Δθ_i
        self.models = self.model.clone()[None]
        self.assignment: dict[ClientId, int] = {}
        self.updates: dict[ClientId, torch.Tensor] = {}

    new_client_rule = "the cluster model with the lowest loss on its training data (IFCA's choice)"

    def client_model(self, client_id: ClientId, training: bool) -> torch.Tensor | None:
        return self.models[self.assignment.get(client_id, 0)]

    def new_client_instructions(self, server_round: int, ids: Sequence[ClientId]) -> list[Instruction]:
        """Every cluster's model, of which the client evaluates the one with the lowest loss on its training data
        (``IFCAClient.evaluation_model``): a new client has no update to place it by the paper's similarity."""
        settings = {**self.evaluation_config(), MODELS: encode_vector(self.models.flatten()), CLIENT_ALGORITHM: IFCAClient.name}
        return [Instruction(cid, self.models[0], settings) for cid in ids]

    def aggregate(self, server_round: int, replies: Sequence[Reply]) -> None:
        ids = [r.client_id for r in replies]
        start = [self.assignment.get(cid, 0) for cid in ids]
        updates = torch.stack([r.model for r in replies]) - self.models[start]
        self.updates.update({cid: u.clone() for cid, u in zip(ids, updates)})
        self.assignment.update(zip(ids, start))
        if server_round >= self.warmup:
            for c in sorted(set(start)):
                self.split([i for i, s in enumerate(start) if s == c], replies, updates)
        after = [self.assignment[cid] for cid in ids]
        old = self.models.clone()
        for c in sorted(set(after)):
            rows = [i for i, a in enumerate(after) if a == c]
            self.models[c] = old[c] + weighted_mean(updates[rows], [replies[i].num_examples for i in rows])

    def split(self, rows: list[int], replies: Sequence[Reply], updates: torch.Tensor) -> None:
        """Bi-partition the cluster of the participants ``rows`` when the criteria hold (the new part
        gets a new cluster, starting from the old cluster's model)."""
        if len(rows) < max(2, self.min_members):
            return
        mine = updates[rows]
        mean = weighted_mean(mine, [replies[i].num_examples for i in rows])
        if not (norm(mean) < self.eps1 and max(norm(u) for u in mine) > self.eps2):
            return
        first, second, cross = bipartition(cosine_matrix(mine))
        if not math.sqrt(max(0.0, 1 - cross) / 2) > self.gamma_max:
            return
        c, new = self.assignment[replies[rows[0]].client_id], len(self.models)
        self.models = torch.cat([self.models, self.models[c:c + 1]])
        moved = {replies[rows[i]].client_id for i in second}
        participants = {replies[i].client_id for i in rows}
        for cid, cluster in list(self.assignment.items()):
            if cid in moved:
                self.assignment[cid] = new
            elif cluster == c and cid not in participants:
                sim = F.cosine_similarity(mine.double(), self.updates[cid].double()[None], dim=1)
                if float(sim[second].max()) > float(sim[first].max()):
                    self.assignment[cid] = new

    def global_model(self) -> torch.Tensor | None:
        return None

    def round_metrics(self) -> dict[str, float]:
        """The number of clusters after the round's splits."""
        return {"cfl-clusters": float(len(self.models))}

    def server_state(self) -> dict[str, Any]:
        """The cluster models and each client's cluster."""
        return {"models": self.models, "assignment": dict(self.assignment)}
