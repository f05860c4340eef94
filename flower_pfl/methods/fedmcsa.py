"""FedMCSA (Guo et al.): model-components self-attention.

Its Table 2 transfers the attention to other methods and takes it away, as run-config values:

- ``fedavg`` + ``aggregation = mcsa``: FedMCSA's layer-wise attention over per-client models with
  FedAvg's plain local SGD (FedMCSA with λ = 0);
- ``pfedme`` + ``mcsa``: the same attention with pFedMe's client algorithm and evaluation (PM and GM);
- ``fedmcsa`` + ``mean`` (FedMCSA^-MCSA): FedMCSA's proximal client toward the plain average,
  i.e. Flower's FedProx with μ = λ (declared beside FedProx, ``flower_baselines``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from flower_pfl.engine.client_algorithm import PROXIMAL_MU, ClientAlgorithm, Proximal
from flower_pfl.engine.layout import GROUPINGS, ParamLayout
from flower_pfl.engine.params import NON_NEGATIVE, POSITIVE, one_of, param
from flower_pfl.engine.server_algorithm import ServerAlgorithm, Settings
from flower_pfl.methods.all_clients_train import AllClientsTrain, AnchoredProximal
from flower_pfl.methods.attention import layerwise_attention
from flower_pfl.methods.base import Method, Variant
from flower_pfl.methods.pfedme import PFedMe


@dataclass
class FedMCSA(Method, AllClientsTrain):
    """FedMCSA (Guo et al.): layer-wise self-attention over the participants' personalized models,
    and a proximal client algorithm toward the model it receives.

    Server (eqs. 6-8, Algorithm 1 lines 2-5): for every component ``l``,
    ``w_{i,l} = Σ_k softmax_k(σ cos(θ_{i,l}, θ_{k,l})) θ_{k,l}`` over the round's participants.
    Client (eq. 9): ``R`` SGD steps on ``f_i(Θ) + λ/2 ||Θ − W_i||²``, the anchor ``W_i`` fixed
    for the round (sent as ``proximal-mu``); with ``all_clients_train`` the unsampled clients train
    too, toward the anchor they last received (Algorithm 1, ``flower_pfl.methods.all_clients_train``).
    """

    name = "fedmcsa"
    strategy = "FedMCSA"
    client = AnchoredProximal
    group = "paper"
    default_clients_per_round = 10
    variants = (
        Variant("fedavg", "mcsa", fixed={"lam": 0.0},
                summary="FedAvg+MCSA (FedMCSA's Table 2): FedMCSA's layer-wise attention with FedAvg's plain local SGD (λ = 0)."),
        Variant("pfedme", "mcsa", fixed={"lam": 0.0}, uses={"client_method": PFedMe},
                summary="pFedMe+MCSA (FedMCSA's Table 2): FedMCSA's layer-wise attention with pFedMe's client algorithm and "
                        "evaluation."),
    )

    sigma: float = param(50.0, key="fedmcsa-sigma", must=POSITIVE, old_keys=("sigma",),
                         doc="attention scale σ (eq. 7): → 0 gives the per-layer mean, large keeps each client's own layer")
    lam: float = param(5.0, key="fedmcsa-lambda", must=NON_NEGATIVE, old_keys=("lam",),
                       doc="proximal weight λ toward the received model (eq. 9)")
    grouping: str = param("tensor", key="fedmcsa-layer-grouping", must=one_of(*GROUPINGS), old_keys=("layer-grouping",),
                          doc="components: 'tensor' (weight and bias apart, as the authors' code) or 'module' (one per layer)")
    #: mechanism transfer (the paper's Table 2, e.g. pFedMe+MCSA): another method whose client algorithm,
    #: client settings and evaluation the clients use in place of the proximal step
    client_method: ServerAlgorithm | None = param(None, doc="another method whose client algorithm, settings and evaluation the "
                                                       "clients use in place of the proximal step (Table 2's transfers)")

    proximal_mu_text = "lam (run config fedmcsa-lambda)"
    without_client_algorithm = "runs without its proximal term λ (eq. 9), i.e. as FedAvg+MCSA (λ = 0)"

    def setup(self, layout: ParamLayout, initial: torch.Tensor, device: torch.device, seed: int = 0) -> None:
        super().setup(layout, initial, device, seed)
        if self.grouping == "module" and not layout.named:
            raise ValueError("grouping = 'module' finds layers by parameter name, and this model's have none: "
                             "give the strategy the initial model with its parameter names (a state_dict)")

    def personalize(self, models: torch.Tensor, layout: ParamLayout) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Personalized models and each component's ``(m, m)`` attention weights."""
        components = layout.components(self.grouping)  # type: ignore[arg-type]
        out, weights = layerwise_attention(models, [sl for _, sl in components], self.sigma)
        return out, {name: weights[l] for l, (name, _) in enumerate(components)}

    def client_algorithm(self) -> type[ClientAlgorithm]:
        """The proximal term toward the received model, remembering it when every client trains
        (``AnchoredProximal``); plain SGD for λ = 0 (FedAvg+MCSA); the transferred method's otherwise."""
        if self.client_method is not None:
            return self.client_method.client_algorithm()
        if self.lam == 0:
            return ClientAlgorithm
        return AnchoredProximal if self.all_clients_train else Proximal

    def train_config(self, num_participants: int) -> Settings:
        if self.client_method is not None:
            return self.client_method.train_config(num_participants)
        return {PROXIMAL_MU: float(self.lam)}

    def evaluation_config(self) -> Settings:
        return self.client_method.evaluation_config() if self.client_method is not None else {}
