"""Memory: what a machine has free, what one client's training takes when a node trains its round's clients
as one computation, and how many of them one computation may hold (``clients_per_computation``).

The estimate of one client's share of a batched round (``training_bytes``) counts, besides its data:

- its model about ``MODEL_COPIES`` times (the model it received, its start, the stacked parameters, their
  gradients, the next step's parameters, the trained model it sends back) and the tensors its client
  algorithm keeps beside the model (``batched_state``, ``carried``: SCAFFOLD's control variates, Ditto's
  personal model) once each;
- the activations of a minibatch: what one sample's forward pass makes (measured once per model and sample
  shape), times the batch size, ``ACTIVATION_COPIES`` times (kept for the backward pass, and their gradients).

It is an estimate for sizing, not a guarantee: ``BUDGET_SHARE`` of the free memory is what a node's
computation may take.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch
from torch import nn

GiB = 2**30
#: what the server makes of its clients' models at a time (an evaluation's instructions, the models a run
#: saves, a checkpoint's store), and a node stacks for an evaluation
CHUNK_BYTES = 256 * 2**20
#: copies of a client's model a batched round holds for it (see the module)
MODEL_COPIES = 6
#: copies of a minibatch's activations (the forward pass's, kept for the backward pass, and their gradients)
ACTIVATION_COPIES = 2
#: the share of a device's free memory one computation of a node's clients may take
BUDGET_SHARE = 0.5


def available_bytes(device: torch.device | str = "cpu") -> int:
    """The memory free for new allocations: on the host, the kernel's ``MemAvailable`` (what can be given
    without swapping; the physical memory where that is not known); on a CUDA device, its free memory."""
    device = torch.device(device)
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        return int(free)
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


def tensor_bytes(tensors: object) -> int:
    """The bytes of a tensor, or of the tensors in a list, tuple or dict (nested), others counting nothing."""
    if isinstance(tensors, torch.Tensor):
        return tensors.numel() * tensors.element_size()
    if isinstance(tensors, dict):
        return sum(tensor_bytes(v) for v in tensors.values())
    if isinstance(tensors, list | tuple):
        return sum(tensor_bytes(v) for v in tensors)
    return 0


def model_bytes(model: nn.Module) -> int:
    """The bytes of a model's ``state_dict`` (parameters and buffers)."""
    return tensor_bytes(list(model.state_dict().values()))


def activation_bytes(model: nn.Module, sample: torch.Tensor) -> int:
    """The bytes every module's output takes in a forward pass of one sample (``sample`` without its batch
    dimension), measured once per architecture and sample shape."""
    return _activations(model, tuple(sample.shape), sample.dtype, sample.device)


def _activations(model: nn.Module, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> int:
    key = (type(model).__qualname__, tuple((k, tuple(v.shape)) for k, v in model.state_dict().items()), shape, dtype, str(device))
    if (known := _MEASURED.get(key)) is not None:
        return known
    total = 0

    def count(_module: nn.Module, _inputs: object, output: object) -> None:
        nonlocal total
        total += tensor_bytes(output)

    hooks = [m.register_forward_hook(count) for m in model.modules() if not list(m.children())]
    training = model.training
    try:
        model.eval()
        with torch.no_grad():
            sample = torch.zeros((1, *shape), dtype=dtype, device=device)
            model(sample)
    finally:
        for hook in hooks:
            hook.remove()
        model.train(training)
    _MEASURED[key] = total
    return total


_MEASURED: dict[tuple, int] = {}  # by architecture (its class and tensor shapes) and sample


def training_bytes(model: nn.Module, sample: torch.Tensor, batch_size: int, kept: int = 0) -> int:
    """One client's share of a batched training round (see the module): ``model``'s copies, ``kept`` bytes its
    client algorithm keeps beside it, and a minibatch of ``batch_size`` samples shaped as ``sample``."""
    return MODEL_COPIES * model_bytes(model) + kept + ACTIVATION_COPIES * batch_size * activation_bytes(model, sample)


def clients_per_computation(per_client: int, budget: int, asked: int = 0) -> int:
    """How many clients one computation holds: ``asked`` where given (> 0), else as many as ``budget`` bytes
    hold at ``per_client`` each (at least one)."""
    if asked > 0:
        return asked
    return max(1, budget // max(per_client, 1))


def budget_bytes(device: torch.device | str = "cpu") -> int:
    """What one computation of a node's clients may take: ``BUDGET_SHARE`` of the device's free memory."""
    return int(BUDGET_SHARE * available_bytes(device))


def shown(nbytes: float) -> str:
    """``1.5 GiB``, ``240 MiB``, ``12 KiB``."""
    for unit, size in (("GiB", GiB), ("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= size:
            return f"{nbytes / size:.3g} {unit}"
    return f"{int(nbytes)} B"


@dataclass(frozen=True)
class Blocks:
    """A tensor of ``shape`` and ``dtype`` too big to hold at once, made block by block (``blocks()``: its rows, in
    order): ``flower_pfl.run.tensor_files.write`` writes it so (every client's model, a store in a checkpoint)."""

    shape: tuple[int, ...]
    blocks: Callable[[], Iterable[torch.Tensor]]
    dtype: torch.dtype = torch.float32


def in_blocks(rows: Callable[[slice], torch.Tensor], count: int, width: int) -> torch.Tensor | Blocks:
    """``count`` float32 rows of ``width`` values (``rows(s)``: those of slice ``s``): one tensor when they take at
    most ``CHUNK_BYTES``, else ``Blocks`` of about that much each."""
    step = max(1, CHUNK_BYTES // (4 * max(width, 1)))
    if count <= step:
        return rows(slice(0, count))
    return Blocks((count, width), lambda: (rows(slice(i, min(i + step, count))) for i in range(0, count, step)))
