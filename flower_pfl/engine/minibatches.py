"""Fresh minibatches for local training: a seeded shuffle of a client's examples, reshuffled when used up."""

from __future__ import annotations

import torch


class MinibatchStream:
    """Endless stream of fresh minibatch indices: a seeded shuffle, reshuffled when used up.

    Every ``next()`` returns ``batch_size`` indices not used since the last reshuffle
    (the remainder of an epoch that is too short for a full batch is skipped).
    A data set smaller than ``batch_size`` yields all of its indices every time.
    """

    def __init__(self, n: int, batch_size: int, generator: torch.Generator) -> None:
        if n <= 0 or batch_size <= 0:
            raise ValueError("n and batch_size must be positive")
        self.n, self.batch_size, self.generator = n, min(batch_size, n), generator
        self._perm = torch.randperm(n, generator=generator)
        self._pos = 0

    def next(self) -> torch.Tensor:
        if self._pos + self.batch_size > self.n:
            self._perm = torch.randperm(self.n, generator=self.generator)
            self._pos = 0
        idx = self._perm[self._pos : self._pos + self.batch_size]
        self._pos += self.batch_size
        return idx
