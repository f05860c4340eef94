"""A round's clients trained as one computation: ``train_together`` runs the clients' local SGD
(``train_locally``, client by client) with their models stacked, one ``torch.func.vmap`` of the
client algorithm's own step per SGD step.

Each client draws its minibatches from its own generator, as ``train_locally`` does, so the batched
path trains on the same minibatches in the same order. The step is written once: the algorithm's
``loss``, ``gradients`` and ``gradient_terms`` (a step of the user's loop), or its own ``step``
(``flower_pfl.engine.functional``: a second model, a second minibatch, modules trained beside the
model), with the per-client tensors they read (``batched_state``), carry (``carried``) or draw
(``drawn``) stacked. A model's buffers (batch normalization's running statistics) are each client's
own, stacked like its parameters. Clients whose minibatches differ in size (fewer examples than a
batch) train in groups of one size. ``begin``, ``draw`` and ``finish`` run client by client, as they
do in ``train_locally``. What cannot run this way (``unbatched`` says why) trains client by client.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import vmap

from flower_pfl.engine.client_algorithm import (
    ClientAlgorithm,
    Extras,
    LocalResult,
    TrainData,
    changes_gradients,
    has_own_step,
    overrides,
)
from flower_pfl.engine.functional import Functional
from flower_pfl.engine.minibatches import MinibatchStream

#: why a convolutional model trains one client at a time on the CPU (``benchmarks.client_speed``: a round of
#: McMahan et al.'s CNN took 1.46x as long batched as one by one, 2 cores, one torch thread)
CPU_CONVOLUTIONS = ("on the CPU, PyTorch's convolutions run slower for a round's clients at once (as one grouped "
                    "convolution) than one client at a time")


#: why a model with a recurrent layer trains one client at a time
RECURRENT = "the model has a recurrent layer (torch.func.vmap has no batching rule for PyTorch's LSTM)"
#: why a model with dropout trains one client at a time
DROPOUT = "the model has dropout (a round's clients at once would draw other masks than one by one)"


@dataclass
class ClientRound:
    """One client's local training of a round: its client algorithm (made with the received model), its
    training split, and how ``train_locally`` would train it (``steps``, ``lr``, ``batch_size``, ``generator``)."""

    algorithm: ClientAlgorithm
    data: TrainData
    steps: int
    lr: float
    batch_size: int
    generator: torch.Generator
    #: the client's received model, as its ``state_dict``'s tensors (loaded into the model before ``begin``)
    received: list[torch.Tensor]


def unbatched(algorithm: type[ClientAlgorithm], model: nn.Module) -> str | None:
    """Why clients of ``algorithm`` training ``model`` (on its device) do not train as one computation, or
    ``None``: the algorithm cannot, the model has dropout, or its forward passes cannot run together
    (``unbatched_evaluation``)."""
    if algorithm.unbatched_because is not None:
        return algorithm.unbatched_because
    if overrides(algorithm, "train_step"):
        return "its train_step is its own (not a step of the user's loop, nor a step written with torch.func)"
    why = unbatched_evaluation(model)  # a recurrent layer first, then dropout, then convolutions on the CPU
    if why != RECURRENT and any(isinstance(m, nn.modules.dropout._DropoutNd) and m.p > 0 for m in model.modules()):
        return DROPOUT
    return why


def unbatched_evaluation(model: nn.Module) -> str | None:
    """Why a round's clients evaluating ``model``'s architecture run their forward passes one by one, or
    ``None``: a recurrent layer, or convolutions on the CPU."""
    if any(isinstance(m, nn.RNNBase) for m in model.modules()):
        return RECURRENT
    if _on_cpu(model) and any(isinstance(m, nn.modules.conv._ConvNd) for m in model.modules()):
        return CPU_CONVOLUTIONS
    return None


def _on_cpu(model: nn.Module) -> bool:
    return all(p.device.type == "cpu" for p in model.parameters())


def train_together(model: nn.Module, rounds: Sequence[ClientRound]) -> list[tuple[list[torch.Tensor], LocalResult, Extras]]:
    """Each client's trained model (its ``state_dict``'s tensors), mean training loss and extras, as
    ``train_locally`` gives them, for clients of one client algorithm that ``unbatched`` allows;
    ``model`` is a model of their architecture (its tensors are overwritten)."""
    if not rounds:
        return []
    starts, datas = [], []
    for r in rounds:  # ``begin`` on each client's received model, as ``train_locally`` does
        if not overrides(type(r.algorithm), "begin"):  # the base class's: the data as it is, the model as received
            datas.append(r.data)
            starts.append(r.received)
            continue
        _load(model, r.received)
        model.train()
        datas.append(r.algorithm.begin(model, r.data))
        starts.append([t.detach().clone() for t in model.state_dict().values()])
    model.train()
    groups: dict[tuple[Any, ...], list[int]] = {}
    for i, (r, d) in enumerate(zip(rounds, datas)):
        groups.setdefault((min(r.batch_size, len(d.y)), r.steps, r.lr, _settings(r.algorithm)), []).append(i)
    trained: list[list[torch.Tensor]] = [[] for _ in rounds]
    losses: list[float] = [0.0] * len(rounds)
    train = _train_stepwise if has_own_step(type(rounds[0].algorithm)) else _train_group
    for members in groups.values():
        with _natively_batched_loss(rounds[members[0]].algorithm):
            states, mean_losses = train(model, [rounds[i] for i in members], [datas[i] for i in members],
                                        [starts[i] for i in members])
        for j, i in enumerate(members):
            trained[i], losses[i] = [t[j] for t in states], mean_losses[j]
    out = []
    for r, d, state, loss in zip(rounds, datas, trained, losses):  # ``finish`` on each client's trained model
        r.algorithm.steps = r.steps
        if overrides(type(r.algorithm), "finish") or overrides(type(r.algorithm), "end_round"):
            _load(model, state)
            extras = r.algorithm.finish(model, d.x)
            state = [t.detach().clone() for t in model.state_dict().values()]
        else:  # the base class's finish reads nothing of the model: the trained state as it is
            extras = r.algorithm.finish(model, d.x)
        out.append((state, LocalResult(loss=loss, steps=r.steps), extras))
    return out


def _load(model: nn.Module, tensors: Sequence[torch.Tensor]) -> None:
    with torch.no_grad():
        for target, value in zip(model.state_dict().values(), tensors):
            target.copy_(value)


def _settings(algorithm: ClientAlgorithm) -> tuple[Any, ...]:
    """What of ``algorithm``'s state must agree across a batch: everything but its own tensors (and the model
    it trains). ``TypeError`` for a value that cannot be compared (its repr is its address): it would put each
    client in a group of its own."""
    own = {"config", "state", "received", "steps", "step_loss", "loss_fn", *algorithm.batched_state,
           *algorithm.carried, *algorithm.drawn}
    settings = []
    for key, value in vars(algorithm).items():
        if key in own or isinstance(value, torch.Tensor | nn.Module) or _holds_tensors(value):
            continue
        text = repr(value)
        if " at 0x" in text:
            raise TypeError(f"{type(algorithm).__name__}.{key} is a {type(value).__name__} compared by its address: "
                            "make it a plain value every client of a round shares, or tensors named in batched_state "
                            "or carried")
        settings.append((key, text))
    return tuple(sorted(settings))


def _holds_tensors(value: Any) -> bool:
    return isinstance(value, list | tuple) and any(isinstance(v, torch.Tensor) or _holds_tensors(v) for v in value)


def _train_group(model: nn.Module, rounds: Sequence[ClientRound], datas: Sequence[TrainData],
                 starts: Sequence[Sequence[torch.Tensor]]) -> tuple[list[torch.Tensor], list[float]]:
    """Train clients whose minibatches have one size together, steps of the user's loop; their stacked
    trained states (``state_dict`` order) and mean losses."""
    proto, steps, lr = rounds[0].algorithm, rounds[0].steps, rounds[0].lr
    f = Functional(model)
    stacked = [torch.stack(ts) for ts in zip(*starts)]
    params = f.params(stacked)
    # the buffers are each client's own (the stack's fresh copies), updated in place by the training-mode forward passes
    buffers = f.others(stacked)
    state = {name: _stack([getattr(r.algorithm, name) for r in rounds]) for name in proto.batched_state}
    x_all, y_all, picks = _minibatches(rounds, datas, steps)

    def client_loss(ps: list[torch.Tensor], bufs: list[torch.Tensor], own: dict[str, Any], x: torch.Tensor,
                    y: torch.Tensor) -> torch.Tensor:
        with _bound(proto, own):
            return proto.loss(f(f.join(ps, bufs), x), y)

    def client_gradients(ps: list[torch.Tensor], grads: list[torch.Tensor], own: dict[str, Any], x: torch.Tensor,
                         y: torch.Tensor) -> list[torch.Tensor]:
        with _bound(proto, own):
            new = proto.gradients(ps, grads, (x, y))
        return [torch.zeros_like(p) if g is None else g for p, g in zip(ps, new)]

    losses_of, gradients_of = vmap(client_loss), vmap(client_gradients)
    adjusts = changes_gradients(type(proto))  # plain SGD's gradients are the loss's: no second vmap per step
    totals = torch.zeros(len(rounds), dtype=torch.float64, device=params[0].device)  # summed where computed: no sync per step
    for k in range(steps):
        x, y = x_all[picks[k]], y_all[picks[k]]
        proto.steps = k
        leaves = [p.detach().requires_grad_(True) for p in params]
        loss = losses_of(leaves, buffers, state, x, y)
        # the clients' losses are independent: the gradient of their sum is each client's gradient
        grads = list(torch.autograd.grad(loss.sum(), leaves))
        with torch.no_grad():
            new = gradients_of(params, grads, state, x, y) if adjusts else grads
            params = [p - lr * g for p, g in zip(params, new)]
        totals += loss.detach().to(torch.float64)
    return f.join(params, buffers), (totals.cpu() / max(steps, 1)).tolist()


def _train_stepwise(model: nn.Module, rounds: Sequence[ClientRound], datas: Sequence[TrainData],
                    starts: Sequence[Sequence[torch.Tensor]]) -> tuple[list[torch.Tensor], list[float]]:
    """Train clients whose minibatches have one size together, by their algorithm's own ``step``; their
    stacked trained states and mean losses. The ``carried`` tensors come back into each client's algorithm."""
    proto, steps, lr, m = rounds[0].algorithm, rounds[0].steps, rounds[0].lr, rounds[0].algorithm.minibatches
    f = Functional(model)
    state = [torch.stack(ts) for ts in zip(*starts)]
    own = {name: _stack([getattr(r.algorithm, name) for r in rounds]) for name in proto.batched_state}
    carried = {name: _stack([getattr(r.algorithm, name) for r in rounds]) for name in proto.carried}
    x_all, y_all, picks = _minibatches(rounds, datas, steps * m)

    def client_step(st: list[torch.Tensor], carry: dict[str, Any], values: dict[str, Any], xs: list[torch.Tensor],
                    ys: list[torch.Tensor]) -> tuple[list[torch.Tensor], dict[str, Any], torch.Tensor]:
        with _bound(proto, {**values, **carry}):
            new, loss = proto.step(f, st, list(zip(xs, ys)), lr)
            return new, {name: getattr(proto, name) for name in proto.carried}, loss

    stepped = vmap(client_step)
    totals = torch.zeros(len(rounds), dtype=torch.float64, device=state[0].device)
    with torch.no_grad():
        for k in range(steps):
            xs = [x_all[picks[k * m + j]] for j in range(m)]
            ys = [y_all[picks[k * m + j]] for j in range(m)]
            drawn = {}
            if proto.drawn:
                for i, r in enumerate(rounds):  # each client's draws from its own generator, as one by one
                    r.algorithm.steps = k
                    r.algorithm.draw([(x[i], y[i]) for x, y in zip(xs, ys)])
                drawn = {name: _stack([getattr(r.algorithm, name) for r in rounds]) for name in proto.drawn}
            proto.steps = k
            state, carried, loss = stepped(state, carried, {**own, **drawn}, xs, ys)
            totals += loss.detach().to(torch.float64)
    for i, r in enumerate(rounds):  # each client's carried tensors back into its algorithm, for ``finish``
        for name, value in carried.items():
            setattr(r.algorithm, name, _unstack(value, i))
    return state, (totals.cpu() / max(steps, 1)).tolist()


