"""Flat float32 vectors as bytes: how server state (Δw_ps, SCAFFOLD's c) and client extras
(SCAFFOLD's Δc_i) travel in Flower's config records and legacy metrics, the same in both APIs; and a
round's instruction models made into a message's arrays, each array once (``RoundArrays``)."""

from __future__ import annotations

import zlib
from collections.abc import Callable, Collection, Iterable, Sequence
from typing import Generic, TypeVar

import numpy as np
import torch

from flower_pfl.engine.layout import ParamLayout

T = TypeVar("T")


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


class RoundArrays(Generic[T]):
    """A round's instruction models made into a message's arrays (``encode``: Flower's ``Array``, or a legacy
    ``Parameters``' bytes), each array made once: a model several clients get (one tensor, a global model's) is
    made once, and a tensor of ``common`` (places in ``layout``) equal to the one first made for it is that one
    again (FedPer's base, FedAttn's weights): what a round's messages hold grows with what differs between
    clients, not with whole models times clients (``ServerAlgorithm.common_tensors``)."""

    def __init__(self, layout: ParamLayout, common: Collection[int], encode: Callable[[np.ndarray], T]) -> None:
        self.layout, self.common, self.encode = layout, frozenset(common), encode
        self._first: dict[int, tuple[torch.Tensor, T]] = {}
        self._last: tuple[torch.Tensor, list[T]] | None = None  # held: its id is not reused while it is here

    def __call__(self, model: torch.Tensor) -> list[T]:
        """``model``'s (a flat float32 vector on the host) arrays, in the layout's order; the same list for the
        same model as the call before."""
        if self._last is not None and self._last[0] is model:
            return self._last[1]
        out = []
        for i, (columns, shape) in enumerate(zip(self.layout.tensor_slices(), self.layout.shapes)):
            part = model[columns]
            first = self._first.get(i) if i in self.common else None
            if first is not None and torch.equal(first[0], part):
                out.append(first[1])
                continue
            made = self.encode(part.reshape(shape).numpy())
            if i in self.common and first is None:
                self._first[i] = (part.clone(), made)
            out.append(made)
        self._last = (model, out)
        return out
