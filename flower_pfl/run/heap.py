"""The Python heap of a run's process: what the cyclic garbage collector needs to look at."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def frozen_heap() -> Iterator[None]:
    """The objects alive at the start of the block (the modules of torch and Flower, the data, the models:
    some 300,000 of them) left out of the garbage collector's full collections inside it, and handed back
    after. Each full collection would otherwise walk them all, some 150 ms on a CPU core, a few times in a
    run's first hundred rounds. What they stop holding is still freed at once (reference counting); only
    cycles among them that become garbage wait for the end of the block."""
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