def _minibatches(rounds: Sequence[ClientRound], datas: Sequence[TrainData],
                 steps: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The clients' examples in one tensor each (``x``, ``y``) and, for every step, the ``(clients,
    batch)`` rows of each client's minibatch in them: each client's own stream, drawn as
    ``train_locally`` draws it."""
    picks, start = [], 0
    for r, d in zip(rounds, datas):
        stream = MinibatchStream(len(d.y), r.batch_size, r.generator)
        picks.append(torch.stack([stream.next() for _ in range(steps)]) + start)
        start += len(d.y)
    device = datas[0].y.device
    return torch.cat([d.x for d in datas]), torch.cat([d.y for d in datas]), torch.stack(picks, 1).to(device)


def _stack(values: Sequence[Any]) -> Any:
    """The clients' values of one attribute stacked: tensors into one, lists of tensors element by element."""
    first = values[0]
    if isinstance(first, torch.Tensor):
        return torch.stack(list(values))
    if isinstance(first, list | tuple):
        return [torch.stack(list(parts)) for parts in zip(*values)]
    raise TypeError(f"batched_state holds tensors or lists of them, got {type(first).__name__}")


def _unstack(value: Any, i: int) -> Any:
    """Client ``i``'s part of a ``_stack``ed value."""
    return value[i] if isinstance(value, torch.Tensor) else [v[i] for v in value]


