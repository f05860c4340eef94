"""Clients trained one by one (``train_locally``) and as one computation (``train_together``) from the same
received models, data and generators: the two must give the same models, losses and extras."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import torch
from floats import assert_same_math, same_math

from flower_pfl.engine.batched import ClientRound, train_together
from flower_pfl.engine.client_algorithm import ClientAlgorithm, TrainData, train_locally

SIZES = (50, 12, 80, 40)  # the second client has fewer examples than a batch: a group of its own
STEPS, LR, BATCH = 7, 0.05, 20
Make = Callable[[torch.nn.Module, int], ClientAlgorithm]


def clients(model: torch.nn.Module, shape: tuple[int, ...], classes: int = 3,
            seed: int = 0) -> tuple[list[TrainData], list[list[torch.Tensor]]]:
    """Each client's training split and received model (the model's tensors, moved a little per client)."""
    torch.manual_seed(seed)
    datas = [TrainData(torch.randn(n, *shape), torch.randint(0, classes, (n,))) for n in SIZES]
    starts = [[t + 0.01 * i if t.is_floating_point() else t.clone() for t in model.state_dict().values()]
              for i in range(len(SIZES))]
    return datas, starts


def load(model: torch.nn.Module, tensors: list[torch.Tensor]) -> None:
    with torch.no_grad():
        for t, v in zip(model.state_dict().values(), tensors):
            t.copy_(v)


def one_by_one(model, datas, starts, make: Make, steps: int = STEPS,
               lr: float = LR) -> list[tuple[list[torch.Tensor], float, dict[str, Any]]]:
    out = []
    for i, d in enumerate(datas):
        m = copy.deepcopy(model)
        load(m, starts[i])
        result, extras = train_locally(make(m, i), m, d, steps=steps, lr=lr, batch_size=BATCH,
                                       generator=torch.Generator().manual_seed(i))
        out.append(([t.clone() for t in m.state_dict().values()], result.loss, extras))
    return out


def together(model, datas, starts, make: Make, steps: int = STEPS,
             lr: float = LR) -> list[tuple[list[torch.Tensor], float, dict[str, Any]]]:
    shared, rounds = copy.deepcopy(model), []
    for i, d in enumerate(datas):
        load(shared, starts[i])
        rounds.append(ClientRound(make(shared, i), d, steps, lr, BATCH, torch.Generator().manual_seed(i),
                                  [t.clone() for t in starts[i]]))
    return [(tensors, result.loss, extras) for tensors, result, extras in train_together(shared, rounds)]


def assert_together_is_one_by_one(model: torch.nn.Module, shape: tuple[int, ...], make: Make,
                                  same_extras: Callable[[dict[str, Any], dict[str, Any]], None] | None = None) -> None:
    """Every client's trained model, loss and extras (compared by ``same_extras``; default: equal) are the same
    both ways, and the clients trained (their models moved)."""
    datas, starts = clients(model, shape)
    for (a, loss_a, extras_a), (b, loss_b, extras_b), start in zip(one_by_one(model, datas, starts, make),
                                                                   together(model, datas, starts, make), starts):
        for x, y in zip(a, b):
            assert_same_math(y, x)
        assert loss_b == same_math(loss_a)
        if same_extras is None:
            assert extras_b == extras_a
        else:
            same_extras(extras_a, extras_b)
        assert any(not torch.allclose(x.float(), s.float(), atol=1e-4) for x, s in zip(a, start))  # it trained


def same_vector_extras(key: str) -> Callable[[dict[str, Any], dict[str, Any]], None]:
    """``same_extras`` for replies that carry one flat float32 vector under ``key`` (side modules, statistics):
    the same keys and receipt, the vectors within float tolerance."""
    from flower_pfl.engine.client_algorithm import CLIENT_ALGORITHM
    from flower_pfl.engine.wire import decode_flat

    def same(a: dict[str, Any], b: dict[str, Any]) -> None:
        assert a.keys() == b.keys() and a.get(CLIENT_ALGORITHM) == b.get(CLIENT_ALGORITHM)
        size = len(a[key]) // 4
        assert_same_math(decode_flat(b[key], size), decode_flat(a[key], size))

    return same
