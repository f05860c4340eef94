"""Pretrained weights for a starting model, from a local file (nothing is downloaded at run time)."""

from __future__ import annotations

import warnings
from pathlib import Path

import torch
from torch import nn

from flower_pfl.engine.model_split import head_name


def read_weights(path: str | Path) -> dict[str, torch.Tensor]:
    """The tensors of a weights file: safetensors (``.safetensors``), or ``torch.save`` of a ``state_dict``
    (or of a dict holding one under ``state_dict`` or ``model``), read without running code."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"run config 'pretrained' = {str(path)!r}: no such file")
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        return dict(load_file(str(path)))
    try:
        loaded = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # not a torch file, or one that holds more than tensors
        raise ValueError(f"run config 'pretrained' = {str(path)!r}: not a file of tensors torch.load reads safely ({err})") from err
    for key in ("state_dict", "model"):
        if isinstance(loaded, dict) and isinstance(loaded.get(key), dict):
            loaded = loaded[key]
    if not isinstance(loaded, dict) or not all(isinstance(v, torch.Tensor) for v in loaded.values()):
        raise ValueError(f"run config 'pretrained' = {str(path)!r}: holds no state_dict (a mapping of names to tensors)")
    return dict(loaded)


def load_pretrained(model: nn.Module, path: str | Path) -> list[str]:
    """Load into ``model`` the tensors of ``path`` whose names and shapes match its own; returns the names of
    its tensors left at their initialization (a warning names those outside the head). A file matching no
    tensor is a ``ValueError``."""
    weights, state = read_weights(path), model.state_dict()
    matched = {name: w for name, w in weights.items() if name in state and tuple(w.shape) == tuple(state[name].shape)}
    if not matched:
        raise ValueError(f"run config 'pretrained' = {str(path)!r}: none of its {len(weights)} tensors matches the model's "
                         f"names and shapes (the model's first: {list(state)[:3]}; the file's: {list(weights)[:3]})")
    model.load_state_dict(matched, strict=False)
    left = [name for name in state if name not in matched]
    head = head_name(model)
    if outside := [name for name in left if not name.startswith(head + ".")]:
        warnings.warn(f"pretrained = {str(path)!r}: {len(outside)} tensors outside the head keep their initialization "
                      f"(no tensor of that name and shape in the file): {', '.join(outside[:8])}"
                      f"{' ...' if len(outside) > 8 else ''}", UserWarning, stacklevel=2)
    return left
