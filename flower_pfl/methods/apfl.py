"""APFL (Deng, Kamani, Mahdavi 2020): adaptive personalized FL. Each client keeps a personal model
``v_i`` and a mixing weight ``α_i``; it predicts with ``α_i v_i(x) + (1 − α_i) w(x)`` (output
mixing), where ``w`` is the FedAvg model."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..solvers import LocalResult, MinibatchStream, trainable

#: config keys: run APFL with this α step (training); evaluate the mixture (evaluation); α's start value
ALPHA_LR, EVALUATE_MIXED, ALPHA_INIT = "apfl-alpha-lr", "apfl-mixed", "apfl-alpha-init"


class Mixture(nn.Module):
    """``α v(x) + (1 − α) w(x)``: the personalized predictor."""

    def __init__(self, personal: nn.Module, global_model: nn.Module, alpha: float | torch.Tensor) -> None:
        super().__init__()
        self.personal, self.global_model = personal, global_model
        self.alpha = alpha

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.alpha * self.personal(x) + (1 - self.alpha) * self.global_model(x)


def apfl_local_sgd(global_model: nn.Module, personal: nn.Module, alpha: float, x: torch.Tensor, y: torch.Tensor, *,
                   steps: int, lr: float, alpha_lr: float, batch_size: int, generator: torch.Generator,
                   ) -> tuple[LocalResult, float]:
    """``steps`` APFL steps on fresh minibatches (Algorithm 1), in place on both models:
    ``w ← w − η ∇f(w)``; with the mixture's loss ``f(α v(x) + (1 − α) w(x))`` at the same minibatch and
    the step's starting ``w`` (held fixed), ``v ← v − η ∇_v`` and ``α ← clip(α − η_α ∂/∂α, 0, 1)``. Returns the result (the global model's mean loss) and the new α."""
    if alpha_lr < 0 or not 0 <= alpha <= 1:
        raise ValueError("APFL needs alpha_lr >= 0 and 0 <= alpha <= 1")
    w_params, v_params = trainable(global_model), trainable(personal)
    stream = MinibatchStream(len(y), batch_size, generator)
    global_model.train()
    personal.train()
    total = 0.0
    for _ in range(steps):
        idx = stream.next()
        out_w = global_model(x[idx])
        loss = F.cross_entropy(out_w, y[idx])
        grads = torch.autograd.grad(loss, w_params)
        fixed = out_w.detach()  # the mixture uses w before its step (Algorithm 1)
        with torch.no_grad():
            for p, g in zip(w_params, grads):
                p.sub_(lr * g)
        a = torch.tensor(float(alpha), requires_grad=True)
        mixed = F.cross_entropy(a * personal(x[idx]) + (1 - a) * fixed, y[idx])
        *v_grads, a_grad = torch.autograd.grad(mixed, [*v_params, a])
        with torch.no_grad():
            for p, g in zip(v_params, v_grads):
                p.sub_(lr * g)
        alpha = float(min(1.0, max(0.0, alpha - alpha_lr * float(a_grad))))
        total += float(loss.detach())
    return LocalResult(loss=total / max(steps, 1), steps=steps), alpha
