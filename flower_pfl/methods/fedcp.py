"""FedCP (Zhang et al., KDD 2023): separating feature information via a conditional policy."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

from flower_pfl.engine.client_algorithm import (
    Batch,
    ClientAlgorithm,
    ClientState,
    LossFn,
    batch_seeded_generator,
    setting,
)
from flower_pfl.engine.evaluation import Personalization
from flower_pfl.engine.functional import Functional, State, sgd
from flower_pfl.engine.layout import ParamLayout, load_flat_
from flower_pfl.engine.mmd import squared_mmd
from flower_pfl.engine.model_facts import ModelFacts
from flower_pfl.engine.model_split import body_slice, forward_with_features, head_module, head_slice
from flower_pfl.engine.params import NON_NEGATIVE, UNIT_INTERVAL, param
from flower_pfl.engine.server_algorithm import Settings
from flower_pfl.engine.side_modules import SideModules, WithSideModules, received_modules, reply_entry
from flower_pfl.methods.base import Method, one_layer_refusal
from flower_pfl.methods.fedper import SharedPart

#: config keys: the MMD weight λ, the received global head's share in the uploaded head, and the global
#: head and CPN (float32 bytes, ``cpn_modules``' layout)
LAMBDA, HEAD_MIX, MODULES = "fedcp-lambda", "fedcp-head-mix", "fedcp-modules"
#: reply key: the client's head to upload (into the global head) and its trained CPN
LOCAL_MODULES = "fedcp-local-modules"
#: the RBF kernels' bandwidths of the MMD (the authors' code)
BANDWIDTHS = (10.0, 15.0, 20.0, 50.0)


def cpn_modules(features: int, classes: int) -> nn.ModuleDict:
    """FedCP's side modules: the global head ``W^hd`` (a linear layer like the model's own) and the
    Conditional Policy Network ``Θ``: ``Linear(d, 2d)``, ``LayerNorm(2d)``, ``ReLU``."""
    return nn.ModuleDict({
        "head": nn.Linear(features, classes),
        "cpn": nn.Sequential(nn.Linear(features, 2 * features), nn.LayerNorm(2 * features), nn.ReLU()),
    })


def mmd(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """FedCP's squared MMD: kernels ``exp(−||a − b||² / (2σ))`` for the authors' ``σ`` in ``BANDWIDTHS``."""
    return squared_mmd(x, y, [2 * s for s in BANDWIDTHS])


def policy(cpn: Callable[[torch.Tensor], torch.Tensor], h: torch.Tensor, context: torch.Tensor,
           noise: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The conditional policy ``(r_i, s_i)``, each ``(n, d)`` with ``r + s = 1``: the CPN on ``h ⊙ v̂_i``
    (``v̂_i``: the client's conditional input, unit length) gives two logits per feature, softmaxed
    across the pair; ``noise`` (Gumbel samples, training) makes it a Gumbel-Softmax with τ = 1."""
    z = cpn(h * F.normalize(context, dim=0)).view(len(h), 2, -1)
    p = torch.softmax(z if noise is None else z + noise, dim=1)
    return p[:, 0], p[:, 1]


def gumbel(shape: torch.Size, generator: torch.Generator, device: torch.device) -> torch.Tensor:
    """Standard Gumbel samples ``−log E``, ``E ~ Exp(1)``, drawn from a CPU ``generator`` (the same
    numbers whatever the model's device) and moved to ``device``."""
    return (-torch.empty(shape, device="cpu").exponential_(generator=generator).log()).to(device)


def conditional_input(model: nn.Module) -> torch.Tensor:
    """``v_i``: the sum of the rows of the client's personalized head's weight (one per class)."""
    return head_module(model).weight.detach().sum(0)


