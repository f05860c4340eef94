"""Per-client model store: one flat float32 row per client, keyed by client id."""

from __future__ import annotations

from typing import Hashable, Iterable, Sequence

import torch


class ClientModelStore:
    """Personalized models of all clients as rows of one ``(capacity, d)`` matrix.

    A client seen for the first time starts from ``initial``. No per-client
    ``nn.Module`` is ever built: methods read and write whole row blocks, which is
    what the vectorized aggregation functions work on.
    """

    def __init__(self, initial: torch.Tensor, device: str | torch.device = "cpu") -> None:
        if initial.ndim != 1:
            raise ValueError("initial must be a flat vector")
        self.initial = initial.detach().to(device=device, dtype=torch.float32).clone()
        self._rows = torch.empty((0, self.dim), dtype=torch.float32, device=device)
        self._index: dict[Hashable, int] = {}

    @property
    def dim(self) -> int:
        return int(self.initial.numel())

    @property
    def device(self) -> torch.device:
        return self.initial.device

    def __len__(self) -> int:
        return len(self._index)

    def __contains__(self, client_id: Hashable) -> bool:
        return client_id in self._index

    def ids(self) -> list[Hashable]:
        """Ids of the clients that have a row, in the order they were added."""
        return list(self._index)

    def _ensure(self, ids: Iterable[Hashable]) -> list[int]:
        new = [cid for cid in dict.fromkeys(ids) if cid not in self._index]
        if new:
            need = len(self._index) + len(new)
            if need > self._rows.shape[0]:
                grown = torch.empty((max(need, 2 * self._rows.shape[0]), self.dim),
                                    dtype=torch.float32, device=self.device)
                grown[: len(self._index)] = self._rows[: len(self._index)]
                self._rows = grown
            for cid in new:
                self._rows[len(self._index)] = self.initial
                self._index[cid] = len(self._index)
        return [self._index[cid] for cid in ids]

    def get(self, ids: Sequence[Hashable]) -> torch.Tensor:
        """The ``(m, d)`` models of ``ids`` (a copy); unseen clients get the initial model."""
        rows = self._ensure(ids)  # may grow self._rows: index only afterwards
        return self._rows[rows].clone()

    def put(self, ids: Sequence[Hashable], rows: torch.Tensor) -> None:
        """Overwrite the models of ``ids`` with ``rows`` of shape ``(len(ids), d)``."""
        if rows.shape != (len(ids), self.dim):
            raise ValueError(f"expected rows of shape {(len(ids), self.dim)}, got {tuple(rows.shape)}")
        if len(set(ids)) != len(ids):
            raise ValueError("ids must be unique")
        index = self._ensure(ids)
        self._rows[index] = rows.to(device=self.device, dtype=torch.float32)

    def state_dict(self) -> dict[str, object]:
        """Everything needed to restore the store (for checkpoints)."""
        n = len(self._index)
        return {"initial": self.initial.cpu(), "ids": self.ids(), "rows": self._rows[:n].cpu()}

    @classmethod
    def from_state_dict(cls, state: dict[str, object]) -> ClientModelStore:
        store = cls(state["initial"])  # type: ignore[arg-type]
        ids = list(state["ids"])  # type: ignore[arg-type]
        if ids:
            store.put(ids, state["rows"])  # type: ignore[arg-type]
        return store
