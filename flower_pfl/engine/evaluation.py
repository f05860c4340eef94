"""A client's evaluation of a model on its own test split (mean cross-entropy and accuracy): one client's
(``evaluate``), or a round's clients' models on their own test splits as one computation
(``evaluate_together``: one ``torch.func.vmap`` of the model's forward pass per chunk of samples)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import vmap

from flower_pfl.engine.functional import Functional
from flower_pfl.engine.memory import activation_bytes
from flower_pfl.engine.wire import fingerprint

#: a round's evaluation stacks at most about this many bytes of the clients' models at once (then evaluates them)
STACKED_BYTES = 256 * 2**20
#: one forward pass of a model evaluated alone may take up to about this many bytes of inputs and activations
CHUNK_BYTES = 64 * 2**20


class Personalization(nn.Module):
    """A model a client makes from the received one to evaluate (a mixture, a personal head, a shifted
    representation), holding everything that differs from client to client in its ``state_dict`` (parameters
    and buffers): a round's clients then evaluate their models of one kind as one computation
    (``evaluate_together`` on the stacked ``state_dict``s)."""


@dataclass(frozen=True)
class EvalResult:
    loss: float
    accuracy: float
    num_examples: int


@torch.no_grad()
def evaluate(model: nn.Module, x: torch.Tensor, y: torch.Tensor, batch_size: int = 4096) -> EvalResult:
    """Mean cross-entropy and accuracy of ``model`` on ``(x, y)``."""
    model.eval()
    loss, correct = 0.0, 0
    for start in range(0, len(y), batch_size):
        logits = model(x[start : start + batch_size])
        target = y[start : start + batch_size]
        loss += float(F.cross_entropy(logits, target, reduction="sum"))
        correct += int((logits.argmax(1) == target).sum())
    n = len(y)
    return EvalResult(loss=loss / max(n, 1), accuracy=correct / max(n, 1), num_examples=n)


@torch.no_grad()
def evaluate_together(model: nn.Module, states: Sequence[Sequence[torch.Tensor]],
                      tests: Sequence[tuple[torch.Tensor, torch.Tensor]], batch_size: int = 4096) -> list[EvalResult]:
    """``evaluate`` of each client's model (``states[i]``: its ``state_dict``'s tensors, on ``model``'s
    architecture) on its own test split ``tests[i]``, the clients as one computation. Clients holding the same
    model (a global model's; one state object given for several clients is fingerprinted once) share its
    forward passes. Each step runs every model with samples left on its next samples, about ``batch_size``
    samples in all (a model's last chunk padded with its first sample, the padding left out of the sums); one
    model runs on its clients' samples in order, ``batch_size`` at a time, without ``vmap``."""
    if not states:
        return []
    model.eval()
    device = tests[0][1].device
    prints: dict[int, int] = {}  # by the id of a state object: its fingerprint, computed once
    models: dict[int, list[int]] = {}  # a model's fingerprint -> the clients holding it
    for i, state in enumerate(states):
        if (crc := prints.get(id(state))) is None:
            crc = prints[id(state)] = fingerprint(state)
        models.setdefault(crc, []).append(i)
    members = list(models.values())
    order = [i for m in members for i in m]
    counts = [len(tests[i][1]) for i in order]
    owners = torch.repeat_interleave(torch.tensor(order, device=device), torch.tensor(counts, device=device))
    x_all = torch.cat([tests[i][0] for i in order])
    y_all = torch.cat([tests[i][1] for i in order])
    losses = torch.zeros(len(states), dtype=torch.float64, device=device)
    correct = torch.zeros(len(states), dtype=torch.int64, device=device)

    def add(logits: torch.Tensor, y: torch.Tensor, owner: torch.Tensor, keep: torch.Tensor | None = None) -> None:
        each = F.cross_entropy(logits.flatten(0, -2), y.flatten(), reduction="none").view(y.shape)
        hits = logits.argmax(-1) == y
        if keep is not None:
            each, hits = torch.where(keep, each, 0), hits & keep
        losses.index_add_(0, owner, each.flatten().to(torch.float64))
        correct.index_add_(0, owner, hits.flatten().to(torch.int64))

    if len(members) == 1:  # one model for every client: contiguous chunks of its clients' samples
        run, state, step = Functional(model), states[members[0][0]], _chunk(model, x_all, batch_size)
        for start in range(0, len(y_all), step):
            add(run(state, x_all[start:start + step]), y_all[start:start + step], owners[start:start + step])
    else:
        forward = vmap(Functional(model))
        stacked = [torch.stack([states[m[0]][k] for m in members]) for k in range(len(states[0]))]
        sizes = torch.tensor([sum(len(tests[i][1]) for i in m) for m in members], device=device)
        starts = torch.cumsum(sizes, 0) - sizes
        position, active = 0, torch.arange(len(members), device=device)
        while True:
            active = active[sizes[active] > position]  # the models with samples left
            if len(active) == 0:
                break
            chunk = max(1, batch_size // len(active))
            offsets = position + torch.arange(chunk, device=device)
            keep = offsets[None, :] < sizes[active, None]
            rows = torch.where(keep, starts[active, None] + offsets[None, :], starts[active, None])
            add(forward([t[active] for t in stacked], x_all[rows]), y_all[rows], owners[rows].flatten(), keep)
            position += chunk
    sizes_each = [len(y) for _, y in tests]
    return [EvalResult(loss=loss / max(n, 1), accuracy=c / max(n, 1), num_examples=n)
            for loss, c, n in zip(losses.tolist(), correct.tolist(), sizes_each)]


def _chunk(model: nn.Module, x: torch.Tensor, batch_size: int) -> int:
    """The samples of one forward pass of ``model`` evaluated alone: ``batch_size``, or as many as keep their
    inputs and every module's outputs (``activation_bytes``) within ``CHUNK_BYTES`` where that is more (a small
    model's forward passes cost more in calls than in arithmetic)."""
    if not len(x):
        return batch_size
    per_sample = x[0].numel() * x[0].element_size() + activation_bytes(model, x[0])
    return max(batch_size, CHUNK_BYTES // max(per_sample, 1))
