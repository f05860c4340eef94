"""Flat float32 vectors as bytes: how server state (Δw_ps, SCAFFOLD's c) and client extras
(SCAFFOLD's Δc_i) travel in Flower's config records and legacy metrics, the same in both APIs."""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Sequence

import numpy as np
import torch


def encode_vector(vector: torch.Tensor) -> bytes:
    """A flat vector as little-endian float32 bytes."""
    return vector.detach().cpu().numpy().astype("<f4").tobytes()


def decode_flat(data: bytes, size: int, name: str = "") -> torch.Tensor:
    """``encode_vector``'s bytes as a flat vector of ``size`` values (``ValueError`` otherwise, naming
    the field ``name`` the bytes came in)."""
    if not isinstance(data, bytes) or len(data) != 4 * size:
        got = f"{len(data) // 4} values" if isinstance(data, bytes) else type(data).__name__
        raise ValueError(f"{f'{name!r}: ' if name else ''}expected {size} float32 values as bytes, got {got}")
    return torch.from_numpy(np.frombuffer(data, dtype="<f4").astype(np.float32))


def decode_vector(data: bytes, like: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """``encode_vector``'s bytes split into tensors shaped like ``like``."""
    sizes = [t.numel() for t in like]
    flat = decode_flat(data, sum(sizes))
    return [chunk.view_as(t) for chunk, t in zip(flat.split(sizes), like)]


def fingerprint(arrays: Iterable[np.ndarray | torch.Tensor]) -> int:
    """CRC-32 of the arrays' float32 bytes, in order (the same for a model's arrays and its flat vector).

    A client reports it for the model it received, so the server's records show which model each
    client evaluated without the model travelling back."""
    crc = 0
    for a in arrays:
        a = a.detach().cpu().numpy() if isinstance(a, torch.Tensor) else a
        crc = zlib.crc32(np.ascontiguousarray(a, dtype="<f4").tobytes(), crc)
    return crc
