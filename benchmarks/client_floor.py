"""The floor for a round of local training: bare PyTorch loops with nothing of the package or Flower.

One FedAvg round on a federation held in memory: sample the round's clients, train each from the
global model with plain SGD on fresh minibatches, average the models weighted by their examples, and
every ``eval_every`` rounds evaluate the global model on every client's test split (loss and accuracy). Two loops:

- ``sequential_round``: client after client, an ``nn.Module`` and ``torch.optim.SGD`` each; ``evaluate``:
  the global model on each client's test split in turn;
- ``batched_round``: the round's clients as one computation, ``torch.func.vmap`` of one client's
  loss over their stacked parameters, then one gradient step for all (the same minibatches). A
  model's buffers (batch normalization's running statistics) are each client's own, stacked like
  the parameters and updated in place by the training-mode forward passes (``functional_call``);
  the round averages them with the parameters, as the sequential loop averages the ``state_dict``.

  ``batched_evaluate``: the global model on every client's test split as one computation (one forward
  pass over their samples, the sums split by client).

Both train in training mode; evaluation runs in evaluation mode.

``benchmarks.client_speed`` times them beside the package's own paths.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, vmap


@dataclass
class Federation:
    """Every client's train and test split (on one device) and the model's constructor."""

    x_train: list[torch.Tensor]
    y_train: list[torch.Tensor]
    x_test: list[torch.Tensor]
    y_test: list[torch.Tensor]
    make_model: Callable[[], nn.Module]


def minibatches(n: int, batch: int, steps: int, generator: torch.Generator) -> list[torch.Tensor]:
    """``steps`` fresh minibatches of ``min(batch, n)`` indices: a shuffle, reshuffled when used up."""
    batch, out, perm, pos = min(batch, n), [], torch.randperm(n, generator=generator), 0
    for _ in range(steps):
        if pos + batch > n:
            perm, pos = torch.randperm(n, generator=generator), 0
        out.append(perm[pos:pos + batch])
        pos += batch
    return out


def evaluate(model: nn.Module, fed: Federation) -> tuple[float, float]:
    """One model's mean loss and accuracy over clients, client by client (what a client reports), in
    evaluation mode (batch normalization's running statistics)."""
    loss = accuracy = 0.0
    model.eval()
    with torch.no_grad():
        for x, y in zip(fed.x_test, fed.y_test):
            logits = model(x)
            loss += float(F.cross_entropy(logits, y, reduction="sum")) / len(y)
            accuracy += float((logits.argmax(1) == y).float().mean())
    model.train()
    return loss / len(fed.x_test), accuracy / len(fed.x_test)


def batched_evaluate(model: nn.Module, fed: Federation) -> tuple[float, float]:
    """``evaluate``'s figures, every client's test split in one forward pass: each sample's loss and hit
    summed into its client's by ``index_add``."""
    sizes = torch.tensor([len(y) for y in fed.y_test])
    owner = torch.repeat_interleave(torch.arange(len(sizes)), sizes).to(fed.y_test[0].device)
    model.eval()
    with torch.no_grad():
        logits, y = model(torch.cat(fed.x_test)), torch.cat(fed.y_test)
        losses = torch.zeros(len(sizes), dtype=torch.float64, device=y.device).index_add_(
            0, owner, F.cross_entropy(logits, y, reduction="none").double())
        hits = torch.zeros(len(sizes), dtype=torch.float64, device=y.device).index_add_(0, owner, (logits.argmax(1) == y).double())
    model.train()
    n = sizes.to(losses.device)
    return float((losses / n).mean()), float((hits / n).mean())


def sequential_round(fed: Federation, model: nn.Module, clients: list[int], *, steps: int, batch: int, lr: float,
                     generator: torch.Generator) -> None:
    """One round, client after client; ``model`` holds the global model before and after."""
    start = {k: v.clone() for k, v in model.state_dict().items()}
    total = {k: torch.zeros_like(v) for k, v in start.items()}
    weight = 0
    model.train()
    for c in clients:
        model.load_state_dict(start)
        optimizer = torch.optim.SGD(model.parameters(), lr=lr)
        x, y = fed.x_train[c], fed.y_train[c]
        for idx in minibatches(len(y), batch, steps, generator):
            optimizer.zero_grad()
            F.cross_entropy(model(x[idx]), y[idx]).backward()
            optimizer.step()
        for k, v in model.state_dict().items():
            total[k] += len(y) * v
        weight += len(y)
    model.load_state_dict({k: v / weight for k, v in total.items()})


def batched_round(fed: Federation, model: nn.Module, clients: list[int], *, steps: int, batch: int, lr: float,
                  generator: torch.Generator) -> None:
    """One round, the clients as one computation (clients with fewer examples than a batch in a group of their own)."""
    names = [n for n, _ in model.named_parameters()]
    buffer_names = [n for n, _ in model.named_buffers()]
    start = [p.detach() for p in model.parameters()]
    start_buffers = [b.detach() for b in model.buffers()]
    groups: dict[int, list[int]] = {}
    for c in clients:
        groups.setdefault(min(batch, len(fed.y_train[c])), []).append(c)
    total, weight = [torch.zeros_like(p) for p in start], 0
    total_buffers = [torch.zeros(b.shape, device=b.device) for b in start_buffers]  # float: num_batches_tracked too

    def loss(params: list[torch.Tensor], buffers: list[torch.Tensor], x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        # a training-mode forward pass updates the client's own buffers in place
        tensors = {**dict(zip(names, params)), **dict(zip(buffer_names, buffers))}
        return F.cross_entropy(functional_call(model, tensors, (x,)), y)

    losses = vmap(loss)
    model.train()
    for members in groups.values():
        params = [p.expand(len(members), *p.shape).clone() for p in start]
        buffers = [b.expand(len(members), *b.shape).clone() for b in start_buffers]
        picks = [minibatches(len(fed.y_train[c]), batch, steps, generator) for c in members]
        for k in range(steps):
            x = torch.stack([fed.x_train[c][p[k]] for c, p in zip(members, picks)])
            y = torch.stack([fed.y_train[c][p[k]] for c, p in zip(members, picks)])
            leaves = [p.requires_grad_(True) for p in params]
            grads = torch.autograd.grad(losses(leaves, buffers, x, y).sum(), leaves)
            with torch.no_grad():
                params = [p - lr * g for p, g in zip(leaves, grads)]
        sizes = torch.tensor([float(len(fed.y_train[c])) for c in members], device=start[0].device)
        for t, p in zip(total, params):
            t += torch.tensordot(sizes, p, dims=1)
        for t, b in zip(total_buffers, buffers):
            t += torch.tensordot(sizes, b.to(sizes.dtype), dims=1)
        weight += int(sizes.sum())
    with torch.no_grad():
        for p, t in zip(model.parameters(), total):
            p.copy_(t / weight)
        for b, t in zip(model.buffers(), total_buffers):
            b.copy_(t / weight)  # cast back to the buffer's type (num_batches_tracked: an integer)
