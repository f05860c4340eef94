"""FedBABU (Oh, Kim, Yun 2022): train and share only the body; fine-tune the head at evaluation."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from flower_pfl.engine.client_algorithm import Batch, ClientAlgorithm, ClientState, LossFn, TrainData, setting, trainable
from flower_pfl.engine.client_metrics import GLOBAL_ACCURACY
from flower_pfl.engine.layout import ParamLayout
from flower_pfl.engine.minibatches import MinibatchStream
from flower_pfl.engine.model_facts import ModelFacts
from flower_pfl.engine.model_split import drop_frozen, head_flags, head_slice
from flower_pfl.engine.params import AT_LEAST_ONE, NON_NEGATIVE_INT, POSITIVE, one_of, param
from flower_pfl.engine.reply_checks import Reply
from flower_pfl.engine.server_algorithm import GlobalModelAlgorithm, Settings, weighted_mean
from flower_pfl.methods.base import Method, one_layer_refusal

#: config keys: the frozen head's size in modules (training and evaluation); the fine-tuning at evaluation
HEAD_LAYERS = "fedbabu-head-layers"
FINETUNE_STEPS, FINETUNE_LR = "fedbabu-finetune-steps", "fedbabu-finetune-lr"
FINETUNE_BATCH, FINETUNE_PART = "fedbabu-finetune-batch-size", "fedbabu-finetune-part"
#: seed of the fine-tuning minibatches (the same on every client and every evaluation: reproducible)
FINETUNE_SEED = 0


def fine_tune(model: nn.Module, train: TrainData, *, steps: int, lr: float, batch_size: int, frozen: Sequence[bool]) -> None:
    """``steps`` plain SGD steps of size ``lr`` on fresh minibatches of the training split (never the
    test split), the parameters flagged in ``frozen`` left as they are; in place."""
    if steps == 0 or len(train.y) == 0:
        return
    stream = MinibatchStream(len(train.y), batch_size, torch.Generator().manual_seed(FINETUNE_SEED))
    params = [p for p, off in zip(trainable(model), frozen) if not off]
    model.train()
    with torch.enable_grad():
        for _ in range(steps):
            idx = stream.next().to(train.y.device)
            grads = torch.autograd.grad(F.cross_entropy(model(train.x[idx]), train.y[idx]), params)
            with torch.no_grad():
                for p, g in zip(params, grads):
                    p.sub_(lr * g)


class FedBABUClient(ClientAlgorithm):
    """FedBABU's client: local SGD with the head frozen (its gradients dropped in ``adjust_gradients``,
    so a hook on any loop). Evaluation: the received model's accuracy as ``global-accuracy``, then the
    head (or the whole model) fine-tuned on the training split, whose accuracy is the client's."""

    name = "fedbabu"

    def __init__(self, model: nn.Module, config: Mapping[str, Any], state: ClientState | None = None,
                 loss_fn: LossFn = F.cross_entropy) -> None:
        super().__init__(model, config, state, loss_fn)
        self.head = head_flags(model, int(config[HEAD_LAYERS]))

    def gradients(self, params: Sequence[torch.Tensor], grads: Sequence[torch.Tensor | None],
                  batch: Batch | None) -> list[torch.Tensor | None]:
        return drop_frozen(super().gradients(params, grads, batch), self.head)

    @classmethod
    def evaluation_model(cls, model: nn.Module, config: Mapping[str, Any], state: ClientState | None, train: TrainData,
                         test: Callable[[nn.Module], Any]) -> tuple[nn.Module, dict[str, float]]:
        extra = {GLOBAL_ACCURACY: test(model).accuracy}
        head = head_flags(model, int(setting(config, HEAD_LAYERS, "FedBABU")))
        frozen = [not is_head for is_head in head] if config[FINETUNE_PART] == "head" else [False] * len(head)
        fine_tune(model, train, steps=int(config[FINETUNE_STEPS]), lr=float(config[FINETUNE_LR]),
                  batch_size=int(config[FINETUNE_BATCH]), frozen=frozen)
        return model, extra


@dataclass
class FedBABU(Method, GlobalModelAlgorithm):
    """FedBABU (Oh et al. 2022): the head keeps its random initialisation and is never trained in
    federated training; the body is trained by FedAvg, and each client fine-tunes the head at evaluation.

    Training (Algorithm 1): clients run local SGD on the body only, the head frozen at its initial
    value; the server averages the participants' models weighted by samples and keeps the head as
    initialised (what a client sends for the head is discarded, so the head stays fixed even with
    clients that ignore the freeze). Evaluation (the personalization): every client first reports the
    received global model's accuracy (``global-accuracy``), then takes ``fedbabu-finetune-steps`` SGD
    steps on its training split, fine-tuning the head (the abstract's "the head is fine-tuned for
    personalization"; ``fedbabu-finetune-part = "full"`` fine-tunes the whole model, as PFLlib does),
    and reports that model's accuracy. Steps of one batch size, not the paper's τ_f epochs. With
    ``fedbabu-finetune-steps = 0`` the figure is the frozen head's, not FedBABU's personalized one.
    """

    name = "fedbabu"
    strategy = "FedBABU"
    aggregate_only = True
    client = FedBABUClient
    group = "baseline"
    default_clients_per_round = 10
    without_client_algorithm = "runs with the head trained on the clients and then discarded by the server: its body fits a moving head"

    head_layers: int = param(1, key="fedbabu-head-layers", must=AT_LEAST_ONE,
                             doc="trailing layers (modules) that form the head, frozen in training")
    finetune_steps: int = param(20, key="fedbabu-finetune-steps", must=NON_NEGATIVE_INT,
                                doc="SGD steps on the training split before each evaluation (0: the frozen head's figure)")
    finetune_lr: float = param(0.02, key="fedbabu-finetune-lr", must=POSITIVE, doc="step size of the fine-tuning")
    finetune_batch_size: int = param(20, key="fedbabu-finetune-batch-size", must=AT_LEAST_ONE,
                                     doc="minibatch size of the fine-tuning")
    finetune_part: str = param("head", key="fedbabu-finetune-part", must=one_of("head", "full"),
                               doc="what the fine-tuning trains: 'head' or 'full' (the whole model)")

    def setup(self, layout: ParamLayout, initial: torch.Tensor, device: torch.device, seed: int = 0) -> None:
        super().setup(layout, initial, device, seed)
        #: the head's columns, kept at their initial values
        self.head_columns = head_slice(layout, self.head_layers)

    @classmethod
    def check_model(cls, facts: ModelFacts) -> str | None:
        return one_layer_refusal(facts, "a model with a body besides the head", "FedBABU would train nothing")

    @classmethod
    def check_run(cls, options: Mapping[str, Any]) -> tuple[str, str] | None:
        if options["init"] == "zero" or options["init-scale"] == 0:
            return "init", "a random starting model (a frozen head of zeros gives the body no gradient)"
        return None

    def train_config(self, num_participants: int) -> Settings:
        return {HEAD_LAYERS: self.head_layers}

    def evaluation_config(self) -> Settings:
        return {HEAD_LAYERS: self.head_layers, FINETUNE_STEPS: self.finetune_steps, FINETUNE_LR: self.finetune_lr,
                FINETUNE_BATCH: self.finetune_batch_size, FINETUNE_PART: self.finetune_part}

    def combine(self, replies: Sequence[Reply]) -> torch.Tensor:
        """FedAvg of the bodies; the head stays the initial one."""
        new = weighted_mean(torch.stack([r.model for r in replies]), [r.num_examples for r in replies])
        new[self.head_columns] = self.model[self.head_columns]
        return new
