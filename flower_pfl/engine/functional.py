"""A model as a function of its tensors, for steps written once and run for one client or, under
``torch.func.vmap``, for a round's clients at once (``flower_pfl.engine.batched``).

A model's *state* is its ``state_dict``'s tensors in order: trainable parameters and buffers (batch
normalization's running statistics) alike, so a second model (Ditto's personal one, an HPM) is a second
state, stacked across clients like the first. ``Functional(model)`` runs the model on a state
(``torch.func.functional_call``); ``grad`` differentiates a loss with respect to a state's trainable
entries and any extra tensors, and gives back the state with the buffers its forward passes updated
(a training-mode forward pass updates running statistics as ``model(x)`` does). Buffers are cloned
inside the transform, so a step never writes into a tensor it was handed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn
from torch.func import functional_call, grad_and_value
from torch.utils._pytree import tree_map

from flower_pfl.engine.layout import ParamLayout
from flower_pfl.engine.model_split import forward_with_features, head_module, head_name

State = list[torch.Tensor]


class Functional:
    """``model`` (its architecture; its own tensors are never read) as ``f(state, x)``."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        entries = model.state_dict(keep_vars=True)
        self.names = list(entries)
        trainable = {id(p) for p in model.parameters() if p.requires_grad}
        #: per state entry: whether it is a trainable parameter (else a buffer or a frozen parameter)
        self.trains = [id(v) in trainable for v in entries.values()]

    def state(self, model: nn.Module | None = None) -> State:
        """The state of ``model`` (default: this one's), detached."""
        return [t.detach() for t in (model or self.model).state_dict().values()]

    def kept(self, client_state: Mapping[str, list[torch.Tensor]] | None, key: str) -> State:
        """A second model's state: the flat model kept under ``key`` in the client state, else this model's
        (the received one), copied."""
        mine = self.state()
        known = None if client_state is None else client_state.get(key)
        if known is None:
            return [t.clone() for t in mine]
        parts = ParamLayout.from_module(self.model).unflatten(known[0])
        return [parts[name].to(device=t.device, dtype=t.dtype).clone() for name, t in zip(self.names, mine)]

    def flat(self, state: Sequence[torch.Tensor]) -> torch.Tensor:
        """``state`` as one float32 vector (``flatten_module``'s layout, what a client state keeps)."""
        return ParamLayout.from_module(self.model).flatten(t.detach() for t in state)

    def params(self, state: Sequence[torch.Tensor]) -> State:
        """The trainable entries of ``state`` (``trainable(model)`` order)."""
        return [t for t, train in zip(state, self.trains) if train]

    def others(self, state: Sequence[torch.Tensor]) -> State:
        """The entries of ``state`` that are not trainable (buffers, frozen parameters)."""
        return [t for t, train in zip(state, self.trains) if not train]

    def join(self, params: Sequence[torch.Tensor], others: Sequence[torch.Tensor]) -> State:
        """The state whose trainable entries are ``params`` and other entries ``others``."""
        p, o = iter(params), iter(others)
        return [next(p) if train else next(o) for train in self.trains]

    def with_params(self, state: Sequence[torch.Tensor], params: Sequence[torch.Tensor]) -> State:
        """``state`` with its trainable entries replaced by ``params``."""
        return self.join(params, self.others(state))

    def __call__(self, state: Sequence[torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        """The logits of the model holding ``state`` (in its current mode)."""
        return functional_call(self.model, dict(zip(self.names, state)), (x,), tie_weights=False, strict=True)

    def with_features(self, state: Sequence[torch.Tensor], x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The logits and the head's input (``forward_with_features``) of the model holding ``state``."""
        return forward_with_features(self.model, x, lambda inputs: self(state, inputs))

    def head(self, state: Sequence[torch.Tensor], z: torch.Tensor) -> torch.Tensor:
        """The head (``head_module``) of the model holding ``state``, on the representations ``z``."""
        prefix = head_name(self.model) + "."
        entries = {name[len(prefix):]: t for name, t in zip(self.names, state) if name.startswith(prefix)}
        return functional_call(head_module(self.model), entries, (z,), tie_weights=False, strict=True)

    @contextmanager
    def evaluating(self) -> Iterator[None]:
        """The model in evaluation mode inside (running statistics read, not updated)."""
        training = self.model.training
        self.model.eval()
        try:
            yield
        finally:
            self.model.train(training)

    def grad(self, loss_of: Callable[..., Any], state: Sequence[torch.Tensor], *extra: Any,
             has_aux: bool = False) -> tuple[State, tuple[Any, ...], torch.Tensor, State, Any]:
        """Differentiate ``loss_of(state, *extra)`` (a scalar, or ``(scalar, aux)`` with ``has_aux``) with
        respect to ``state``'s trainable entries and ``extra`` (tensors or lists of them): returns the
        gradients of the trainable entries (``params`` order), those of ``extra``, the loss, the state with
        the buffers the function's forward passes updated, and the aux (``None`` without)."""
        others = self.others(state)

        def inner(params: State, *ext: Any) -> tuple[torch.Tensor, tuple[State, Any]]:
            inside = self.join(params, [t.clone() for t in others])
            out = loss_of(inside, *ext)
            loss, aux = out if has_aux else (out, ())
            return loss, (self.others(inside), aux)

        grads, (loss, (updated, aux)) = gradients(inner, self.params(state), *extra)
        return grads[0], tuple(grads[1:]), loss, self.join(self.params(state), updated), aux if has_aux else None


def gradients(loss_of: Callable[..., tuple[torch.Tensor, Any]], *args: Any) -> tuple[tuple[Any, ...], tuple[torch.Tensor, Any]]:
    """``torch.func.grad_and_value(loss_of, argnums=every argument, has_aux=True)(*args)``: the gradients with
    respect to every argument (a tensor or a list of tensors) and ``(loss, aux)``. Under ``vmap`` (a round's clients
    at once) through ``torch.func``; for one client through ``torch.autograd``, the same math without the
    transforms' per-call cost."""
    if _transformed():
        return grad_and_value(loss_of, argnums=tuple(range(len(args))), has_aux=True)(*args)
    return _autograd_grad_and_value(loss_of, *args)


def _transformed() -> bool:
    """Whether the caller runs inside a ``torch.func`` transform (``vmap``, ``grad``)."""
    level = getattr(torch._C._functorch, "maybe_current_level", None)
    return level is None or level() is not None  # unknown: take the transforms' path, which is always right


def _autograd_grad_and_value(inner: Callable[..., tuple[torch.Tensor, Any]], *args: Any) -> tuple[tuple[Any, ...], tuple[torch.Tensor, Any]]:
    """``grad_and_value(inner, argnums=all, has_aux=True)(*args)`` with ``torch.autograd``: each argument a tensor
    or a list of tensors; the gradient of an input the value does not depend on is zeros, as torch.func gives."""
    leaves = [[t.detach().requires_grad_(True) for t in a] if isinstance(a, list | tuple) else a.detach().requires_grad_(True)
              for a in args]
    flat = [t for a in leaves for t in (a if isinstance(a, list) else [a])]
    with torch.enable_grad():
        value, aux = inner(*leaves)
        found = torch.autograd.grad(value, flat, allow_unused=True) if value.requires_grad else [None] * len(flat)
    it = iter(torch.zeros_like(t) if g is None else g for t, g in zip(flat, found))
    grads = tuple([next(it) for _ in a] if isinstance(a, list) else next(it) for a in leaves)
    return grads, (value.detach(), tree_map(lambda t: t.detach() if isinstance(t, torch.Tensor) else t, aux))


def sgd(params: Sequence[torch.Tensor], grads: Sequence[torch.Tensor | None], lr: float) -> State:
    """``p − lr · g`` for each parameter (``None``: left where it is)."""
    return [p if g is None else p - lr * g for p, g in zip(params, grads)]
