"""FedProto (Tan et al. 2022): clients share class prototypes instead of models."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from flower_pfl.engine.client_algorithm import Batch, ClientAlgorithm, ClientState, LossFn, TrainData, setting
from flower_pfl.engine.feature_stats import aggregate_prototypes, prototype_loss
from flower_pfl.engine.functional import Functional, State, sgd
from flower_pfl.engine.layout import ParamLayout
from flower_pfl.engine.model_split import forward_with_features, head_module
from flower_pfl.engine.params import NON_NEGATIVE, param
from flower_pfl.engine.reply_checks import AlgorithmOutputMissing, Reply, norm
from flower_pfl.engine.server_algorithm import PersonalizedAlgorithm, Settings
from flower_pfl.engine.wire import decode_flat, encode_vector
from flower_pfl.methods.base import Method
from flower_pfl.methods.moon import needs_batch

#: config keys: FedProto's λ and the global prototypes (bytes, ``encode_prototypes``: a flag per class,
#: then the prototypes; absent until there are any)
LAMBDA, PROTOTYPES = "fedproto-lambda", "fedproto-prototypes"
#: reply key: the client's prototypes (bytes, ``encode_prototypes``: each class's share of the samples, then the prototypes)
LOCAL_PROTOTYPES = "fedproto-local-prototypes"
#: evaluation metric: accuracy of the nearest global prototype to the model's representation
PROTOTYPE_ACCURACY = "prototype-accuracy"


def encode_prototypes(weights: torch.Tensor, prototypes: torch.Tensor) -> bytes:
    """``(C,)`` per-class weights and ``(C, d)`` prototypes as one float32 vector."""
    return encode_vector(torch.cat([weights.flatten(), prototypes.flatten()]))


def decode_prototypes(data: Any, classes: int, dim: int, name: str = "") -> tuple[torch.Tensor, torch.Tensor]:
    """``encode_prototypes``' bytes back as ``(C,)`` weights and ``(C, d)`` prototypes (``ValueError`` otherwise)."""
    flat = decode_flat(data, classes * (1 + dim), name)
    return flat[:classes], flat[classes:].view(classes, dim)


class PrototypeClassifier(nn.Module):
    """A model's representation classified by its nearest global prototype (logits: minus the squared
    distances; a class without a prototype is never chosen)."""

    def __init__(self, model: nn.Module, prototypes: torch.Tensor, known: torch.Tensor) -> None:
        super().__init__()
        self.model, self.prototypes, self.known = model, prototypes, known

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = forward_with_features(self.model, x)[1]
        distances = torch.cdist(z, self.prototypes.to(z)).pow(2)
        return torch.where(self.known.to(z.device), -distances, torch.finfo(z.dtype).min / 2)


