"""FedAMP and HeurFedAMP for the legacy Flower API."""

from __future__ import annotations

from flower_pfl.methods import FedAMPRule, HeurFedAMPRule

from .legacy import PersonalizedStrategy


class FedAMP(PersonalizedStrategy):
    """FedAMP (Huang et al. 2021): each participant gets ``u_i = sum_j xi_ij w_j`` with distance-based
    weights and trains with a proximal term toward it. Method arguments: ``alpha_k``, ``sigma``,
    ``lam``, ``all_clients_train`` (see ``flower_pfl.methods.FedAMPRule``)."""

    rule_class = FedAMPRule


class HeurFedAMP(PersonalizedStrategy):
    """HeurFedAMP: FedAMP with cosine-similarity weights and a fixed self weight. Method arguments:
    ``alpha_k``, ``sigma``, ``lam``, ``self_weight``, ``all_clients_train``
    (see ``flower_pfl.methods.HeurFedAMPRule``)."""

    rule_class = HeurFedAMPRule
