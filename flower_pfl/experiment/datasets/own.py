"""A researcher's own data, by import path: ``dataset = "my_pkg.my_module:my_function"``.

``my_function()`` returns ``(x, y)`` (or ``(x, y, client_ids)`` for a natural partition, one client per
id): ``x`` with samples first, any feature shape, floating point (images, signals or features, used as
they are) or integer token ids (``int64``); ``y`` integer labels ``0..classes-1``. The package then
partitions, splits, batches and evaluates them like its own data sets.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import numpy as np
import torch

from flower_pfl.experiment.data.imports import load_callable
from flower_pfl.experiment.data.info import DataInfo
from flower_pfl.experiment.datasets.base import DataSet, Encoder, Pool, Where


def _array(value: Any) -> np.ndarray:
    return value.detach().cpu().numpy() if isinstance(value, torch.Tensor) else np.asarray(value)


@lru_cache(maxsize=2)
def load_own(path: str) -> Pool:
    """``my_function()``'s samples at ``path``, checked; a ``ValueError`` naming ``path`` and what is wrong."""
    what = f"run config 'dataset' = {path!r}"
    out = load_callable(path, "run config 'dataset'")()
    if not isinstance(out, tuple | list) or len(out) not in (2, 3):
        raise ValueError(f"{what}: {path.partition(':')[2]}() returned a {type(out).__name__}; it must return (x, y) or (x, y, client_ids)")
    x, y = _array(out[0]), _array(out[1])
    if x.ndim < 1 or len(x) < 2:
        raise ValueError(f"{what}: x must hold samples along its first dimension (at least 2), got shape {x.shape}")
    if x.dtype == np.uint8 or not (np.issubdtype(x.dtype, np.floating) or np.issubdtype(x.dtype, np.integer)):
        raise ValueError(f"{what}: x is {x.dtype}; give floating-point features (images scaled as you like) or int64 token ids")
    if y.ndim != 1 or len(y) != len(x):
        raise ValueError(f"{what}: y must be one label per sample ({len(x)}), got shape {y.shape}")
    if not np.issubdtype(y.dtype, np.integer):
        raise ValueError(f"{what}: labels are {y.dtype}, not integers (give class ids 0..classes-1)")
    if y.min() < 0:
        raise ValueError(f"{what}: labels must be >= 0, got {int(y.min())}")
    if np.issubdtype(x.dtype, np.integer) and x.min() < 0:
        raise ValueError(f"{what}: token ids must be >= 0, got {int(x.min())}")
    if np.issubdtype(x.dtype, np.floating) and not np.isfinite(x).all():
        raise ValueError(f"{what}: x holds NaN or infinite values")
    groups = None if len(out) == 2 else np.asarray([str(g) for g in _array(out[2])], dtype=object)
    if groups is not None and len(groups) != len(x):
        raise ValueError(f"{what}: client_ids must be one per sample ({len(x)}), got {len(groups)}")
    x = x.astype(np.int64) if np.issubdtype(x.dtype, np.integer) else x.astype(np.float32)
    return Pool(x, y.astype(np.int64), groups)


def kind_of(x: np.ndarray) -> str:
    """``tokens`` for integer ids, else by the sample's dimensions: ``image`` (3), ``signals`` (2), ``features``."""
    if np.issubdtype(x.dtype, np.integer):
        return "tokens"
    return {3: "image", 2: "signals"}.get(x.ndim - 1, "features")


@dataclass
class OwnData(DataSet):
    """A researcher's data set at an import path (``load_own``)."""

    path: str = field(default="")

    kind = "features"  # the class's; an instance's comes from its data (``info``)
    natural = "client id"
    files_text = "the function's return value"

    @property
    def name(self) -> str:  # type: ignore[override]
        return self.path

    def info(self) -> DataInfo:
        pool = load_own(self.path)
        kind = kind_of(pool.x)
        vocab = int(pool.x.max()) + 1 if kind == "tokens" else 0
        return DataInfo(tuple(pool.x.shape[1:]), int(pool.y.max()) + 1, kind, vocab_size=vocab)

    def pool(self, where: Where, num_partitions: int, seed: int) -> Pool:
        return load_own(self.path)

    def encoder(self, train_parts: Any) -> Encoder:
        return lambda x: torch.as_tensor(x)
