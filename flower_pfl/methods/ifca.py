"""IFCA (Ghosh, Chung, Yin, Ramchandran 2020): the iterative federated clustering algorithm."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from flower_pfl.engine.client_algorithm import Batch, ClientAlgorithm, ClientState, LossFn, TrainData, setting
from flower_pfl.engine.layout import ParamLayout, flatten_module, load_flat_
from flower_pfl.engine.params import AT_LEAST_ONE, param
from flower_pfl.engine.reply_checks import Reply, norm, received_vector
from flower_pfl.engine.server_algorithm import ClientId, GlobalModelAlgorithm, Instruction, Settings, weighted_mean
from flower_pfl.engine.wire import decode_flat, encode_vector
from flower_pfl.methods.base import Method

#: config key: the k cluster models, stacked, as float32 bytes (training and evaluation)
MODELS = "ifca-models"
#: reply key: the one-hot cluster identity s_i (k float32 values)
CLUSTER = "ifca-cluster"


def cluster_models(config: Mapping[str, Any], model: nn.Module) -> torch.Tensor:
    """The ``(k, d)`` cluster models an instruction carries, on the model's device."""
    data, dim = setting(config, MODELS, "IFCA"), flatten_module(model).numel()
    if not isinstance(data, bytes) or not data or len(data) % (4 * dim):
        raise ValueError(f"'{MODELS}' must hold k models of {dim} float32 values as bytes")
    k = len(data) // (4 * dim)
    return decode_flat(data, k * dim, MODELS).view(k, dim).to(next(model.parameters()).device)


def cluster_losses(models: torch.Tensor, model: nn.Module, batches: Sequence[Batch], loss_fn: LossFn = F.cross_entropy) -> torch.Tensor:
    """``F_i(θ_j)`` for every cluster model ``θ_j`` (rows of ``models``): the mean loss over the
    examples of ``batches``, each model loaded into ``model`` in turn."""
    count = sum(len(y) for _, y in batches)
    out = []
    with torch.no_grad():
        for theta in models:
            load_flat_(model, theta)
            out.append(sum(float(loss_fn(model(x), y)) * len(y) for x, y in batches) / max(count, 1))
    return torch.tensor(out)


def whole_split(data: TrainData, chunk: int = 4096) -> list[Batch]:
    """The whole split ``data`` in chunks of ``chunk`` examples (to bound the memory of a forward pass)."""
    return [(data.x[s:s + chunk], data.y[s:s + chunk]) for s in range(0, len(data.y), chunk)]


def choose_cluster(models: torch.Tensor, model: nn.Module, batches: Sequence[Batch], loss_fn: LossFn = F.cross_entropy) -> int:
    """``ĵ = argmin_j F_i(θ_j)`` (Algorithm 1); ``θ_ĵ`` is left loaded in ``model``."""
    j = int(torch.argmin(cluster_losses(models, model, batches, loss_fn)))
    load_flat_(model, models[j])
    return j


class IFCAClient(ClientAlgorithm):
    """IFCA's client (Algorithm 1, option II): in ``begin``, before the round's steps, estimate its
    cluster ``ĵ = argmin_j F_i(θ_j)`` among the k models of ``ifca-models``, ``F_i`` the mean loss on
    its whole training split (the paper's local data), and load ``θ_ĵ`` into the model; then train
    it with local SGD and return it with the one-hot ``s_i`` (``ifca-cluster``). Its evaluation
    picks the cluster the same way. Not a hook on a user's loop: the choice needs ``begin``."""

    name = "ifca"
    hookable = False
    reply_keys = (CLUSTER,)

    def __init__(self, model: nn.Module, config: Mapping[str, Any], state: ClientState | None = None,
                 loss_fn: LossFn = F.cross_entropy) -> None:
        super().__init__(model, config, state, loss_fn)
        self.models = cluster_models(config, model)
        self.cluster: int | None = None

    def begin(self, model: nn.Module, data: TrainData) -> TrainData:
        """Choose the cluster on the whole training split and load its model into ``model``."""
        self.cluster = choose_cluster(self.models, model, whole_split(data), self.loss_fn)
        return data

    def end_round(self, model: nn.Module, inputs: Any = None) -> dict[str, bytes]:
        if self.cluster is None:
            raise ValueError("IFCA's client estimates its cluster in begin (train_locally calls it before the steps)")
        return {CLUSTER: encode_vector(F.one_hot(torch.tensor(self.cluster), len(self.models)).float())}

    @classmethod
    def evaluation_model(cls, model: nn.Module, config: Mapping[str, Any], state: ClientState | None, train: TrainData,
                         test: Callable[[nn.Module], Any]) -> tuple[nn.Module, dict[str, float]]:
        """The cluster model with the lowest loss on the client's training split."""
        models = cluster_models(config, model)
        if len(train.y) > 0:
            choose_cluster(models, model, whole_split(train))
        return model, {}


