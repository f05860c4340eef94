"""A model as a body (its feature extractor) and a head (its trailing layers): the split the
decoupling methods (FedPer, and methods that train or share the two apart) and the representation
methods (FedAttn's Z_i, prototypes, contrastive losses) share, declared once.

On the flat vector, the head is the model's trailing ``head_layers`` modules (found by parameter
name, ``ParamLayout.components("module")``) and the body the leading slice before them. On the
``nn.Module``, the head is the ``nn.Linear`` the model's attribute ``head_name`` names (every model of
the package says where its head begins), else its last ``nn.Linear``; its input is the model's
representation: ``forward_with_features`` returns it beside the logits (with its gradient),
``mean_features`` its mean over a data set. ``head_problem`` says why a model's head cannot serve
(its tensors must come last in the ``state_dict``, so that both views agree).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import nn

from flower_pfl.engine.layout import ParamLayout


def complement(columns: slice | torch.Tensor, dim: int) -> slice | torch.Tensor:
    """The columns of a flat model of ``dim`` values that ``columns`` (a slice, or an index tensor) leaves out:
    a slice where they are one run, else an index tensor."""
    if isinstance(columns, slice):
        start, stop, step = columns.indices(dim)
        if step == 1 and start == 0:
            return slice(stop, dim)
        if step == 1 and stop == dim:
            return slice(0, start)
    keep = torch.ones(dim, dtype=torch.bool)
    keep[columns.cpu() if isinstance(columns, torch.Tensor) else columns] = False
    return keep.nonzero().flatten()


def body_slice(layout: ParamLayout, head_layers: int = 1) -> slice:
    """The body's columns of the flat model: every module before the last ``head_layers``. Raises
    ``ValueError`` for a model without parameter names or without a module left for the body."""
    if not layout.named:
        raise ValueError("the body and head are found by parameter name, and this model's have none: give the "
                         "strategy the initial model with its parameter names (a state_dict)")
    modules = layout.components("module")
    if not 1 <= head_layers < len(modules):
        raise ValueError(f"head_layers = {head_layers} leaves no body layer ({len(modules)} layers: "
                         f"{[name for name, _ in modules]})")
    return slice(0, modules[len(modules) - head_layers - 1][1].stop)


def head_slice(layout: ParamLayout, head_layers: int = 1) -> slice:
    """The head's columns of the flat model: the last ``head_layers`` modules, a trailing slice."""
    return slice(body_slice(layout, head_layers).stop, layout.dim)


def head_flags(model: nn.Module, head_layers: int) -> list[bool]:
    """For each trainable parameter of ``model``, whether it is in the head: the trailing
    ``head_layers`` modules, found as the server finds them (``head_slice``)."""
    layout = ParamLayout.from_module(model)
    start = head_slice(layout, head_layers).start
    in_head = {name for name, columns in zip(layout.names, layout.tensor_slices()) if columns.start >= start}
    return [name in in_head for name, p in model.named_parameters() if p.requires_grad]


def drop_frozen(grads: Sequence[torch.Tensor | None], flags: Sequence[bool]) -> list[torch.Tensor | None]:
    """``grads`` with those of the parameters flagged in ``flags`` dropped for this step: ``None``, which
    plain SGD and ``torch.optim`` optimizers skip (no step, no weight decay, no momentum update)."""
    return [None if off else g for g, off in zip(grads, flags)]


#: the attribute by which a model names its head module (``"fc"``, ``"classifier.fc3"``)
HEAD_NAME = "head_name"


def head_name(model: nn.Module) -> str:
    """The name of the model's head module: its ``head_name``, else its last ``nn.Linear``'s."""
    declared = model.__dict__.get(HEAD_NAME, getattr(type(model), HEAD_NAME, None))
    if declared is not None:
        return str(declared)
    linear = [name for name, m in model.named_modules() if isinstance(m, nn.Linear)]
    if not linear:
        raise ValueError(f"{type(model).__name__} has no nn.Linear layer to take as its head (name one with its "
                         f"attribute {HEAD_NAME!r})")
    return linear[-1]


def head_module(model: nn.Module) -> nn.Linear:
    """The model's head: the ``nn.Linear`` whose input is the model's representation (``head_name``)."""
    name = head_name(model)
    try:
        head = model.get_submodule(name)
    except AttributeError as err:
        raise ValueError(f"{type(model).__name__}.{HEAD_NAME} = {name!r} names no module of the model") from err
    if not isinstance(head, nn.Linear):
        raise ValueError(f"{type(model).__name__}'s head {name!r} is a {type(head).__name__}, not an nn.Linear")
    return head


def head_problem(model: nn.Module) -> str | None:
    """Why the model's head cannot serve the methods that split it or read its representation (``None``: it
    can): none is found, it is no ``nn.Linear``, or its tensors are not the last of the ``state_dict``."""
    try:
        name = head_name(model)
        head_module(model)
    except ValueError as err:
        return str(err)
    modules = ParamLayout.from_module(model).components("module")
    if not modules or modules[-1][0] != name:
        last = modules[-1][0] if modules else None
        return (f"its head {name!r} is not the last module of its state_dict ({last!r} is): the head's tensors must "
                "come last, register the head after the other layers")
    return None


def forward_with_features(model: nn.Module, x: torch.Tensor,
                          run: Callable[[torch.Tensor], torch.Tensor] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The model's logits on ``x`` and the head's input (the representation), flattened to ``(n, d)``;
    both keep their gradients. ``run`` calls the model (default ``model(x)``; a ``functional_call``)."""
    captured: list[torch.Tensor] = []
    handle = head_module(model).register_forward_hook(lambda _m, inputs, _out: captured.append(inputs[0]))
    try:
        logits = model(x) if run is None else run(x)
    finally:
        handle.remove()
    return logits, captured[0].flatten(1)


@torch.no_grad()
def mean_features(model: nn.Module, x: torch.Tensor, batch_size: int = 4096) -> torch.Tensor:
    """The mean over ``x`` of the head's input (for a model with one layer, the input itself)."""
    if len(x) == 0:
        raise ValueError("no data to compute a representation from")
    model.eval()
    sums = [forward_with_features(model, x[start:start + batch_size])[1].sum(0) for start in range(0, len(x), batch_size)]
    return torch.stack(sums).sum(0) / len(x)
