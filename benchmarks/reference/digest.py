"""SHA-256 of a client's arrays: how ``export.py`` and the launchers check that a library reads back
the very data this package wrote. NumPy only, so that the launchers, run by PFLlib's and FL-bench's
own Python (``python benchmarks/reference/pfllib_launch.py``, this folder on ``sys.path``), import
it too."""

from __future__ import annotations

import hashlib

import numpy as np


def digest(x_train: np.ndarray, y_train: np.ndarray, x_test: np.ndarray, y_test: np.ndarray) -> str:
    """SHA-256 over a client's train/test arrays (float32 features, int64 labels, in that order)."""
    h = hashlib.sha256()
    for i, a in enumerate((x_train, y_train, x_test, y_test)):
        a = np.ascontiguousarray(a, dtype=np.float32 if i % 2 == 0 else np.int64)
        h.update(str(a.shape).encode())
        h.update(a.tobytes())
    return h.hexdigest()
