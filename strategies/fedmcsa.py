"""FedMCSA for the legacy Flower API."""

from __future__ import annotations

from flower_pfl.methods import FedMCSARule

from .legacy import PersonalizedStrategy


class FedMCSA(PersonalizedStrategy):
    """FedMCSA (Guo et al.): layer-wise self-attention over the participants' models.

    Method arguments (see ``flower_pfl.methods.FedMCSARule``): ``sigma`` (attention scale,
    paper 50), ``lam`` (proximal weight, sent as ``proximal-mu``, paper 5), ``grouping``
    (``"tensor"`` or ``"module"`` components), ``all_clients_train`` (the paper's Algorithm 1:
    every client trains every round). Everything else: see ``PersonalizedStrategy``.
    """

    rule_class = FedMCSARule
