"""FedAS (Yang, Huang, Ye, CVPR 2024): federated parameter-alignment and client-synchronization."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from flower_pfl.engine.client_algorithm import (
    BATCH_SIZE,
    ClientAlgorithm,
    ClientState,
    LossFn,
    TrainData,
    setting,
    trainable,
)
from flower_pfl.engine.layout import ParamLayout, flatten_module, load_flat_
from flower_pfl.engine.model_facts import ModelFacts
from flower_pfl.engine.model_split import body_slice, forward_with_features, head_flags, head_module
from flower_pfl.engine.params import AT_LEAST_ONE, NON_NEGATIVE_INT, POSITIVE, param
from flower_pfl.engine.reply_checks import AlgorithmOutputMissing, Reply, norm
from flower_pfl.engine.server_algorithm import ClientId, Settings
from flower_pfl.engine.wire import decode_flat, encode_vector
from flower_pfl.methods.base import Method, one_layer_refusal
from flower_pfl.methods.fedper import SharedPart
from flower_pfl.methods.knnper import features_of

#: config keys: the global body (bytes, ``encode_vector``), the alignment's step size, passes and batch size
GLOBAL_BODY, ALIGN_LR, ALIGN_EPOCHS, ALIGN_BATCH = ("fedas-global-body", "fedas-alignment-lr", "fedas-alignment-epochs",
                                                    "fedas-alignment-batch-size")
#: reply key: the trace of the Fisher information of each tensor of the trained model's ``state_dict``, a
#: mean over minibatches (bytes, ``encode_vector``; 0 for buffers)
FISHER = "fedas-fisher-traces"


def class_prototypes(features: torch.Tensor, y: torch.Tensor, classes: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``z̄_c``, the mean of the ``(n, h)`` ``features`` of each class ``c`` (``(C, h)``), and which classes
    occur in ``y``."""
    counts = torch.bincount(y, minlength=classes).to(features.dtype)
    sums = features.new_zeros((classes, features.shape[1])).index_add_(0, y, features)
    return sums / counts.clamp_min(1)[:, None], counts > 0


def alignment_loss(features: torch.Tensor, y: torch.Tensor, prototypes: torch.Tensor, present: torch.Tensor) -> torch.Tensor:
    """``Σ_c mean_{n: y_n = c} ||f(x_n) − z̄_c||² / h`` over the classes of the batch that have a prototype:
    each class's mean squared error to its prototype, summed over classes (PFLlib's)."""
    errors = ((features - prototypes[y]) ** 2).mean(1) * present[y].to(features.dtype)
    counts = torch.bincount(y, minlength=len(prototypes)).to(features.dtype)
    per_class = features.new_zeros(len(prototypes)).index_add_(0, y, errors)
    return (per_class / counts.clamp_min(1)).sum()


