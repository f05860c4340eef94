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
import math
import os
import struct
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from flower_pfl.engine.memory import Blocks

_META = "flower-pfl"


def write(path: str | Path, tensors: Mapping[str, torch.Tensor | Blocks], meta: dict[str, Any]) -> None:
    """Write ``tensors`` and ``meta`` to ``path`` atomically."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        if any(isinstance(t, Blocks) for t in tensors.values()):
            _write_blocks(tmp, tensors, meta)
        else:
            contiguous = {k: t.detach().cpu().contiguous() for k, t in tensors.items() if isinstance(t, torch.Tensor)}
            save_file(contiguous, str(tmp), metadata={_META: json.dumps(meta)})
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


#: safetensors' names of the dtypes ``_write_blocks`` writes
_DTYPES = {torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16", torch.int64: "I64",
           torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8", torch.bool: "BOOL"}


def _write_blocks(path: Path, tensors: Mapping[str, torch.Tensor | Blocks], meta: dict[str, Any]) -> None:
    """The safetensors format (an 8-byte header length, the JSON header padded to 8 bytes, the tensors' bytes in
    the header's order) written tensor by tensor, a ``Blocks`` block by block."""
    header: dict[str, Any] = {"__metadata__": {_META: json.dumps(meta)}}
    offset = 0
    for name, t in tensors.items():
        if t.dtype not in _DTYPES:
            raise TypeError(f"{name}: cannot write a tensor of {t.dtype}")
        size = torch.empty((), dtype=t.dtype).element_size() * math.prod(t.shape)
        header[name] = {"dtype": _DTYPES[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + size]}
        offset += size
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(text)))
        fh.write(text)
        for name, t in tensors.items():
            written = 0
            for block in (t.blocks() if isinstance(t, Blocks) else [t]):
                data = block.detach().to(device="cpu", dtype=t.dtype).contiguous()
                fh.write(data.reshape(-1).view(torch.uint8).numpy().data if data.numel() else b"")
                written += data.numel() * data.element_size()
            if written != header[name]["data_offsets"][1] - header[name]["data_offsets"][0]:
                raise ValueError(f"{name}: its blocks hold {written} bytes, not the {tuple(t.shape)} tensor's")


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
    if isinstance(value, Blocks):  # written block by block
        tensors[name] = value  # type: ignore[assignment]
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
