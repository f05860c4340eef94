"""A method's diagnostics: which clients attend to which (each round's ``(m, m)`` attention weights
per model component, and their running mean per client pair, checkpointed with the method's state:
``AttentionAccumulator``, the ``attention_weights`` of methods that attend, ``RecordsAttention``),
and the last round's similarities of methods that select clients by them (``ReportsSimilarity``).
``flower_pfl.reports.diagnostics`` draws both."""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch


class AttentionAccumulator:
    """Running mean, per client pair, of each round's ``(m, m)`` attention weights.

    Weights come per component (``{"fc.weight": (m, m), ...}``); a client-level
    method passes a single entry. Pairs that never met in a round stay NaN.
    """

    def __init__(self) -> None:
        self._index: dict[Hashable, int] = {}
        self._sums: dict[str, torch.Tensor] = {}
        self._count = torch.zeros((0, 0), dtype=torch.float64)
        #: every round's participants and weights, in order (``save_rounds`` writes them)
        self.rounds: list[tuple[list[Hashable], dict[str, np.ndarray]]] = []

    def __len__(self) -> int:
        return len(self._index)

    @property
    def clients(self) -> list[Hashable]:
        """The clients seen so far, in order of first participation."""
        return list(self._index)

    def add(self, ids: Sequence[Hashable], weights: Mapping[str, torch.Tensor]) -> None:
        self.rounds.append((list(ids), {k: w.detach().cpu().numpy().astype(np.float32) for k, w in weights.items()}))
        for cid in ids:
            self._index.setdefault(cid, len(self._index))
        n = len(self._index)

        def grow(t: torch.Tensor) -> torch.Tensor:
            return torch.nn.functional.pad(t, (0, n - t.shape[1], 0, n - t.shape[0]))

        self._count = grow(self._count)
        idx = torch.tensor([self._index[c] for c in ids], dtype=torch.long)  # long even when ``ids`` is empty
        rows, cols = idx[:, None], idx[None, :]
        self._count[rows, cols] += 1
        for name, w in weights.items():
            total = grow(self._sums.get(name, torch.zeros((0, 0), dtype=torch.float64)))
            total[rows, cols] += w.detach().cpu().to(torch.float64)
            self._sums[name] = total

    def get_state(self) -> dict[str, Any]:
        """Everything needed to continue accumulating (for checkpoints)."""
        return {"index": list(self._index), "sums": dict(self._sums), "count": self._count,
                "rounds": [[ids, weights] for ids, weights in self.rounds]}

    def set_state(self, state: dict[str, Any]) -> None:
        self._index = {cid: i for i, cid in enumerate(state["index"])}
        self._sums, self._count = dict(state["sums"]), state["count"]
        self.rounds = [(list(ids), dict(weights)) for ids, weights in state["rounds"]]

    def mean(self, rank: Mapping[Hashable, int] | None = None) -> tuple[list[Hashable], dict[str, np.ndarray]]:
        """Client ids (row/column order) and each component's mean weights.

        With ``rank`` (e.g. client id -> partition id) rows and columns follow it;
        otherwise the order in which clients were first seen.
        """
        ids = list(self._index)
        if rank:
            ids.sort(key=lambda cid: (rank.get(cid, np.inf), str(cid)))
        idx = torch.tensor([self._index[c] for c in ids], dtype=torch.long)
        count = self._count[idx][:, idx]
        with np.errstate(invalid="ignore", divide="ignore"):
            return ids, {name: (s[idx][:, idx] / count).numpy() for name, s in self._sums.items()}

    def save_rounds(self, path: Path) -> None:
        """``<path>.npz``: ``ids`` ``(R, m)`` (the participants of each round, rows and columns of its
        matrix; ``""`` pads rounds with fewer), ``num_participants`` ``(R,)`` and per component
        ``(R, m, m)`` weights (NaN-padded)."""
        m = max((len(ids) for ids, _ in self.rounds), default=0)
        ids = np.full((len(self.rounds), m), "", dtype=object)
        out: dict[str, np.ndarray] = {}
        for r, (round_ids, weights) in enumerate(self.rounds):
            ids[r, : len(round_ids)] = [str(c) for c in round_ids]
            for name, w in weights.items():
                out.setdefault(name, np.full((len(self.rounds), m, m), np.nan, dtype=np.float32))[r, : w.shape[0], : w.shape[1]] = w
        np.savez(path.with_suffix(".npz"), ids=ids.astype(str), num_participants=np.array([len(i) for i, _ in self.rounds]),
                 **out)  # type: ignore[arg-type]  # numpy's stub types **kwds as its keyword flags


@runtime_checkable
class RecordsAttention(Protocol):
    """A method that keeps its clients' attention weights (``PersonalizedAlgorithm``, IGFL)."""

    attention_weights: AttentionAccumulator


@dataclass(frozen=True)
class SimilaritySnapshot:
    """A round's client-by-client similarities and which pairs the method let through (``mask``),
    with the threshold it used. Rows follow the round's participants."""

    similarity: torch.Tensor
    mask: torch.Tensor
    threshold: float


@runtime_checkable
class ReportsSimilarity(Protocol):
    """A method that selects clients by their similarities (FedACS): the ServerApp draws its last round's."""

    def similarity_snapshot(self) -> SimilaritySnapshot | None:
        """The last round's similarities between its participants; ``None`` before any round."""
