"""pFedMe (T. Dinh, Tran, Nguyen 2020): personalized models θ_i as Moreau envelopes of the clients'
losses around their local copies w_i of the global model.

Client, per local step on a fresh minibatch ``D``: ``K`` gradient steps on
``f(θ; D) + λ/2 ||θ − w||²`` (step ``personal_lr``, from the current θ), then
``w ← w − η λ (w − θ)`` (its Algorithm 1). Server: ``w ← (1 − β) w + β · mean_i w_i``.
The reference optimizer adds a hidden weight decay; there is none here.
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

from ..layout import ParamLayout
from ..solvers import LocalResult, MinibatchStream, trainable

#: config keys: λ, the personalized step and K (training); evaluate θ_i and the global model (evaluation)
LAMBDA, PERSONAL_LR, INNER_STEPS, EVALUATE_BOTH = "pfedme-lambda", "pfedme-personal-lr", "pfedme-inner-steps", "pfedme-pm-gm"


def personalize(model: nn.Module, theta: Sequence[torch.Tensor], loss_of: Callable[[torch.Tensor], torch.Tensor],
                inputs: torch.Tensor, *, lam: float, personal_lr: float, inner_steps: int) -> tuple[list[torch.Tensor], torch.Tensor]:
    """``K = inner_steps`` gradient steps on ``loss_of(θ(inputs)) + λ/2 ||θ − w||²`` from ``θ``
    (eq. 7 solved approximately; ``w``: the model's parameters). Returns the new θ and its last loss."""
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    params = trainable(model)
    for _ in range(inner_steps):
        leaves = [t.detach().requires_grad_(True) for t in theta]
        loss = loss_of(functional_call(model, dict(zip(names, leaves)), (inputs,)))
        grads = torch.autograd.grad(loss, leaves)
        with torch.no_grad():
            theta = [t - personal_lr * (g + lam * (t - w)) for t, g, w in zip(leaves, grads, params)]
    return [t.detach() for t in theta], loss.detach()


def pfedme_local_sgd(model: nn.Module, x: torch.Tensor, y: torch.Tensor, *, steps: int, lr: float, batch_size: int,
                     generator: torch.Generator, lam: float, personal_lr: float, inner_steps: int,
                     ) -> tuple[LocalResult, list[torch.Tensor]]:
    """pFedMe's client update, in place on ``model`` (the local ``w``). Returns the result (mean
    loss of θ on its minibatches) and the last personalized model θ (one tensor per parameter)."""
    if lam <= 0 or personal_lr <= 0 or inner_steps < 1:
        raise ValueError("pFedMe needs lam > 0, personal_lr > 0 and inner_steps >= 1")
    params = trainable(model)
    theta = [p.detach().clone() for p in params]
    stream = MinibatchStream(len(y), batch_size, generator)
    model.train()
    total = 0.0
    for _ in range(steps):
        idx = stream.next()
        theta, loss = personalize(model, theta, lambda out: F.cross_entropy(out, y[idx]), x[idx], lam=lam,
                                  personal_lr=personal_lr, inner_steps=inner_steps)
        with torch.no_grad():
            for w, t in zip(params, theta):
                w.sub_(lr * lam * (w - t))
        total += float(loss.detach())
    return LocalResult(loss=total / max(steps, 1), steps=steps), [t.detach() for t in theta]


def personalized_vector(model: nn.Module, theta: Sequence[torch.Tensor]) -> torch.Tensor:
    """The model with θ_i in place of its trainable parameters, as one flat float32 vector in
    ``state_dict`` order (what the client keeps to evaluate)."""
    state = dict(model.state_dict())
    state.update(zip((n for n, p in model.named_parameters() if p.requires_grad), theta))
    return ParamLayout.from_arrays(state).flatten(state.values())