def separated_logits(model: nn.Module, modules: nn.ModuleDict, x: torch.Tensor, context: torch.Tensor,
                     noise: Callable[[torch.Size], torch.Tensor] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``W^hd_i(r ⊙ h) + W^hd(s ⊙ h)``, ``h`` the model's representation (returned too): the personalized
    part through the model's own head, the global part through the global head."""
    h = forward_with_features(model, x)[1]
    shape = torch.Size((len(h), 2, h.shape[1]))
    r, s = policy(modules["cpn"], h, context, None if noise is None else noise(shape))
    return head_module(model)(h * r) + modules["head"](h * s), h


class Separated(Personalization):
    """FedCP's predictor for evaluation: the deterministic policy (no Gumbel noise)."""

    context: torch.Tensor

    def __init__(self, model: nn.Module, modules: nn.ModuleDict) -> None:
        super().__init__()
        self.model, self.modules_ = model, modules
        self.register_buffer("context", conditional_input(model).clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return separated_logits(self.model, self.modules_, x, self.context)[0]


class FedCPClient(ClientAlgorithm):
    """FedCP's client: per minibatch one SGD step of the feature extractor, the personalized head and the
    CPN on ``CE(W^hd_i(r ⊙ h) + W^hd(s ⊙ h), y) + λ MMD²(h, h^g)`` (``h^g``: the received extractor's
    features, frozen; the global head frozen); then it returns the head ``(1 − m) W^hd_i + m W^hd``
    (``m``: ``fedcp-head-mix``) and its CPN. The CPN's parameters (``cpn``) train beside the model; Gumbel
    noise (``draw``) from a generator seeded by its first minibatch and the round (the same on every device)."""

    name = "fedcp"
    hookable = False
    reply_keys = (LOCAL_MODULES,)
    carried = ("cpn",)
    batched_state = ("context", "global_head", "extractor")
    drawn = ("noise",)

    def __init__(self, model: nn.Module, config: Mapping[str, Any], state: ClientState | None = None,
                 loss_fn: LossFn = F.cross_entropy) -> None:
        super().__init__(model, config, state, loss_fn)
        self.lam = float(setting(config, LAMBDA, "FedCP"))
        if not self.lam >= 0:
            raise ValueError(f"FedCP's lambda must be >= 0, got {self.lam}")
        self.mix = float(setting(config, HEAD_MIX, "FedCP"))
        if not 0 <= self.mix <= 1:
            raise ValueError(f"FedCP's head mix must lie in [0, 1], got {self.mix}")
        self.modules = received_modules(cpn_modules, model, config, MODULES, "FedCP")
        self.modules["head"].requires_grad_(False)
        self.global_head = [p.detach().clone() for p in self.modules["head"].parameters()]
        self.head_names = [name for name, _ in self.modules["head"].named_parameters()]
        #: the CPN's parameters being trained, and their names
        self.cpn = [p.detach().clone() for p in self.modules["cpn"].parameters()]
        self.cpn_names = [name for name, _ in self.modules["cpn"].named_parameters()]
        self.extractor = [t.clone() for t in Functional(model).state()]  # the received model's state, frozen
        self.context = conditional_input(model)
        self.features = head_module(model).in_features
        self.generator: torch.Generator | None = None  # from the first minibatch (``batch_seeded_generator``)
        self.noise = torch.zeros(0, device=self.context.device)  # the step's Gumbel noise (``draw``)

    def draw(self, batches: Sequence[Batch]) -> None:
        """The step's Gumbel noise, ``(n, 2, d)``."""
        (x, y), = batches
        generator = self.generator = self.generator or batch_seeded_generator(x, y, self.config)
        self.noise = gumbel(torch.Size((len(x), 2, self.features)), generator, x.device)

    def step(self, f: Functional, state: State, batches: Sequence[Batch], lr: float) -> tuple[State, torch.Tensor]:
        """One SGD step of the model and the CPN on ``CE(W^hd_i(r ⊙ h) + W^hd(s ⊙ h), y) + λ MMD²(h, h^g)``."""
        (x, y), = batches
        h_global = None
        if self.lam:
            with f.evaluating():
                h_global = f.with_features(self.extractor, x)[1]
        global_head = dict(zip(self.head_names, self.global_head))

        def loss_of(s: State, cpn: State) -> tuple[torch.Tensor, torch.Tensor]:
            network = dict(zip(self.cpn_names, cpn))
            h = f.with_features(s, x)[1]
            r, s_share = policy(lambda v: functional_call(self.modules["cpn"], network, (v,), tie_weights=False, strict=True),
                                h, self.context, self.noise)
            logits = f.head(s, h * r) + functional_call(self.modules["head"], global_head, (h * s_share,),
                                                              tie_weights=False, strict=True)
            loss = self.loss_fn(logits, y)
            return (loss if h_global is None else loss + self.lam * mmd(h, h_global)), loss

        grads, (cpn_grads,), _, state, loss = f.grad(loss_of, state, self.cpn, has_aux=True)
        self.cpn = sgd(self.cpn, cpn_grads, lr)
        return f.with_params(state, sgd(f.params(state), grads, lr)), loss

    def end_round(self, model: nn.Module, inputs: Any = None) -> dict[str, bytes]:
        with torch.no_grad():
            for p, trained in zip(self.modules["cpn"].parameters(), self.cpn):
                p.copy_(trained)
            for mine, received, upload in zip(head_module(model).parameters(), self.global_head, self.modules["head"].parameters()):
                upload.copy_((1 - self.mix) * mine + self.mix * received)
        return reply_entry(self.modules, LOCAL_MODULES)

    @classmethod
    def evaluation_model(cls, model: nn.Module, config: Mapping[str, Any], state: ClientState | None, train: Any,
                         test: Callable[[nn.Module], Any]) -> tuple[nn.Module, dict[str, float]]:
        return Separated(model, received_modules(cpn_modules, model, config, MODULES, "FedCP")), {}


@dataclass
class FedCP(Method, WithSideModules, SharedPart):
    """FedCP (Zhang et al. 2023): a conditional policy network splits each sample's features into a
    global part, for a shared global head, and a personalized part, for the client's own head.

    Client i's model is the shared feature extractor ``W^fe`` with its personalized head ``W^hd_i`` (kept
    on the server, as FedPer's head); beside it the global head ``W^hd`` and the Conditional Policy
    Network ``Θ`` (CPN) travel as side modules. The conditional input ``v_i`` is the sum of the rows of
    ``W^hd_i``; for a feature ``h = f(x; W^fe)``, ``{r_i, s_i} = GumbelSoftmax(CPN(h ⊙ v_i/||v_i||; Θ))``
    (τ = 1, two logits per feature, ``r_i + s_i = 1``), and the output is
    ``W^hd_i(r_i ⊙ h) + W^hd(s_i ⊙ h)``. Local loss ``CE + λ MMD²(h, h^g)``, ``h^g`` the features of the
    received (frozen) extractor, RBF kernels of bandwidths 10, 15, 20, 50; the global head is frozen
    while the extractor, ``W^hd_i`` and ``Θ`` train. Server: sample-weighted means of the extractors, of
    the CPNs and of the uploaded personalized heads, which make the next global head; each ``W^hd_i``
    stays its client's.

    The paper's roles: extractor and CPN "upload, overwrite, train", global head "overwrite, freeze",
    personalized head "upload, train". λ = 5 as the authors' run script (PFLlib's general default is 1).
    Against PFLlib and the authors' code, which upload ``(W^hd_i + W^hd)/2``, the paper's clients upload
    their personalized head (``fedcp-head-mix`` = 0, the default; 0.5 is their code). Against PFLlib: ``v_i``
    comes from the client's head from the first round on (PFLlib draws it at random until the client's
    first aggregation); a participant starts from the current global head and CPN (PFLlib's clients keep
    those of the last round they took part in); evaluation takes the policy without Gumbel noise (PFLlib
    samples it in evaluation too), so that a client's accuracy does not vary with the draw.
    """

    name = "fedcp"
    strategy = "FedCP"
    reads_head = True
    client = FedCPClient
    group = "baseline"
    without_client_algorithm = "runs as FedPer: no policy network, no global head, no MMD"

    lam: float = param(5.0, key="fedcp-lambda", must=NON_NEGATIVE,
                       doc="λ, the weight of the MMD between the local and the received extractor's features (authors' script: 5)")
    head_mix: float = param(0.0, key="fedcp-head-mix", must=UNIT_INTERVAL,
                            doc="share of the received global head in the head a client uploads (0: its personalized "
                                "head, as the paper; 0.5: PFLlib and the authors' code)")

    @classmethod
    def check_model(cls, facts: ModelFacts) -> str | None:
        return super().check_model(facts) or one_layer_refusal(facts, "a feature extractor before the head", "FedCP splits features from an extractor")

    def shared_columns(self, layout: ParamLayout) -> slice:
        """The feature extractor: every module before the last linear layer."""
        return body_slice(layout, 1)

    def side_modules(self) -> SideModules:
        return SideModules(cpn_modules, MODULES, LOCAL_MODULES, FedCPClient.__name__)

    def initial_side_modules(self, modules: nn.ModuleDict, layout: ParamLayout, initial: torch.Tensor) -> nn.ModuleDict:
        """The global head starts as the model's head (the personalized heads' start too)."""
        load_flat_(modules["head"], initial.to(torch.float32).cpu()[head_slice(layout, 1)])
        return modules

    def train_config(self, num_participants: int) -> Settings:
        return {LAMBDA: self.lam, HEAD_MIX: self.head_mix, **self.side_settings()}

    def evaluation_config(self) -> Settings:
        return self.side_settings()
