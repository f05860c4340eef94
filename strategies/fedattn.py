"""FedAttn for the legacy Flower API."""

from __future__ import annotations

from typing import Any

from .fedattn_server import FedAttnServer
from .global_model import GlobalModelStrategy


class FedAttn(GlobalModelStrategy):
    """FedAttn (Luo, Panchal, Guan): a global model by FedAvg, each client's biases personalized by
    attention over its ``k`` nearest clients (Algorithm 1). Arguments as ``FedAttnServer``
    (``k``, ``d_k``, ``attention_lr``, ``bias_reg``, ``warmup_rounds``, ``learn_values``, ``seed``); the rest go to
    Flower's FedAvg (sampling, evaluation). Needs ``initial_parameters``; biases are the 1-D arrays."""

    def __init__(self, *, k: int = 5, d_k: int = 16, attention_lr: float = 0.01, bias_reg: float = 0.0,
                 warmup_rounds: int = 0, learn_values: bool = True, seed: int = 0, **kwargs: Any) -> None:
        super().__init__(FedAttnServer(k, d_k, attention_lr, bias_reg, warmup_rounds, learn_values, seed), **kwargs)
