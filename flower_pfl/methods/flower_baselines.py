"""Baselines Flower ships (FedAvg, FedProx, FedAvgM, FedAdam): the run config maps to Flower's own
strategy classes, which ``strategies`` and ``strategies.message`` re-export."""

from __future__ import annotations

from flower_pfl.engine.params import HALF_OPEN_UNIT, NON_NEGATIVE, POSITIVE, ParamSpec
from flower_pfl.methods.base import FlowerMethod, Variant

FEDAVG = FlowerMethod("fedavg", "FedAvg", "FedAvg (McMahan et al. 2017): the sample-weighted mean of the participants' models.")
FEDPROX = FlowerMethod(
    "fedprox", "FedProx", "FedProx (Li et al. 2020): FedAvg whose clients add μ/2 ||w − w_received||².",
    (ParamSpec("proximal_mu", "fedprox-mu", 0.01, float, "FedProx's proximal weight μ", NON_NEGATIVE, ("proximal-mu",)),),
    variants=(Variant("fedmcsa", "mean", keys={"proximal_mu": "fedmcsa-lambda"},
                      summary="FedMCSA−MCSA (FedMCSA's Table 2): the plain average instead of the attention, i.e. FedProx "
                              "with μ = λ (fedmcsa-lambda)."),))
FEDAVGM = FlowerMethod(
    "fedavgm", "FedAvgM", "FedAvgM (Hsu et al. 2019): FedAvg with server momentum.",
    (ParamSpec("server_momentum", "fedavgm-momentum", 0.9, float, "FedAvgM's server momentum", HALF_OPEN_UNIT,
               ("server-momentum",)),),
    fixed={"server_learning_rate": 1.0})
FEDADAM = FlowerMethod(
    "fedadam", "FedAdam", "FedAdam (Reddi et al. 2021): Adam on the server over the mean update (client step η_l = lr).",
    (ParamSpec("eta", "fedadam-eta", 0.01, float, "FedAdam's server learning rate", POSITIVE),
     ParamSpec("tau", "fedadam-tau", 0.001, float, "FedAdam's adaptivity τ", POSITIVE)),
    keys={"eta_l": "lr"})
