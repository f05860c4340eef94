"""GPFL (Zhang et al., ICCV 2023): global and personalized feature information learned together."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

from flower_pfl.engine.client_algorithm import Batch, ClientAlgorithm, ClientState, LossFn, TrainData, setting
from flower_pfl.engine.evaluation import Personalization
from flower_pfl.engine.functional import Functional, State, sgd
from flower_pfl.engine.layout import ParamLayout
from flower_pfl.engine.model_facts import ModelFacts
from flower_pfl.engine.model_split import body_slice, forward_with_features, head_module
from flower_pfl.engine.params import NON_NEGATIVE, param
from flower_pfl.engine.server_algorithm import Settings
from flower_pfl.engine.side_modules import SideModules, WithSideModules, received_modules, reply_entry
from flower_pfl.methods.base import Method, one_layer_refusal
from flower_pfl.methods.fedper import SharedPart

#: config keys: the weights λ (magnitude-level guidance) and μ (regularization of the GCE and CoV), and
#: the GCE and CoV (float32 bytes, ``gpfl_modules``' layout)
LAMBDA, MU, MODULES = "gpfl-lambda", "gpfl-mu", "gpfl-modules"
#: reply key: the client's trained GCE and CoV
LOCAL_MODULES = "gpfl-local-modules"


class ConditionalValve(nn.Module):
    """CoV: ``ReLU(h ⊙ (γ(c) + 1) + β(c))``, ``γ`` and ``β`` each ``Linear(d, d)``, ``ReLU``, ``LayerNorm(d)``
    of the conditional input ``c``."""

    def __init__(self, features: int) -> None:
        super().__init__()
        self.gamma = nn.Sequential(nn.Linear(features, features), nn.ReLU(), nn.LayerNorm(features))
        self.beta = nn.Sequential(nn.Linear(features, features), nn.ReLU(), nn.LayerNorm(features))

    def forward(self, h: torch.Tensor, condition: torch.Tensor) -> torch.Tensor:
        return F.relu(h * (self.gamma(condition) + 1) + self.beta(condition))


def gpfl_modules(features: int, classes: int) -> nn.ModuleDict:
    """GPFL's side modules: the Global Category Embedding layer (GCE, one ``d``-vector per class) and the CoV."""
    return nn.ModuleDict({"gce": nn.Embedding(classes, features), "cov": ConditionalValve(features)})


