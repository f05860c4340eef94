"""A model of the researcher's own, by import path: ``model = "my_pkg.my_module:my_factory"``.

``my_factory(input_shape, num_classes)`` returns a ``torch.nn.Module`` taking a batch of samples of
``input_shape`` (one sample's shape, without the batch dimension) to ``(batch, num_classes)`` logits.
The methods that split a model into a body and a head, or read its representation, take as its head
the module its attribute ``head_name`` names, else its last ``nn.Linear``.
"""

from __future__ import annotations

import torch
from torch import nn

from flower_pfl.experiment.data.imports import load_callable
from flower_pfl.experiment.data.info import DataInfo


def build_own_model(path: str, data: DataInfo) -> nn.Module:
    """``my_factory(input_shape, num_classes)`` at ``path``, checked: a ``torch.nn.Module`` that maps two
    samples to ``(2, num_classes)`` logits."""
    factory = load_callable(path, "run config 'model'")
    model = factory(tuple(data.input_shape), data.num_classes)
    if not isinstance(model, nn.Module):
        raise ValueError(f"run config 'model' = {path!r}: {path.partition(':')[2]}(input_shape, num_classes) returned a "
                         f"{type(model).__name__}, not a torch.nn.Module")
    sample = (torch.zeros((2, *data.input_shape), dtype=torch.int64) if data.kind == "tokens"
              else torch.zeros((2, *data.input_shape)))
    model.eval()
    try:
        with torch.no_grad():
            out = model(sample)
    except Exception as err:  # the user's forward
        raise ValueError(f"run config 'model' = {path!r}: the model fails on a batch of 2 samples of shape "
                         f"{tuple(data.input_shape)} ({type(err).__name__}: {err})") from err
    model.train()
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != (2, data.num_classes):
        got = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        raise ValueError(f"run config 'model' = {path!r}: the model maps 2 samples of shape {tuple(data.input_shape)} to "
                         f"{got}; it must give logits of shape (2, {data.num_classes}) (batch, classes)")
    return model
