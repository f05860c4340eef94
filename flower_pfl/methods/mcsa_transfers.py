"""FedMCSA's Table 2: its attention transferred to FedAvg and pFedMe, and FedMCSA without it.

- ``fedavg`` + ``aggregation = mcsa``: FedMCSA's layer-wise attention over per-client models with
  FedAvg's plain local SGD (FedMCSA with λ = 0);
- ``pfedme`` + ``mcsa``: the same attention with pFedMe's client algorithm and evaluation (PM and GM);
- ``fedmcsa`` + ``mean`` (FedMCSA^-MCSA): FedMCSA's proximal client toward the plain average,
  i.e. Flower's FedProx with μ = λ.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from flower_pfl.methods.base import Entry
from flower_pfl.methods.fedmcsa import FedMCSA
from flower_pfl.methods.flower_baselines import FEDPROX
from flower_pfl.methods.pfedme import PFedMe


def _mcsa(options: Mapping[str, Any]) -> dict[str, Any]:
    return Entry("fedmcsa", "default", FedMCSA).arguments(options)


def _pfedme_mcsa(options: Mapping[str, Any]) -> dict[str, Any]:
    return {**_mcsa(options), "client_method": PFedMe(**Entry("pfedme", "default", PFedMe).arguments(options))}


ENTRIES = [
    Entry("fedavg", "mcsa", FedMCSA, fixed={"lam": 0.0},
          summary_text="FedAvg+MCSA (FedMCSA's Table 2): FedMCSA's layer-wise attention with FedAvg's plain local SGD (λ = 0)."),
    Entry("pfedme", "mcsa", FedMCSA, custom=_pfedme_mcsa,
          reads=("fedmcsa-sigma", "fedmcsa-layer-grouping", "all-clients-train", "pfedme-lambda", "pfedme-personal-lr",
                 "pfedme-inner-steps"),
          summary_text="pFedMe+MCSA (FedMCSA's Table 2): FedMCSA's layer-wise attention with pFedMe's client algorithm and evaluation."),
    Entry("fedmcsa", "mean", FEDPROX, custom=lambda o: {"proximal_mu": o["fedmcsa-lambda"]}, reads=("fedmcsa-lambda",),
          summary_text="FedMCSA−MCSA (FedMCSA's Table 2): the plain average instead of the attention, i.e. FedProx with μ = λ (fedmcsa-lambda)."),
]