def cross_entropy(logits: torch.Tensor, target: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    """``F.cross_entropy``, to the bit, in operations ``vmap`` batches natively: under ``vmap`` its ``nll_loss``
    has no batching rule and runs through PyTorch's Python decomposition (a fifth of a small model's step).
    Class indices for a ``[batch, classes]`` float32 or float64 input with the mean taken; anything else
    (other arguments, shapes, soft targets, autocast's types) is ``F.cross_entropy``'s own."""
    if args or kwargs or logits.dim() != 2 or target.dim() != 1 or target.dtype.is_floating_point \
            or logits.dtype not in (torch.float32, torch.float64):
        return F.cross_entropy(logits, target, *args, **kwargs)
    return -F.log_softmax(logits, -1).gather(-1, target[:, None]).sum() / target.shape[0]


@contextmanager
def _natively_batched_loss(algorithm: ClientAlgorithm) -> Iterator[None]:
    """The round's shared algorithm computing the default loss (``F.cross_entropy``) as ``cross_entropy`` while inside."""
    if getattr(algorithm, "loss_fn", None) is not F.cross_entropy:
        yield
        return
    with _bound(algorithm, {"loss_fn": cross_entropy}):
        yield


@contextmanager
def _bound(algorithm: ClientAlgorithm, values: dict[str, Any]) -> Iterator[None]:
    """``algorithm``'s attributes set to one client's ``values`` (under vmap: the batch's) while inside."""
    saved = {name: getattr(algorithm, name) for name in values}
    try:
        for name, value in values.items():
            setattr(algorithm, name, value)
        yield
    finally:
        for name, value in saved.items():
            setattr(algorithm, name, value)

