"""Ditto, Per-FedAvg, pFedMe and APFL for the legacy Flower API."""

from __future__ import annotations

from typing import Any

from .client_personalized_servers import APFLServer, DittoServer, PerFedAvgServer, PFedMeServer
from .global_model import GlobalModelStrategy


class Ditto(GlobalModelStrategy):
    """Ditto (Li et al. 2021): FedAvg plus a personal model on every client, trained toward the
    global model with weight ``lam`` and evaluated. Other arguments are Flower's FedAvg's."""

    def __init__(self, *, lam: float = 1.0, **kwargs: Any) -> None:
        super().__init__(DittoServer(lam), **kwargs)


class PerFedAvg(GlobalModelStrategy):
    """Per-FedAvg (Fallah et al. 2020), first order: FedAvg of MAML-trained models; each client's
    personalized model is one step of size ``alpha`` on its training split. Other arguments are
    Flower's FedAvg's (its ``on_fit_config_fn`` supplies ``lr``, the outer step β)."""

    def __init__(self, *, alpha: float = 0.01, **kwargs: Any) -> None:
        super().__init__(PerFedAvgServer(alpha), **kwargs)


class PFedMe(GlobalModelStrategy):
    """pFedMe (Dinh et al. 2020): a global model ``w ← (1 − β) w + β · mean w_i``; every client keeps
    its personalized θ_i (Moreau envelope, ``lam``, ``personal_lr``, ``inner_steps`` K) and reports the
    accuracy of θ_i (PM, ``accuracy``) and of the global model (GM, ``global-accuracy``). Other
    arguments are Flower's FedAvg's."""

    def __init__(self, *, beta: float = 1.0, lam: float = 15.0, personal_lr: float = 0.01, inner_steps: int = 5,
                 **kwargs: Any) -> None:
        super().__init__(PFedMeServer(beta, lam, personal_lr, inner_steps), **kwargs)


class APFL(GlobalModelStrategy):
    """APFL (Deng et al. 2020): FedAvg plus, on every client, a personal model and a mixing weight α
    (``alpha_init``, stepped with ``alpha_lr`` and clipped to [0, 1]); clients evaluate
    ``α v(x) + (1 − α) w(x)``. Other arguments are Flower's FedAvg's."""

    def __init__(self, *, alpha_init: float = 0.5, alpha_lr: float = 0.02, **kwargs: Any) -> None:
        super().__init__(APFLServer(alpha_init, alpha_lr), **kwargs)
