"""LG-FedAvg (Liang et al. 2020): local representations, global top layers."""

from __future__ import annotations

from dataclasses import dataclass

from flower_pfl.engine.client_algorithm import ClientAlgorithm
from flower_pfl.engine.layout import ParamLayout
from flower_pfl.engine.model_facts import ModelFacts
from flower_pfl.engine.model_split import head_slice
from flower_pfl.engine.params import AT_LEAST_ONE, param
from flower_pfl.methods.base import one_layer_refusal
from flower_pfl.methods.fedper import FedPer


@dataclass
class LGFedAvg(FedPer):
    """LG-FedAvg (Liang et al. 2020): each client keeps its lower layers (its local representation) and
    the top ``head_layers`` layers are averaged globally: FedPer with the roles of body and head swapped.

    Client m trains its local layers θ_m^l and the global layers θ^g together by SGD on its own data
    (the supervised, end-to-end variant); the server sets ``θ^g ← Σ_m (|D_m| / Σ_k |D_k|) θ_m^g`` over
    the participants (FedAvg on the top layers) and every client keeps its θ_m^l. The global part is the
    top, as in the paper and PFLlib; FL-bench's ``lgfedavg`` keeps the first layers global instead, which
    for a two-layer model is FedPer. A client evaluates its own lower layers under the current global
    top layers (a client that never trained: the initial lower layers). The paper's auxiliary
    (unsupervised, fair) objectives for the local representations are not implemented.
    """

    name = "lgfedavg"
    strategy = "LGFedAvg"
    client = ClientAlgorithm
    group = "baseline"
    default_clients_per_round = 10

    head_layers: int = param(1, key="lgfedavg-global-layers", must=AT_LEAST_ONE,
                             doc="top layers (modules) averaged by all clients; the layers below stay each client's own")

    def shared_columns(self, layout: ParamLayout) -> slice:
        """The global part: the top layers, a trailing slice of the flat vector."""
        return head_slice(layout, self.head_layers)

    @classmethod
    def check_model(cls, facts: ModelFacts) -> str | None:
        return one_layer_refusal(facts, "a model with a layer to keep local below the global ones", "LG-FedAvg would be FedAvg")
