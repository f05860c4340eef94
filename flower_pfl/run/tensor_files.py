"""Tensors and a JSON document in one safetensors file, written atomically (checkpoints, client state).

A file holds a flat ``name -> tensor`` mapping plus a JSON document (kept in the file's
metadata) for everything that is not a tensor: client ids, rounds, generator states, scalars.
safetensors cannot execute code when loaded (unlike a pickle). ``write`` goes through a
temporary file in the same folder, ``fsync`` and ``os.replace``: a crash mid-write leaves the
previous checkpoint as it was.

``pack`` / ``unpack`` turn the state objects used here into that form: tensors, numpy arrays,
dicts of per-client tensors, scalars and lists of them, nested dicts.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file

_META = "flower-pfl"


def write(path: str | Path, tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> None:
    """Write ``tensors`` and ``meta`` to ``path`` atomically."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    contiguous = {k: t.detach().cpu().contiguous() for k, t in tensors.items()}
    save_file(contiguous, str(tmp), metadata={_META: json.dumps(meta)})
    with open(tmp, "rb") as fh:
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


def read(path: str | Path) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """``(tensors, meta)`` of a checkpoint file."""
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as fh:
        meta = json.loads((fh.metadata() or {}).get(_META, "{}"))
    return load_file(str(path)), meta


def pack(value: Any, name: str, tensors: dict[str, torch.Tensor]) -> Any:
    """The JSON part of ``value``; its tensors go into ``tensors`` under names starting with ``name``."""
    if isinstance(value, torch.Tensor):
        tensors[name] = value.detach().cpu()
        return {"tensor": name}
    if isinstance(value, np.ndarray):
        tensors[name] = torch.from_numpy(np.ascontiguousarray(value))
        return {"ndarray": name}
    if isinstance(value, dict):
        keys = list(value)
        return {"dict": [[_key(k), pack(value[k], f"{name}.{i}", tensors)] for i, k in enumerate(keys)]}
    if isinstance(value, (list, tuple)):
        return {"list": [pack(v, f"{name}.{i}", tensors) for i, v in enumerate(value)], "tuple": isinstance(value, tuple)}
    if value is None or isinstance(value, (bool, int, float, str)):
        return {"value": value}
    if isinstance(value, np.generic):
        return {"value": value.item()}
    raise TypeError(f"cannot checkpoint {name} of type {type(value).__name__}")


def unpack(packed: Any, tensors: dict[str, torch.Tensor]) -> Any:
    """The value ``pack`` was given."""
    if "tensor" in packed:
        return tensors[packed["tensor"]]
    if "ndarray" in packed:
        return tensors[packed["ndarray"]].numpy()
    if "dict" in packed:
        return {_unkey(k): unpack(v, tensors) for k, v in packed["dict"]}
    if "list" in packed:
        items = [unpack(v, tensors) for v in packed["list"]]
        return tuple(items) if packed.get("tuple") else items
    return packed["value"]


def _key(key: Any) -> list[Any]:
    """A dict key (a client id: int or str) as JSON that keeps its type."""
    if isinstance(key, (bool, int, str)) or key is None:
        return [type(key).__name__, key]
    if isinstance(key, np.integer):
        return ["int", int(key)]
    raise TypeError(f"cannot checkpoint a dict key of type {type(key).__name__}")


def _unkey(key: list[Any]) -> Any:
    return key[1]
