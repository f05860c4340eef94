"""The arithmetic a client computes in (run config ``precision``): ``float32`` (the default: exact, the
numbers every test and recording holds), or on CUDA ``tf32`` (matrix products and convolutions on TF32
tensor cores: a 10-bit mantissa inside the products) or ``bfloat16`` (``torch.autocast`` to bfloat16 as
well, the parameters and their SGD steps kept in float32). Both change the numbers a run gives."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

PRECISIONS: tuple[str, ...] = ("float32", "tf32", "bfloat16")


def precision_problem(precision: str, device: torch.device) -> str | None:
    """Why ``precision`` cannot run on ``device`` (``None``: it can)."""
    if precision not in PRECISIONS:
        return f"run config 'precision' = {precision!r} is invalid: must be one of {', '.join(PRECISIONS)}"
    if precision != "float32" and device.type != "cuda":
        return (f"run config 'precision' = {precision!r} runs on CUDA only, and this node computes on {device.type}: "
                "set precision = 'float32' (or device = 'cuda' on a node with a GPU)")
    return None


@contextmanager
def computing_in(precision: str, device: torch.device) -> Iterator[None]:
    """Inside, a client's computations on ``device`` run in ``precision``; ``ValueError`` where it cannot."""
    if precision == "float32":
        yield
        return
    if (problem := precision_problem(precision, device)) is not None:
        raise ValueError(problem)
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    try:
        if precision == "bfloat16":
            with torch.autocast(device.type, dtype=torch.bfloat16):
                yield
        else:
            yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved
