"""The data: vibration windows of machines, four conditions, one machine per client.

Replace ``vibrations`` with a function that reads your files. It returns ``(x, y)`` or ``(x, y, client_ids)``:
``x`` with samples first (floating point: images, signals or features; or int64 token ids), ``y`` integer
labels ``0..classes-1``, and for ``partition = "natural"`` one client id per sample. flower-pfl then
partitions, splits, batches and evaluates them as it does its own data sets.
"""

from __future__ import annotations

import numpy as np

CONDITIONS = ("healthy", "imbalance", "misalignment", "bearing fault")
MACHINES, WINDOWS, STEPS = 8, 160, 64


def vibrations() -> tuple[np.ndarray, np.ndarray, list[str]]:
    """``MACHINES`` machines, ``WINDOWS`` windows each of one accelerometer (``(1, STEPS)``): every condition adds
    its own frequencies to the shaft's rotation; each machine has its own gain, phase and noise."""
    rng = np.random.default_rng(7)
    t = np.arange(STEPS) / STEPS
    xs, ys, machines = [], [], []
    for m in range(MACHINES):
        gain, noise = rng.uniform(0.5, 2.0), rng.uniform(0.3, 0.8)
        labels = rng.integers(0, len(CONDITIONS), WINDOWS)
        for label in labels:
            phase = rng.uniform(0, 2 * np.pi)
            signal = np.sin(2 * np.pi * 2 * t + phase)  # the shaft
            signal += 0.8 * np.sin(2 * np.pi * (5 + 4 * label) * t + 2 * phase)  # the condition's own frequency
            xs.append(gain * signal + noise * rng.normal(size=STEPS))
            ys.append(label)
            machines.append(f"machine{m}")
    return np.asarray(xs, dtype=np.float32)[:, None], np.asarray(ys), machines
