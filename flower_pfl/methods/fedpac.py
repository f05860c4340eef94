"""FedPAC (Xu, Tong & Huang 2023): feature alignment to global prototypes, and classifier collaboration."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from flower_pfl.engine.client_algorithm import LOCAL_STEPS, Batch, ClientAlgorithm, ClientState, LossFn, TrainData, setting
from flower_pfl.engine.feature_stats import (
    FeatureStats,
    class_statistics,
    pooled_class_means,
    prototype_loss,
    received_statistics,
    representation_size,
)
from flower_pfl.engine.functional import Functional, State, sgd
from flower_pfl.engine.layout import ParamLayout
from flower_pfl.engine.model_facts import ModelFacts
from flower_pfl.engine.model_split import body_slice, drop_frozen, head_flags, head_module, head_slice
from flower_pfl.engine.params import NON_NEGATIVE, NON_NEGATIVE_INT, param
from flower_pfl.engine.reply_checks import Reply, norm
from flower_pfl.engine.server_algorithm import Settings
from flower_pfl.methods.base import Method, one_layer_refusal
from flower_pfl.methods.fedper import SharedPart
from flower_pfl.methods.fedproto import decode_prototypes, encode_prototypes

#: config keys: λ, the round's first local steps that train the head, and the global prototypes
#: (bytes, ``fedproto.encode_prototypes``: a flag per class, then the prototypes; absent until there are any)
LAMBDA, HEAD_STEPS, PROTOTYPES = "fedpac-lambda", "fedpac-head-steps", "fedpac-prototypes"
#: reply keys (``FeatureStats``): the statistics of the received representation (for the classifier
#: combination) and of the trained one (its class means are the client's prototypes)
STATISTICS, LOCAL_PROTOTYPES = "fedpac-statistics", "fedpac-local-prototypes"
#: weights below this are set to 0 before the combination weights are renormalized (both references)
SMALL_WEIGHT = 1e-3


def variance_term(stats: FeatureStats, num_examples: float) -> float:
    """``V_i = (1/n_i) Σ_k [p_i(k) E||z||²_k − p_i(k)² ||μ_i^k||²]``: the variance term of client i's
    classifier-combination objective (its samples ``n_i``, class shares ``p_i`` and class means ``μ_i``)."""
    norms = (stats.means ** 2).sum(1)
    return float((stats.shares * stats.second_moments() - stats.shares ** 2 * norms).sum()) / float(num_examples)


def combination_objectives(stats: Sequence[FeatureStats], num_examples: Sequence[float]) -> torch.Tensor:
    """``(m, m, m)``: for each client i the matrix ``P_i = diag(V) + D_i``, ``D_i[j, l] = Σ_k ⟨h_i^k − h_j^k,
    h_i^k − h_l^k⟩`` with ``h_j^k = p_j(k) μ_j^k``, so that ``αᵀ P_i α = Σ_j α_j² V_j + Σ_k ||h_i^k − Σ_j α_j h_j^k||²``
    on the simplex (positive semi-definite: a diagonal of variances plus a Gram matrix)."""
    h = torch.stack([(s.shares[:, None] * s.means).flatten() for s in stats]).double()  # (m, C·d)
    v = torch.tensor([variance_term(s, n) for s, n in zip(stats, num_examples)], dtype=torch.float64)
    gaps = h[:, None, :] - h[None, :, :]  # gaps[i, j] = h_i − h_j
    return torch.diag(v) + gaps @ gaps.transpose(1, 2)


def project_to_simplex(v: torch.Tensor) -> torch.Tensor:
    """Each row of ``v`` projected (Euclidean) onto the probability simplex (Duchi et al. 2008)."""
    u = v.sort(dim=-1, descending=True).values
    cumulative = u.cumsum(-1) - 1
    ranks = torch.arange(1, v.shape[-1] + 1, dtype=v.dtype, device=v.device)
    rho = ((u - cumulative / ranks) > 0).sum(-1, keepdim=True)
    theta = cumulative.gather(-1, rho - 1) / rho.to(v.dtype)
    return (v - theta).clamp_min(0)


def simplex_qp(p: torch.Tensor, iterations: int = 20000, tol: float = 1e-12) -> torch.Tensor:
    """``argmin_α αᵀ P α`` over the simplex for each of the ``(b, m, m)`` positive semi-definite ``P``:
    accelerated projected gradient (FISTA) from the uniform weights, step ``1 / (2 λ_max(P))``, until
    a projected-gradient step moves no weight by more than ``tol``. Returns ``(b, m)``."""
    p = p.double()
    b, m, _ = p.shape
    step = 1 / (2 * torch.linalg.eigvalsh(p)[:, -1].clamp_min(1e-300))[:, None]

    def descend(point: torch.Tensor) -> torch.Tensor:
        return project_to_simplex(point - step * 2 * (p @ point[..., None])[..., 0])

    alpha = torch.full((b, m), 1 / m, dtype=p.dtype)
    point, t = alpha, 1.0
    for i in range(iterations):
        new = descend(point)
        t_next = (1 + (1 + 4 * t * t) ** 0.5) / 2
        point, alpha, t = new + (t - 1) / t_next * (new - alpha), new, t_next
        if i % 50 == 49 and float((descend(alpha) - alpha).abs().max()) < tol:
            break
    return alpha


def combination_weights(stats: Sequence[FeatureStats], num_examples: Sequence[float]) -> torch.Tensor:
    """``(m, m)``: row i the weights α_i of the participants' heads in client i's combined head (the
    QP's solution, weights below ``SMALL_WEIGHT`` set to 0, renormalized)."""
    alpha = simplex_qp(combination_objectives(stats, num_examples))
    alpha = torch.where(alpha > SMALL_WEIGHT, alpha, 0.0)
    return (alpha / alpha.sum(1, keepdim=True)).float()


class FedPACClient(ClientAlgorithm):
    """FedPAC's client: the statistics of the received representation on the whole training split first
    (``begin``), then of the round's ``local-steps`` SGD steps the first ``fedpac-head-steps`` train the
    head on the cross-entropy (body frozen) and the others the body on ``CE + λ mean_n ||f(x_n) −
    c^(y_n)||² / d`` (head frozen; ``c``: the global prototypes, no pull for a class without one).
    Returns both statistics: the received representation's (``fedpac-statistics``) and the trained
    one's (``fedpac-local-prototypes``)."""

    name = "fedpac"
    hookable = False
    reply_keys = (STATISTICS, LOCAL_PROTOTYPES)
    batched_state = ("prototypes",)

    def __init__(self, model: nn.Module, config: Mapping[str, Any], state: ClientState | None = None,
                 loss_fn: LossFn = F.cross_entropy) -> None:
        super().__init__(model, config, state, loss_fn)
        self.lam = float(setting(config, LAMBDA, "FedPAC"))
        if not self.lam >= 0:
            raise ValueError(f"FedPAC's lambda must be >= 0, got {self.lam}")
        total, self.head_steps = int(setting(config, LOCAL_STEPS, "FedPAC")), int(setting(config, HEAD_STEPS, "FedPAC"))
        if not 0 <= self.head_steps < total:
            raise ValueError(f"FedPAC needs 0 <= {HEAD_STEPS} < {LOCAL_STEPS} (a body step), got {self.head_steps} of {total}")
        self.in_head = head_flags(model, 1)
        head = head_module(model)
        flags, prototypes = torch.zeros(head.out_features), torch.zeros(head.out_features, head.in_features)
        if PROTOTYPES in config:
            flags, prototypes = decode_prototypes(config[PROTOTYPES], head.out_features, head.in_features, PROTOTYPES)
        #: the global prototypes and which classes have one (none before the server has any: no pull)
        self.prototypes = [prototypes.to(head.weight), (flags > 0).to(head.weight.device)]
        #: the training split (x, y) and the received representation's statistics (shares, means,
        #: variances), set by ``begin``: tuples of tensors, each client's own (not settings its round's
        #: clients share, which a batched round groups them by)
        self.split: tuple[torch.Tensor, torch.Tensor] | None = None
        self.received_stats: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None

    def begin(self, model: nn.Module, data: TrainData) -> TrainData:
        stats = class_statistics(model, data.x, data.y)
        self.split, self.received_stats = (data.x, data.y), (stats.shares, stats.means, stats.variances)
        return data

    def step(self, f: Functional, state: State, batches: Sequence[Batch], lr: float) -> tuple[State, torch.Tensor]:
        """A head step (step ``self.steps`` < ``fedpac-head-steps``: the cross-entropy, body frozen) or a body
        step (the cross-entropy plus λ times the alignment to the global prototypes, head frozen)."""
        (x, y), = batches
        training_head = self.steps < self.head_steps

        def loss_of(s: State) -> tuple[torch.Tensor, torch.Tensor]:
            logits, z = f.with_features(s, x)
            loss = self.loss(logits, y)
            if training_head or self.lam == 0:
                return loss, loss
            return loss + self.lam * prototype_loss(z, y, *self.prototypes), loss

        grads, _, _, state, loss = f.grad(loss_of, state, has_aux=True)
        frozen = [is_head != training_head for is_head in self.in_head]
        return f.with_params(state, sgd(f.params(state), drop_frozen(grads, frozen), lr)), loss

    def end_round(self, model: nn.Module, inputs: Any = None) -> dict[str, bytes]:
        if self.split is None or self.received_stats is None:
            raise ValueError("FedPAC's statistics are those of the whole training split: run it in client_apps.app's ClientApp")
        return {STATISTICS: FeatureStats(*self.received_stats).encode(),
                LOCAL_PROTOTYPES: class_statistics(model, *self.split).encode()}


@dataclass
class FedPAC(Method, SharedPart):
    """FedPAC (Xu, Tong & Huang 2023): a shared representation aligned to global class prototypes, and
    each client's head a combination of the participants' heads weighted by a quadratic program.

    Client i: computes the statistics of the received representation ``θ^(t)`` on its
    training split (its class shares ``p_i(k)``, class means ``μ_i^k`` and ``E||z||²`` per class), trains its
    head φ_i with the body frozen, then the body with the head frozen on ``ℓ(θ, φ_i) + λ (1/n) Σ_n
    ||f_θ(x_n) − c^(y_n)||² / d`` (feature alignment to the global prototypes ``c``, the mean
    squared error as in the authors' code), and returns the model and its prototypes ``ĉ_i^(k)`` (the class
    means of the trained representation). Server: the body is the sample-weighted mean of the
    participants' bodies; ``c^(k) = Σ_i n_i,k ĉ_i^(k) / Σ_i n_i,k`` over the participants holding class
    k (a class none holds keeps its last prototype); for each participant i, ``α_i = argmin αᵀ (diag(V)
    + D_i) α`` over the simplex (the classifier-combination objective: ``V_j = (1/n_j) Σ_k [p_j(k) E||z||²_k − p_j(k)² ||μ_j^k||²]``, the
    variance term, and ``D_i[j, l] = Σ_k ⟨h_i^k − h_j^k, h_i^k − h_l^k⟩``, ``h_j^k = p_j(k) μ_j^k``, the
    bias term), weights below 10⁻³ set to 0 and the rest renormalized, and client i's head becomes
    ``Σ_j α_ij φ_j`` over the participants' trained heads. Clients keep their heads between rounds (on
    the server, as FedPer) and evaluate the current body with their own head.

    Steps, not epochs: of the ``local-steps``, the first ``fedpac-head-steps`` train the head (the paper
    and the authors' code: one epoch for the head, then the body's epochs), by plain SGD with the
    body's learning rate (the authors' code: 0.1 for the head, momentum 0.5 and weight decay; FL-bench:
    0.1 for the head). The QP is solved by projected gradient on the simplex (the references: CVXPY);
    its matrix is positive semi-definite by construction, so the references' eigenvalue clipping is not
    needed; the weights are renormalized after the small ones are dropped, as FL-bench does (the
    authors' code and PFLlib do not). Prototypes are weighted by class counts as in the paper, the
    authors' code and FL-bench (PFLlib: unweighted); a class without a global prototype adds no
    alignment term, as in PFLlib (the authors' code and FL-bench pull it toward the client's own
    prototype of the round's start).
    """

    name = "fedpac"
    strategy = "FedPAC"
    reads_head = True
    client = FedPACClient
    default_clients_per_round = 10
    state_attributes = ("prototypes", "known")  # type: ignore[assignment]  # SharedPart's is inferred as a 1-tuple
    without_client_algorithm = "cannot run: every reply lacks the feature statistics"

    lam: float = param(1.0, key="fedpac-lambda", must=NON_NEGATIVE,
                       doc="λ: weight of the feature alignment to the global prototypes (the authors' code, PFLlib, FL-bench: 1)")
    head_steps: int = param(1, key="fedpac-head-steps", must=NON_NEGATIVE_INT,
                            doc="the round's first local steps, which train the head (the others train the body)")

    def shared_columns(self, layout: ParamLayout) -> slice:
        return body_slice(layout, 1)

    def setup(self, layout: ParamLayout, initial: torch.Tensor, device: torch.device, seed: int = 0) -> None:
        super().setup(layout, initial, device, seed)
        self.classes, self.dim = representation_size(layout, "FedPAC")
        self.head_columns = head_slice(layout, 1)
        self.prototypes, self.known = torch.zeros(self.classes, self.dim), torch.zeros(self.classes, dtype=torch.bool)

    @classmethod
    def check_model(cls, facts: ModelFacts) -> str | None:
        return super().check_model(facts) or one_layer_refusal(facts, "a model with a body before its head",
                                                               "FedPAC has no representation to share")

    @classmethod
    def check_run(cls, options: Mapping[str, Any]) -> tuple[str, str] | None:
        if options["fedpac-head-steps"] >= options["local-steps"]:
            return "fedpac-head-steps", f"below local-steps ({options['local-steps']}), so that the body trains too"
        return None

    def train_config(self, num_participants: int) -> Settings:
        prototypes = {PROTOTYPES: encode_prototypes(self.known.float(), self.prototypes)} if self.known.any() else {}
        return {LAMBDA: self.lam, HEAD_STEPS: self.head_steps, **prototypes}

    def check_extras(self, extras: Mapping[str, Any]) -> tuple[FeatureStats, FeatureStats]:
        """The statistics of the received and of the trained representation, each checked."""
        return (received_statistics(extras, STATISTICS, self.classes, self.dim, FedPACClient.__name__),
                received_statistics(extras, LOCAL_PROTOTYPES, self.classes, self.dim, FedPACClient.__name__))

    def example_extras(self, generator: torch.Generator) -> dict[str, bytes]:
        before = FeatureStats.example(self.classes, self.dim, generator)
        after = dataclasses.replace(FeatureStats.example(self.classes, self.dim, generator), shares=before.shares)
        return {STATISTICS: before.encode(), LOCAL_PROTOTYPES: after.encode()}

    def update_norms(self, reply: Reply, sent: torch.Tensor) -> dict[str, tuple[float, float]]:
        """The model's change, and both statistics' class means against the round's median."""
        before, after = reply.extras
        return {**super().update_norms(reply, sent), STATISTICS: (norm(before.means), 0.0), LOCAL_PROTOTYPES: (norm(after.means), 0.0)}

    def aggregate(self, server_round: int, replies: Sequence[Reply]) -> None:
        counts = [r.num_examples for r in replies]
        alpha = combination_weights([r.extras[0] for r in replies], counts)
        heads = alpha @ torch.stack([r.model[self.head_columns].float().cpu() for r in replies])
        combined = []
        for reply, head in zip(replies, heads):
            model = reply.model.clone()
            model[self.head_columns] = head.to(model)
            combined.append(dataclasses.replace(reply, model=model))
        self.attention_weights.add([r.client_id for r in replies], {"head": alpha})
        super().aggregate(server_round, combined)
        prototypes, known = pooled_class_means([r.extras[1] for r in replies], counts)
        self.prototypes = torch.where(known[:, None], prototypes, self.prototypes)  # a class none held keeps its prototype
        self.known = self.known | known