def fisher_traces(model: nn.Module, data: TrainData, batch_size: int) -> torch.Tensor:
    """The trace of the empirical Fisher information of each tensor of ``model``'s ``state_dict`` (0 for
    buffers): ``mean_b ||∇_θ NLL_b||²`` over consecutive minibatches ``b`` of ``batch_size`` examples,
    ``NLL_b`` the batch's mean negative log-likelihood of its labels (PFLlib and FL-bench sum over the
    minibatches instead), with the model in evaluation mode."""
    was_training = model.training
    model.eval()
    named = {name: p for name, p in model.named_parameters() if p.requires_grad}
    params = list(named.values())
    sums = [torch.zeros((), device=p.device) for p in params]
    for start in range(0, len(data.y), batch_size):
        x, y = data.x[start:start + batch_size], data.y[start:start + batch_size]
        grads = torch.autograd.grad(F.cross_entropy(model(x), y), params, allow_unused=True)
        for i, g in enumerate(grads):
            if g is not None:
                sums[i] += (g.detach() ** 2).sum()
    model.train(was_training)
    batches = -(-len(data.y) // batch_size)
    by_name = {name: total / batches for name, total in zip(named, sums)}
    return torch.stack([by_name.get(name, torch.zeros(())).float().cpu() for name in model.state_dict()])


class FedASClient(ClientAlgorithm):
    """FedAS's client: before the round's steps (``begin``, on the whole training split), the class
    prototypes of its own model (the one it was sent), the global body put in place of its body and
    aligned to those prototypes; then plain local SGD of the whole model (a round's clients train as one
    computation); after them, the Fisher traces of the trained model (``end_round``). Needs the package's
    ClientApp (the split)."""

    name = "fedas"
    hookable = False
    reply_keys = (FISHER,)

    def __init__(self, model: nn.Module, config: Mapping[str, Any], state: ClientState | None = None,
                 loss_fn: LossFn = F.cross_entropy) -> None:
        super().__init__(model, config, state, loss_fn)
        self.align_lr = float(setting(config, ALIGN_LR, "FedAS"))
        self.align_epochs = int(setting(config, ALIGN_EPOCHS, "FedAS"))
        self.align_batch = int(setting(config, ALIGN_BATCH, "FedAS"))
        if not (self.align_lr > 0 and self.align_epochs >= 0 and self.align_batch >= 1):
            raise ValueError(f"FedAS needs alignment lr > 0, epochs >= 0 and batch size >= 1, got "
                             f"{self.align_lr}, {self.align_epochs}, {self.align_batch}")
        self.body = body_slice(ParamLayout.from_module(model), 1)
        self.global_body = decode_flat(setting(config, GLOBAL_BODY, "FedAS"), self.body.stop, GLOBAL_BODY)
        self.fisher_batch = int(config.get(BATCH_SIZE, self.align_batch))
        self.labels: torch.Tensor | None = None

    def begin(self, model: nn.Module, data: TrainData) -> TrainData:
        self.labels = data.y
        prototypes, present = self.prototypes(model, data)
        flat = flatten_module(model)
        flat[self.body] = self.global_body.to(flat.device)
        load_flat_(model, flat)  # the global body with the client's own head
        self.align(model, data, prototypes, present)
        return data

    def prototypes(self, model: nn.Module, data: TrainData) -> tuple[torch.Tensor, torch.Tensor]:
        """The class prototypes of the client's own model, ``z̄_c = mean_{y_n = c} f_i(x_n)`` (evaluation mode)."""
        was_training = model.training
        model.eval()
        features = features_of(model, data.x)
        model.train(was_training)
        return class_prototypes(features, data.y, head_module(model).out_features)

    def align(self, model: nn.Module, data: TrainData, prototypes: torch.Tensor, present: torch.Tensor) -> None:
        """Parameter alignment: ``align_epochs`` passes of SGD (step ``align_lr``) over consecutive minibatches
        of the split on the body alone, descending ``alignment_loss`` of the model's features."""
        body = [p for p, head in zip(trainable(model), head_flags(model, 1)) if not head]
        for _ in range(self.align_epochs):
            for start in range(0, len(data.y), self.align_batch):
                x, y = data.x[start:start + self.align_batch], data.y[start:start + self.align_batch]
                loss = alignment_loss(forward_with_features(model, x)[1], y, prototypes, present)
                grads = torch.autograd.grad(loss, body, allow_unused=True)
                with torch.no_grad():
                    for p, g in zip(body, grads):
                        if g is not None:
                            p.sub_(self.align_lr * g)

    def end_round(self, model: nn.Module, inputs: Any = None) -> dict[str, bytes]:
        if self.labels is None or not isinstance(inputs, torch.Tensor):
            raise ValueError("FedAS's client needs its whole training split: run it in client_apps.app's ClientApp")
        return {FISHER: encode_vector(fisher_traces(model, TrainData(inputs, self.labels), self.fisher_batch))}


@dataclass
class FedAS(Method, SharedPart):
    """FedAS (Yang et al. 2024): each client aligns the received global body to the class prototypes of
    its own model before training, and the server averages the bodies weighted by the clients' Fisher
    information.

    The model is a body (shared) and a head (its last layer, personal). Federated parameter-alignment:
    client ``i`` computes the prototypes ``z̄_c = mean_{y = c} f(x; θ_i)`` of its own model ``θ_i`` (the
    one it trained last), puts the global body ``φ_g`` in place of its body and takes ``E`` passes of SGD
    (step ``η_a``, minibatches of ``B_a``) on the body alone on
    ``L_align = Σ_c mean_{y_n = c} ||f(x_n; φ_g) − z̄_c||² / h``, then trains the whole model with local
    SGD. Client-synchronization: it returns the traces of the empirical Fisher information of its
    trained model's tensors, summing to ``tr(F_i) = mean_b ||∇_θ NLL_b(θ_i)||²`` over the minibatches
    ``b`` of its split, and the server makes ``φ_g = Σ_i n_i tr(F_i) φ_i / Σ_j n_j tr(F_j)`` over the
    round's participants, ``n_i`` their sample counts (a round whose traces are all 0 falls back to
    sample counts). Clients evaluate the model they trained last.

    As PFLlib's: the loss is each class's mean squared error to its prototype (FL-bench:
    the error of the class's mean feature), one pass of step 0.01 in minibatches of 16 (FL-bench: the
    training batch size), the head kept by the client (FL-bench sends the global head too), and a client that
    never trained starts from the initial model (FL-bench: from the global one); PFLlib averages the
    whole model with the traces but only ever uses the body of that average, so only the body is kept.
    Both references weight by ``Σ_b ||∇_θ NLL_b||²``, the sum over the minibatches: ``n_i tr(F_i)`` is
    the same weight up to the batch size (exactly, with full minibatches), but the trace a client
    returns does not grow with its data, so the round's median bounds it whatever the clients' sizes
    (``ReplyBounds``), and its sample count is capped as every count is. The minibatches of the
    alignment and of the traces are consecutive slices of the split (the references shuffle).
    """

    name = "fedas"
    strategy = "FedAS"
    reads_head = True
    client = FedASClient
    default_clients_per_round = 10
    without_client_algorithm = "cannot run: every reply lacks the Fisher traces"

    align_lr: float = param(0.01, key="fedas-alignment-lr", must=POSITIVE,
                            doc="step η_a of the parameter alignment's SGD (PFLlib's and FL-bench's 0.01)")
    align_epochs: int = param(1, key="fedas-alignment-epochs", must=NON_NEGATIVE_INT,
                              doc="passes E of the alignment over the client's split (0: no alignment; both references: 1)")
    align_batch: int = param(16, key="fedas-alignment-batch-size", must=AT_LEAST_ONE,
                             doc="minibatch size B_a of the alignment (PFLlib's 16)")
    fisher_weights: bool = param(True, key="fedas-fisher-weights",
                                 doc="weight the bodies by the Fisher traces (False: by sample counts, the paper's ablation)")

    @classmethod
    def check_model(cls, facts: ModelFacts) -> str | None:
        return super().check_model(facts) or one_layer_refusal(facts, "a model with a body besides its head", "there is no body to align")

    def shared_columns(self, layout: ParamLayout) -> slice:
        return body_slice(layout, 1)

    def own_columns(self, layout: ParamLayout) -> None:
        """Every column: a client aligns, and evaluates, the model it trained last, body included."""
        return None

    def personalize(self, models: torch.Tensor, layout: ParamLayout) -> tuple[torch.Tensor, None]:
        """Each participant's own model (the global body travels in its settings)."""
        return models, None

    def models_for_evaluation(self, ids: Sequence[ClientId]) -> torch.Tensor:
        """The model each client trained last."""
        return self.stored(ids)

    def train_config(self, num_participants: int) -> Settings:
        return {ALIGN_LR: self.align_lr, ALIGN_EPOCHS: self.align_epochs, ALIGN_BATCH: self.align_batch,
                GLOBAL_BODY: encode_vector(self.base)}

    def check_extras(self, extras: Mapping[str, Any]) -> torch.Tensor:
        """The Fisher traces: one finite value >= 0 per tensor of the model."""
        if FISHER not in extras:
            raise AlgorithmOutputMissing(f"the reply lacks '{FISHER}' (FedAS's Fisher traces)", FedASClient.__name__)
        traces = decode_flat(extras[FISHER], len(self.layout.names), FISHER)
        if not torch.isfinite(traces).all():
            raise ValueError(f"'{FISHER}' holds NaN or Inf")
        if (traces < 0).any():
            raise ValueError(f"'{FISHER}': a trace of the Fisher information cannot be negative")
        return traces

    def example_extras(self, generator: torch.Generator) -> dict[str, bytes]:
        return {FISHER: encode_vector(torch.rand(len(self.layout.names), generator=generator))}

    def update_norms(self, reply: Reply, sent: torch.Tensor) -> dict[str, tuple[float, float]]:
        """The model's change, and the traces against the round's median."""
        return {**super().update_norms(reply, sent), FISHER: (norm(reply.extras), 0.0)}

    def share_weights(self, replies: Sequence[Reply]) -> list[float]:
        """``n_i tr(F_i)``: each participant's summed traces times its sample count (sample counts without
        Fisher weights, or when all traces are 0)."""
        traces = [float(r.extras.double().sum()) * r.num_examples for r in replies]
        return traces if self.fisher_weights and sum(traces) > 0 else super().share_weights(replies)
