"""A method's client algorithm in your own training loop.

A method whose client algorithm is plain local training (``sgd``: FedACS, FedAvg+MCSA, Local, FedAvg,
FedAvgM, FedAdam, ...) works with any ClientApp that trains the received model and sends it back. For
the others, ``algorithm_for`` looks up the client algorithm the training instruction names
(``client-algorithm``) and hands it to you: the very object this package's own ClientApp runs
(``flower_pfl.engine.client_algorithm``), with two hooks for an ordinary PyTorch loop::

    algorithm = algorithm_for(config, model, context.state)
    optimizer = torch.optim.SGD(model.parameters(), lr=config["lr"])
    for x, y in loader:
        optimizer.zero_grad()
        F.cross_entropy(model(x), y).backward()
        algorithm.adjust_gradients(model, (x, y))
        optimizer.step()
    extras = algorithm.finish(model, train_inputs)  # what the strategy needs back, with the receipt

Send ``extras`` back as a ``ConfigRecord`` in the reply (Message API) or inside the fit metrics
(legacy API): besides the bytes some algorithms return, they hold the receipt (``client-algorithm`` =
the algorithm's name), without which the strategy warns once that its clients ignored the algorithm
(the method then runs as another one, e.g. FedMCSA without λ). The IGFL-C, SCAFFOLD, FedAttn and
pFedMe algorithms assume plain SGD steps of the instruction's ``lr`` (no momentum, weight decay,
schedule or clipping); pass the optimizer to ``algorithm_for`` to have that checked, and send ``lr``
and ``local-steps`` in the strategy's train config. For example:

- proximal term ``μ/2 ||w − a||²`` (FedMCSA, FedProx, FedAMP, HeurFedAMP; the anchor ``a`` is the
  received model, or the one the client remembered for FedMCSA's clients that were not sampled);
- IGFL-C's individual and group correction (IGFL, Huang, Shang et al., Algorithm 2): exactly
  ``local-steps`` steps;
- SCAFFOLD's control variates (option II), which returns ``Δc_i``;
- FedAttn's optional bias stabiliser; returns ``Z_i`` and the bias gradient (``finish`` needs
  the client's training inputs);
- pFedMe's personalized model θ_i (``adjust_gradients`` needs the minibatch): the inner
  problem is solved on the batch and the gradient replaced by ``λ (w − θ_i)``.

Ditto, APFL, Per-FedAvg and others train a second model or take a second minibatch per step; they
are not hooks on one loop: ``algorithm_for`` refuses them, naming this package's ClientApp
(``client_apps.app``). Client state lives in ``context.state`` (one ``ArrayRecord`` per entry), so it
survives between rounds on a SuperNode and in simulation alike.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, MutableMapping
from typing import Any

import torch
import torch.nn.functional as F
from flwr.app import ArrayRecord, RecordDict
from torch import nn

from flower_pfl.engine.client_algorithm import ClientAlgorithm
from flower_pfl.methods.registry import client_algorithm_for

__all__ = ["RecordState", "algorithm_for", "client_state"]


class RecordState(MutableMapping[str, list[torch.Tensor]]):
    """``context.state`` (a ``RecordDict``) seen as the client state the steps use: one
    ``ArrayRecord`` per entry, read and written as lists of tensors."""

    def __init__(self, records: RecordDict) -> None:
        self.records = records

    def __getitem__(self, key: str) -> list[torch.Tensor]:
        return [torch.as_tensor(a) for a in self.records.array_records[key].to_numpy_ndarrays()]

    def __setitem__(self, key: str, tensors: list[torch.Tensor]) -> None:
        self.records[key] = ArrayRecord([t.detach().cpu().numpy() for t in tensors])

    def __delitem__(self, key: str) -> None:
        del self.records[key]

    def __iter__(self) -> Iterator[str]:
        return iter(list(self.records.array_records.keys()))

    def __len__(self) -> int:
        return len(self.records.array_records)


def client_state(state: RecordDict | MutableMapping[str, list[torch.Tensor]] | None) -> MutableMapping[str, list[torch.Tensor]] | None:
    """``context.state`` as a client state (a plain mapping of tensor lists passes through)."""
    return RecordState(state) if isinstance(state, RecordDict) else state


def algorithm_for(config: Mapping[str, Any], model: nn.Module, state: RecordDict | None = None,
                  optimizer: torch.optim.Optimizer | None = None,
                  loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = F.cross_entropy) -> ClientAlgorithm:
    """The client algorithm the training instruction ``config`` names, ready for your loop; call it
    after loading the received model into ``model`` (see the module docstring).

    ``state``: the node's ``context.state``; ``optimizer``: checked to be what the algorithm assumes
    (plain SGD, no momentum or weight decay, ``lr`` as sent) when given; ``loss_fn(logits, y)``:
    your loss, for algorithms that evaluate it themselves (pFedMe's inner problem). The classes live
    beside their methods (``flower_pfl.methods``; e.g. ``ScaffoldCorrection`` in ``scaffold``).
    """
    algorithm = client_algorithm_for(config)
    if not algorithm.hookable:
        raise ValueError(f"{algorithm.__name__} trains a second model or takes a second minibatch per step; "
                         "use client_apps.app's ClientApp for it")
    made = algorithm(model, config, client_state(state), loss_fn)
    if optimizer is not None and made.needs_plain_sgd:
        made.check_optimizer(optimizer)
    return made