def conditional_inputs(embeddings: torch.Tensor, shares: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The global ``g = (1/C) Σ_c e_c`` and the client's personalized ``p_i = Σ_c α_ic e_c`` conditional
    inputs (``α_i``: the client's class shares)."""
    return embeddings.mean(0), shares.to(embeddings) @ embeddings


def angle_loss(features: torch.Tensor, embeddings: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Angle-level guidance: the cross-entropy of the cosine similarities between the global features and
    every class's embedding."""
    return F.cross_entropy(F.normalize(features) @ F.normalize(embeddings).T, y)


def magnitude_loss(features: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Magnitude-level guidance: ``||f^G − e_y||₂`` over the batch (the norm of the whole difference)."""
    return torch.linalg.vector_norm(features - targets)


def class_shares(y: torch.Tensor, classes: int) -> torch.Tensor:
    """The client's share of each class in its training split."""
    counts = torch.bincount(y, minlength=classes).to(torch.float32)
    return counts / counts.sum().clamp_min(1)


class Valved(Personalization):
    """GPFL's personalized predictor: the model's head on ``CoV(h, p_i)``."""

    personalized: torch.Tensor

    def __init__(self, model: nn.Module, cov: nn.Module, personalized: torch.Tensor) -> None:
        super().__init__()
        self.model, self.cov = model, cov
        self.register_buffer("personalized", personalized)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return head_module(self.model)(self.cov(forward_with_features(self.model, x)[1], self.personalized))


class GPFLClient(ClientAlgorithm):
    """GPFL's client: per minibatch one SGD step of the model, the GCE and the CoV on
    ``CE(φ(CoV(h, p_i)), y) + L_alg + λ L_mlg`` plus ``μ/2 ||θ||²`` on the GCE and CoV (weight decay);
    ``p_i`` and ``g`` from the received GCE and the class shares of the client's training split
    (``begin``), so only the package's ClientApp runs it. The GCE's and CoV's parameters (``side``) train
    beside the model. Returns its GCE and CoV."""

    name = "gpfl"
    hookable = False
    reply_keys = (LOCAL_MODULES,)
    carried = ("side",)
    batched_state = ("embeddings", "global_input", "personal_input")

    def __init__(self, model: nn.Module, config: Mapping[str, Any], state: ClientState | None = None,
                 loss_fn: LossFn = F.cross_entropy) -> None:
        super().__init__(model, config, state, loss_fn)
        self.lam, self.mu = float(setting(config, LAMBDA, "GPFL")), float(setting(config, MU, "GPFL"))
        for key, value in ((LAMBDA, self.lam), (MU, self.mu)):
            if not value >= 0:
                raise ValueError(f"GPFL needs {key} >= 0, got {value}")
        self.modules = received_modules(gpfl_modules, model, config, MODULES, "GPFL")
        self.cov = cast(ConditionalValve, self.modules["cov"])
        #: the GCE's and CoV's parameters being trained (``modules``' order), and their names
        self.side = [p.detach().clone() for p in self.modules.parameters()]
        self.side_names = [name for name, _ in self.modules.named_parameters()]
        self.embeddings = cast(nn.Embedding, self.modules["gce"]).weight.detach().clone()  # the received GCE, frozen
        self.global_input, self.personal_input = conditional_inputs(self.embeddings, torch.zeros(len(self.embeddings)))

    def begin(self, model: nn.Module, data: TrainData) -> TrainData:
        shares = class_shares(data.y, len(self.embeddings))
        self.global_input, self.personal_input = conditional_inputs(self.embeddings, shares)
        return data

    def step(self, f: Functional, state: State, batches: Sequence[Batch], lr: float) -> tuple[State, torch.Tensor]:
        """One SGD step of the model and the side modules on ``CE(φ(CoV(h, p_i)), y) + L_alg + λ L_mlg``, the
        side modules' gradients plus ``μ θ``."""
        (x, y), = batches

        def loss_of(s: State, side: State) -> tuple[torch.Tensor, torch.Tensor]:
            named = dict(zip(self.side_names, side))
            cov = {name.removeprefix("cov."): t for name, t in named.items() if name.startswith("cov.")}

            def valve(h: torch.Tensor, condition: torch.Tensor) -> torch.Tensor:
                return cast(torch.Tensor, functional_call(self.cov, cov, (h, condition), tie_weights=False, strict=True))

            h = f.with_features(s, x)[1]
            loss = self.loss_fn(f.head(s, valve(h, self.personal_input)), y)
            global_features = valve(h, self.global_input)
            guidance = (angle_loss(global_features, named["gce.weight"], y)
                        + self.lam * magnitude_loss(global_features, self.embeddings[y]))
            return loss + guidance, loss

        grads, (side_grads,), _, state, loss = f.grad(loss_of, state, self.side, has_aux=True)
        if self.mu:
            side_grads = [g + self.mu * p for g, p in zip(side_grads, self.side)]
        self.side = sgd(self.side, side_grads, lr)
        return f.with_params(state, sgd(f.params(state), grads, lr)), loss

    def end_round(self, model: nn.Module, inputs: Any = None) -> dict[str, bytes]:
        with torch.no_grad():
            for p, trained in zip(self.modules.parameters(), self.side):
                p.copy_(trained)
        return reply_entry(self.modules, LOCAL_MODULES)

    @classmethod
    def evaluation_model(cls, model: nn.Module, config: Mapping[str, Any], state: ClientState | None, train: TrainData,
                         test: Callable[[nn.Module], Any]) -> tuple[nn.Module, dict[str, float]]:
        modules = received_modules(gpfl_modules, model, config, MODULES, "GPFL")
        embeddings = cast(nn.Embedding, modules["gce"]).weight.detach()
        personal = conditional_inputs(embeddings, class_shares(train.y, len(embeddings)).to(embeddings.device))[1]
        return Valved(model, modules["cov"], personal), {}


@dataclass
class GPFL(Method, WithSideModules, SharedPart):
    """GPFL (Zhang et al. 2023): a Global Category Embedding layer and a Conditional Valve draw a global
    and a personalized feature from each sample's feature, guided toward shared class embeddings.

    Client i shares the feature extractor ``W^fe``, the CoV ``V`` and the GCE ``C`` and keeps its head
    ``W^h_i`` (here on the server, as FedPer's head); ``V`` and ``C`` travel as side modules. From the
    received GCE, the global conditional input ``g = (1/C) Σ_c e_c`` and the personalized
    ``p_i = Σ_c α_ic e_c`` (``α_i``: the client's class shares). For a feature ``f_i = W^fe(x)``, eq. (1)-(2):
    ``f^G_i = ReLU((γ + 1) ⊙ f_i + β)`` with ``{γ, β} = CoV(g; V)`` and ``f^P_i`` likewise with
    ``CoV(p_i; V)``. Local loss ``L^P_i + L^alg_i + λ L^mlg_i + μ/2 (||C||² + ||V||²)``: the personalized task
    ``L^P_i = CE(W^h_i(f^P_i), y)`` (5), the angle-level guidance ``L^alg_i = −log softmax_u(cos(f^G_i, e_u))_y``
    (3), which trains the GCE, and the magnitude-level guidance ``L^mlg_i = ||f^G_i − ê_y||₂`` (4), toward
    the received, frozen embedding ``Ĉ`` of the label. Server: sample-weighted means of the extractors, the
    GCEs and the CoVs; each head stays its client's. Clients evaluate ``W^h_i(f^P_i)``.

    λ = 0.01 and μ = 0.1, the authors' settings for the 4-layer CNN and 3-layer MLP (PFLlib's general
    defaults: 1 and 0); μ is the GCE's and CoV's SGD weight decay, as in their code. Against PFLlib and the
    authors' code: ``g`` and ``p_i`` come from the GCE the client receives, from the first round on (they
    compute them from the client's previous GCE on arrival, zero until its first aggregation). The paper
    writes ``L^mlg`` per sample without saying how a batch sums it; this is the authors' code's norm of the
    whole batch's difference, for which their λ was chosen.
    """

    name = "gpfl"
    strategy = "GPFL"
    reads_head = True
    client = GPFLClient
    group = "baseline"
    without_client_algorithm = "runs as FedPer: no category embeddings, no valve, no guidance"

    lam: float = param(0.01, key="gpfl-lambda", must=NON_NEGATIVE,
                       doc="λ, the weight of the magnitude-level guidance (authors' CNN/MLP setting: 0.01)")
    mu: float = param(0.1, key="gpfl-mu", must=NON_NEGATIVE,
                      doc="μ, the weight decay of the GCE and CoV parameters (authors' CNN/MLP setting: 0.1)")

    @classmethod
    def check_model(cls, facts: ModelFacts) -> str | None:
        return super().check_model(facts) or one_layer_refusal(facts, "a feature extractor before the head", "GPFL conditions the extractor's features")

    def shared_columns(self, layout: ParamLayout) -> slice:
        """The feature extractor: every module before the last linear layer."""
        return body_slice(layout, 1)

    def side_modules(self) -> SideModules:
        return SideModules(gpfl_modules, MODULES, LOCAL_MODULES, GPFLClient.__name__)

    def train_config(self, num_participants: int) -> Settings:
        return {LAMBDA: self.lam, MU: self.mu, **self.side_settings()}

    def evaluation_config(self) -> Settings:
        return self.side_settings()