class FedProtoClient(ClientAlgorithm):
    """FedProto's client: per minibatch, the gradient of ``λ mean_n ||f(x_n) − C̄^(y_n)||² / d`` is added to
    the loop's supervised gradient (``f``: the input of the model's last linear layer), and each
    sample's ``f(x_n)`` is added to its class's prototype; ``finish`` returns the class prototypes
    with each class's share of the samples (``fedproto-local-prototypes``).

    The package's loop runs ``step`` (one pass for both terms; the per-class sums and counts carried from
    step to step, so a round's clients train as one computation); a user's loop runs ``gradient_terms``
    (an extra pass); both through ``_pull`` and ``_accumulated``. Without global prototypes the global
    ones are zeros that no class holds (``known`` all false) and there is no pull."""

    name = "fedproto"
    reply_keys = (LOCAL_PROTOTYPES,)
    carried = ("sums", "counts")
    batched_state = ("prototypes", "known")

    def __init__(self, model: nn.Module, config: Mapping[str, Any], state: ClientState | None = None,
                 loss_fn: LossFn = F.cross_entropy) -> None:
        super().__init__(model, config, state, loss_fn)
        self.lam = float(setting(config, LAMBDA, "FedProto"))
        if not self.lam >= 0:
            raise ValueError(f"FedProto's lambda must be >= 0, got {self.lam}")
        self.model = model  # the model being trained: its representation is differentiated
        received = received_prototypes(model, config)
        head, device = head_module(model), self.received[0].device
        #: whether the server sent global prototypes (the pull's there only then)
        self.pulls = received is not None
        self.prototypes, self.known = received if received is not None else (
            torch.zeros(head.out_features, head.in_features, device=device),
            torch.zeros(head.out_features, dtype=torch.bool, device=device))
        self.sums = torch.zeros(head.out_features, head.in_features, device=device)
        self.counts = torch.zeros(head.out_features, device=device)

    def _pull(self, z: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """``λ mean_n ||z_n − C̄^(y_n)||² / d`` (0 without global prototypes)."""
        return self.lam * prototype_loss(z, y, self.prototypes, self.known) if self.pulls else z.new_zeros(())

    def _accumulated(self, z: torch.Tensor, y: torch.Tensor) -> None:
        """Each sample's representation into its class's sum, and the sample into its class's count."""
        self.sums = self.sums.index_add(0, y, z)
        self.counts = self.counts.index_add(0, y, torch.ones_like(y, dtype=self.counts.dtype))

    def step(self, f: Functional, state: State, batches: Sequence[Batch], lr: float) -> tuple[State, torch.Tensor]:
        """The SGD step on the supervised loss plus the pull, and the minibatch's representations (by the
        model before the step) into the prototypes' sums."""
        (x, y), = batches

        def loss_of(w: State) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
            logits, z = f.with_features(w, x)
            supervised = self.loss(logits, y)
            return supervised + self._pull(z, y), (supervised, z)

        grads, _, _, state, (loss, z) = f.grad(loss_of, state, has_aux=True)
        self._accumulated(z, y)
        return f.with_params(state, sgd(f.params(state), grads, lr)), loss

    def gradient_terms(self, params: Sequence[torch.Tensor], batch: Batch | None) -> Sequence[torch.Tensor | None]:
        x, y = needs_batch(batch, "FedProto")
        f = Functional(self.model)

        def pull(w: State) -> tuple[torch.Tensor, torch.Tensor]:
            z = f.with_features(w, x)[1]
            return self._pull(z, y), z

        # an extra pass beside the loop's: the running statistics it updates (copies) are dropped
        grads, _, _, _, z = f.grad(pull, f.with_params(f.state(), params), has_aux=True)
        self._accumulated(z, y)
        return grads if self.pulls else []

    def end_round(self, model: nn.Module, inputs: Any = None) -> dict[str, bytes]:
        if self.steps < 1:
            raise ValueError("FedProto's prototypes need at least one step")
        prototypes = self.sums / self.counts.clamp_min(1)[:, None]
        return {LOCAL_PROTOTYPES: encode_prototypes(self.counts / self.counts.sum(), prototypes)}

    @classmethod
    def evaluation_model(cls, model: nn.Module, config: Mapping[str, Any], state: ClientState | None, train: TrainData,
                         test: Callable[[nn.Module], Any]) -> tuple[nn.Module, dict[str, float]]:
        """The received model, and the accuracy of classifying its representation by the nearest global prototype."""
        received = received_prototypes(model, config)
        if received is None:
            return model, {}
        return model, {PROTOTYPE_ACCURACY: float(test(PrototypeClassifier(model, *received)).accuracy)}


def received_prototypes(model: nn.Module, config: Mapping[str, Any]) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The global prototypes and which classes have one, from an instruction (``None``: none sent)."""
    if PROTOTYPES not in config:
        return None
    head = head_module(model)
    flags, prototypes = decode_prototypes(config[PROTOTYPES], head.out_features, head.in_features, PROTOTYPES)
    device = head.weight.device
    return prototypes.to(device), (flags > 0).to(device)


@dataclass
class FedProto(Method, PersonalizedAlgorithm):
    """FedProto (Tan et al. 2022): every client keeps its own model and shares class prototypes (mean
    representations), pulled toward the server's global prototype of each class.

    Client ``i`` (Algorithm 1): local SGD on ``L_S(F_i(x), y) + λ ||f_i(x) − C̄^(y)||² / d`` from its
    own model (``f_i``: the input of the last linear layer, of size ``d``; no pull before there are
    global prototypes); its prototypes ``C_i^(j)`` are the means of ``f_i(x)`` per class. Server:
    ``C̄^(j) = Σ_i |D_i,j| C_i^(j) / Σ_i |D_i,j|`` over the round's participants holding class ``j``
    (clients report class shares, multiplied by their checked ``num-examples``); a class that no
    participant held keeps its last global prototype (the paper has every client take part). Clients evaluate
    their model's output and report ``prototype-accuracy``, the nearest global prototype's.

    Against the paper: its aggregation carries an extra ``1/|N_j|`` that would shrink prototypes
    with the number of clients (the authors' code, PFLlib and FL-bench: unweighted means); it leaves
    the distance open (this is its authors' mean squared error, so their λ carries over); it defines
    prototypes over the whole training set after training, but the client algorithm sees labels only in
    its minibatches, so they are the means over the round's minibatches, as in the authors' code,
    PFLlib and FL-bench. PFLlib reports only the prototype accuracy, FL-bench only the model's.
    """

    name = "fedproto"
    strategy = "FedProto"
    reads_head = True
    client = FedProtoClient
    default_clients_per_round = 10
    state_attributes = ("prototypes", "known")

    lam: float = param(1.0, key="fedproto-lambda", must=NON_NEGATIVE, doc="weight λ of the pull toward the global prototypes")

    def setup(self, layout: ParamLayout, initial: torch.Tensor, device: torch.device, seed: int = 0) -> None:
        super().setup(layout, initial, device, seed)
        last = next((shape for shape in reversed(layout.shapes) if len(shape) == 2), None)
        if last is None:
            raise ValueError(f"FedProto needs a last linear layer (a weight matrix) for its prototypes; shapes {list(layout.shapes)}")
        self.classes, self.dim = last
        self.prototypes, self.known = torch.zeros(self.classes, self.dim), torch.zeros(self.classes, dtype=torch.bool)

    def personalize(self, models: torch.Tensor, layout: ParamLayout) -> tuple[torch.Tensor, None]:
        return models, None

    def _prototype_settings(self) -> Settings:
        return {PROTOTYPES: encode_prototypes(self.known.float(), self.prototypes)} if self.known.any() else {}

    def train_config(self, num_participants: int) -> Settings:
        return {LAMBDA: self.lam, **self._prototype_settings()}

    def evaluation_config(self) -> Settings:
        return self._prototype_settings()

    def check_extras(self, extras: Mapping[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
        """The client's class shares (in [0, 1], summing to 1) and ``(C, d)`` prototypes, all finite."""
        if LOCAL_PROTOTYPES not in extras:
            raise AlgorithmOutputMissing(f"the reply lacks '{LOCAL_PROTOTYPES}' (FedProto's prototypes)", FedProtoClient.__name__)
        shares, prototypes = decode_prototypes(extras[LOCAL_PROTOTYPES], self.classes, self.dim, LOCAL_PROTOTYPES)
        if not (torch.isfinite(shares).all() and torch.isfinite(prototypes).all()):
            raise ValueError(f"'{LOCAL_PROTOTYPES}' holds NaN or Inf")
        if (shares < 0).any() or (shares > 1).any() or abs(float(shares.sum()) - 1) > 1e-3:
            raise ValueError(f"'{LOCAL_PROTOTYPES}': the class shares must lie in [0, 1] and sum to 1")
        return shares, prototypes

    def example_extras(self, generator: torch.Generator) -> dict[str, bytes]:
        shares = torch.rand(self.classes, generator=generator)
        prototypes = torch.randn(self.classes, self.dim, generator=generator)
        return {LOCAL_PROTOTYPES: encode_prototypes(shares / shares.sum(), prototypes)}

    def update_norms(self, reply: Reply, sent: torch.Tensor) -> dict[str, tuple[float, float]]:
        """The model's change, and the prototypes against the round's median."""
        return {**super().update_norms(reply, sent), LOCAL_PROTOTYPES: (norm(reply.extras[1]), 0.0)}

    def aggregate(self, server_round: int, replies: Sequence[Reply]) -> None:
        super().aggregate(server_round, replies)
        weights = torch.stack([r.extras[0] * r.num_examples for r in replies])
        prototypes, known = aggregate_prototypes(weights, torch.stack([r.extras[1] for r in replies]))
        # a class no participant held this round keeps its last global prototype
        self.prototypes = torch.where(known[:, None], prototypes, self.prototypes)
        self.known = self.known | known
