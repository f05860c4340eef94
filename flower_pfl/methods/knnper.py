"""kNN-Per (Marfoq, Neglia, Kameni, Vidal 2022): personalized FL through local memorization."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from flower_pfl.engine.client_algorithm import ClientAlgorithm, ClientState, TrainData
from flower_pfl.engine.model_split import forward_with_features
from flower_pfl.engine.params import AT_LEAST_ONE, POSITIVE, UNIT_INTERVAL, param
from flower_pfl.engine.server_algorithm import GlobalModelAlgorithm, Settings
from flower_pfl.methods.base import Method

#: config keys: the number of neighbours k, the weight λ and the kernel's scale
K, LAMBDA, SCALE = "knnper-k", "knnper-lambda", "knnper-scale"
#: test queries compared with the datastore at once (a (chunk, n_train) distance matrix)
QUERY_CHUNK = 256


def features_of(model: nn.Module, x: torch.Tensor, batch_size: int = 4096) -> torch.Tensor:
    """The representation φ(x) (the head's input, ``model_split.forward_with_features``) of every row of ``x``."""
    with torch.no_grad():
        return torch.cat([forward_with_features(model, x[s:s + batch_size])[1] for s in range(0, len(x), batch_size)])


def knn_probabilities(queries: torch.Tensor, keys: torch.Tensor, labels: torch.Tensor, num_classes: int, k: int,
                      sigma: float) -> torch.Tensor:
    """``p_kNN(y | x) = Σ_{j ∈ N_k(x)} 1[y_j = y] exp(−d_j / σ) / Σ_{j ∈ N_k(x)} exp(−d_j / σ)`` with
    ``d_j = ||φ(x) − φ(x_j)||²`` over the ``k`` stored representations nearest to each query (rows)."""
    k = min(k, len(keys))
    dist = torch.cdist(queries.double(), keys.double()).pow(2)
    nearest, idx = torch.topk(dist, k, dim=1, largest=False, sorted=True)
    weights = torch.softmax(-nearest / sigma, dim=1)  # exp(−d/σ) normalised; the nearest's shift cancels
    out = torch.zeros(len(queries), num_classes, dtype=torch.float64, device=queries.device)
    out.scatter_add_(1, labels[idx].long(), weights)
    return out.to(queries.dtype)


class KNNMixture(nn.Module):
    """``λ p_kNN(y | x) + (1 − λ) softmax(f(x))_y``, returned as log-probabilities (so cross-entropy is
    the mixture's negative log-likelihood and the argmax its prediction)."""

    def __init__(self, model: nn.Module, train: TrainData, k: int, lam: float, scale: float) -> None:
        super().__init__()
        self.model, self.k, self.lam = model, k, lam
        self.keys, self.labels = features_of(model, train.x), train.y
        #: the authors' code divides squared distances by the representation's size times a scale
        self.sigma = scale * self.keys.shape[1]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        parts = []
        for start in range(0, len(x), QUERY_CHUNK):
            logits, feats = forward_with_features(self.model, x[start:start + QUERY_CHUNK])
            knn = knn_probabilities(feats, self.keys, self.labels, logits.shape[1], self.k, self.sigma)
            parts.append(self.lam * knn + (1 - self.lam) * torch.softmax(logits, dim=1))
        return torch.cat(parts).clamp_min(1e-12).log()


class KNNPerClient(ClientAlgorithm):
    """kNN-Per's client: plain local SGD of the global model (FedAvg), with its receipt (a client
    without it does not run this algorithm, so neither would it evaluate the interpolation); its
    evaluation interpolates the received model with a kNN model over its own training data."""

    name = "knnper"

    @classmethod
    def evaluation_model(cls, model: nn.Module, config: Mapping[str, Any], state: ClientState | None, train: TrainData,
                         test: Callable[[nn.Module], Any]) -> tuple[nn.Module, dict[str, float]]:
        """The mixture of the received model and the kNN model on its representations, and the
        received model's own accuracy as ``global-accuracy``."""
        k, lam, scale = int(config[K]), float(config[LAMBDA]), float(config[SCALE])
        if k < 1 or not 0 <= lam <= 1 or scale <= 0:
            raise ValueError(f"kNN-Per needs k >= 1, 0 <= lambda <= 1 and scale > 0, got {k}, {lam}, {scale}")
        model.eval()
        if len(train.y) == 0:
            return model, {}
        return KNNMixture(model, train, k, lam, scale), {"global-accuracy": float(test(model).accuracy)}


@dataclass
class KNNPer(Method, GlobalModelAlgorithm):
    """kNN-Per (Marfoq et al. 2022): FedAvg's global model, interpolated at evaluation with a kNN
    classifier over each client's own training data in the model's representation space.

    Server and client training are FedAvg. A client evaluates ``h_i(x) = λ p_kNN(y | x) + (1 − λ)
    softmax(f(x))`` (Sec. 3, the interpolated model), its datastore the representations φ(x_j) (the
    last layer's input) of its training examples with their labels, and
    ``p_kNN(y | x) ∝ Σ_{j ∈ N_k(x)} 1[y_j = y] exp(−||φ(x) − φ(x_j)||² / σ)`` over the ``k`` nearest,
    ``σ`` = scale × the representation's size (the authors' kernel, squared L2 as their FAISS index).
    The paper tunes λ per client on held-out data; here it is one hyperparameter. FL-bench mixes the
    kNN probabilities with the model's raw logits; here, as the paper, with its softmax.
    """

    name = "knnper"
    strategy = "KNNPer"
    aggregate_only = True
    reads_head = True
    client = KNNPerClient
    default_clients_per_round = 10
    without_client_algorithm = "evaluates the global model alone (FedAvg)"

    k: int = param(10, key="knnper-k", must=AT_LEAST_ONE, doc="neighbours k of the kNN model")
    lam: float = param(0.5, key="knnper-lambda", must=UNIT_INTERVAL,
                       doc="weight λ of the kNN model in the interpolation (0: FedAvg's global model)")
    scale: float = param(1.0, key="knnper-scale", must=POSITIVE,
                         doc="kernel scale: σ = scale × the representation's size in exp(−d² / σ)")

    def train_config(self, num_participants: int) -> Settings:
        return {K: self.k}

    def evaluation_config(self) -> Settings:
        return {K: self.k, LAMBDA: self.lam, SCALE: self.scale}