def initial_clusters(initial: torch.Tensor, layout: ParamLayout, k: int, seed: int) -> torch.Tensor:
    """``(k, d)`` starting models: the initial model, then ``k − 1`` copies with every tensor's entries
    shuffled by a seeded permutation (each an equally likely draw of an i.i.d. initialisation)."""
    generator = torch.Generator().manual_seed(seed)
    rows = [initial.clone()]
    for _ in range(1, k):
        row = initial.clone()
        for sl in layout.tensor_slices():
            part = initial[sl]
            row[sl] = part[torch.randperm(part.numel(), generator=generator)]
        rows.append(row)
    return torch.stack(rows)


@dataclass
class IFCA(Method, GlobalModelAlgorithm):
    """IFCA (Ghosh et al. 2020): k cluster models; each participant trains the one with the lowest
    loss on its data and the server averages each cluster's returned models.

    Algorithm 1, option II (model averaging): the server sends all ``θ_j``; client i estimates
    ``ĵ = argmin_j F_i(θ_j)``, sets ``s_{i,j} = 1[j = ĵ]``, returns ``θ̃_i = LocalUpdate(θ_ĵ)`` and
    ``s_i``; ``θ_j ← Σ_i s_{i,j} θ̃_i / Σ_i s_{i,j}`` over the participants (a cluster nobody chose
    keeps its model). Clusters start from the initial model and ``k − 1`` seeded shuffles of it (the
    paper draws random initialisations). The paper's mean is unweighted; ``weighted`` weights it by
    sample counts (FedAvg's). Clients estimate ``F_i`` on their whole training split (the paper: their
    local data), in training (``IFCAClient.begin``) and in evaluation. No weight sharing.
    """

    name = "ifca"
    strategy = "IFCA"
    has_global_model = False  # a model per cluster
    client = IFCAClient
    default_clients_per_round = 10
    state_attributes = ("models", "assignment")
    without_client_algorithm = "cannot work: every reply lacks the cluster identity"

    num_clusters: int = param(2, key="ifca-clusters", must=AT_LEAST_ONE, doc="number of cluster models k")
    weighted: bool = param(False, key="ifca-weighted",
                           doc="weight each cluster's mean by sample counts (false: the paper's plain mean)")

    def setup(self, layout: ParamLayout, initial: torch.Tensor, device: torch.device, seed: int = 0) -> None:
        super().setup(layout, initial, device, seed)
        self.models = initial_clusters(self.model, layout, self.num_clusters, seed)
        #: each client's cluster in its last accepted reply (its instruction's model; the client chooses anew)
        self.assignment: dict[ClientId, int] = {}

    def train_config(self, num_participants: int) -> Settings:
        return {MODELS: encode_vector(self.models.flatten())}

    def evaluation_config(self) -> Settings:
        return {MODELS: encode_vector(self.models.flatten())}

    new_client_rule = "the cluster model with the lowest loss on its training data, as every client evaluates"

    def client_model(self, client_id: ClientId, training: bool) -> torch.Tensor | None:
        return self.models[self.assignment.get(client_id, 0)]

    def new_client_instructions(self, server_round: int, ids: Sequence[ClientId]) -> list[Instruction]:
        """What any client evaluates: every cluster model, of which it takes the one with the lowest loss."""
        return self.evaluation_instructions(server_round, ids)

    def check_extras(self, extras: Mapping[str, Any]) -> int:
        """The cluster a client chose: ``s_i`` must be one-hot over the k clusters."""
        s = received_vector(extras, CLUSTER, self.num_clusters, "IFCA's cluster identity", IFCAClient.__name__)
        if not (((s == 0) | (s == 1)).all() and float(s.sum()) == 1.0):
            raise ValueError(f"'{CLUSTER}' is not a one-hot vector over the {self.num_clusters} clusters")
        return int(s.argmax())

    def example_extras(self, generator: torch.Generator) -> dict[str, bytes]:
        choice = torch.zeros(self.num_clusters)
        choice[int(torch.randint(self.num_clusters, (), generator=generator))] = 1.0
        return {CLUSTER: encode_vector(choice)}

    def update_norms(self, reply: Reply, sent: torch.Tensor) -> dict[str, tuple[float, float]]:
        """The model's change against the cluster model it trained (not the one the instruction carried)."""
        start = self.models[reply.extras]
        return {"model": (norm(reply.model - start), norm(start))}

    def aggregate(self, server_round: int, replies: Sequence[Reply]) -> None:
        for j in range(self.num_clusters):
            members = [r for r in replies if r.extras == j]
            if members:
                weights = [r.num_examples if self.weighted else 1 for r in members]
                self.models[j] = weighted_mean(torch.stack([r.model for r in members]), weights)
        self.assignment.update({r.client_id: int(r.extras) for r in replies})

    def global_model(self) -> torch.Tensor | None:
        return None

    def server_state(self) -> dict[str, Any]:
        """The cluster models and each client's last cluster."""
        return {"models": self.models, "assignment": dict(self.assignment)}
