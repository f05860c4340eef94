"""Small data sets of one's own, by import path (``dataset = "tests.family_data:images"``), for the runs of
every method on every model family: the label is written into each sample so that a model can learn it."""

from __future__ import annotations

import numpy as np

SAMPLES, CLASSES = 64, 4


def _labels(seed: int) -> tuple[np.random.Generator, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng, rng.integers(0, CLASSES, SAMPLES)


def images() -> tuple[np.ndarray, np.ndarray]:
    """Colour 16x16 images: noise plus a brightness of the label."""
    rng, y = _labels(0)
    return rng.normal(size=(SAMPLES, 3, 16, 16)).astype(np.float32) + y[:, None, None, None], y


def tokens() -> tuple[np.ndarray, np.ndarray]:
    """Sequences of 12 token ids below 30, the first one ``30 + label``."""
    rng, y = _labels(1)
    x = rng.integers(1, 30, size=(SAMPLES, 12))
    x[:, 0] = 30 + y
    return x.astype(np.int64), y
