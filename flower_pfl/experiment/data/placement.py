"""A client's data where the compute is: copied to the model's device once per run and kept there while
every client's data held on that device fits in ``DEVICE_DATA_SHARE`` of its memory; a client beyond that
has its data copied for each message (a round's training or evaluation), and freed after it."""

from __future__ import annotations

import weakref

import torch

from flower_pfl.experiment.data.client_data import ClientData

#: the share of a GPU's memory that the clients' data may hold for a run (the rest is the models' and the
#: computations'); clients beyond it have their data copied for each message
DEVICE_DATA_SHARE = 0.25

_kept: weakref.WeakKeyDictionary[ClientData, dict[str, ClientData]] = weakref.WeakKeyDictionary()
_held: dict[str, int] = {}


def data_budget(device: torch.device) -> float:
    """The bytes of clients' data a device keeps: ``DEVICE_DATA_SHARE`` of a GPU's memory; no limit elsewhere."""
    if device.type == "cuda":
        return DEVICE_DATA_SHARE * torch.cuda.get_device_properties(device).total_memory
    return float("inf")


def on_device(data: ClientData, device: torch.device, budget: float | None = None) -> ClientData:
    """``data`` on ``device``: the copy kept for the run when the device's kept data stay within ``budget``
    bytes (default ``data_budget``), else a copy for this message alone. On the CPU, ``data`` itself."""
    if data.y_train.device == device:
        return data
    key = str(device)
    if (copy := _kept.get(data, {}).get(key)) is not None:
        return copy
    moved = data.to(device)
    size = sum(t.numel() * t.element_size() for t in data.tensors())
    if _held.get(key, 0) + size <= (data_budget(device) if budget is None else budget):
        _held[key] = _held.get(key, 0) + size
        _kept.setdefault(data, {})[key] = moved
        weakref.finalize(moved, _release, key, size)
    return moved


def _release(key: str, size: int) -> None:
    _held[key] = _held.get(key, 0) - size
