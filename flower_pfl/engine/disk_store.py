"""The per-client model store on disk: ``DiskClientModelStore`` keeps the rows of
``flower_pfl.engine.store`` in memory-mapped ``.npy`` files in a folder, with the client ids in a
JSON index beside them, so that the server's memory is bounded by a round's participants rather
than by the federation; the folder can be reopened, and a checkpoint snapshots it (``undo_log``).
``make_store`` gives the store a run asks for: this one in a folder, else the in-memory one."""

from __future__ import annotations

import json
import os
from collections.abc import Hashable, Iterator, Sequence
from numbers import Integral
from pathlib import Path

import numpy as np
import torch

from flower_pfl.engine.store import ClientModelStore, ModelStore, Plan
from flower_pfl.engine.undo_log import UndoLog

#: the disk store maps at most this many bytes at once when copying run by run
_MAP_BYTES = 1 << 26
#: and asks the kernel to read ahead at most this many bytes of the rows ``get`` reads next
_PREFETCH_BYTES = 1 << 30


class DiskClientModelStore(ModelStore):
    """The store in a folder: each block a ``(rows, d)`` float32 ``.npy`` file, memory-mapped
    only while ``get``/``put`` read or write it (so the pages touched do not stay in the
    process's resident set), and ``index.json``: the ids in row order and the blocks' sizes.

    ``DiskClientModelStore(initial, folder)`` creates the store in ``folder``, or reopens the
    one there, whose models must have ``initial``'s dimension; ``initial`` is what unseen
    clients start from (saved as ``initial.npy``: ``open(folder)`` reopens with it). Client
    ids must be ``str`` or ``int`` (kept in JSON). ``get`` returns tensors on ``device``.

    A block's disk space is allocated when the block is added. The index is replaced
    (atomically) whenever clients are added; rows go through the page cache; ``flush`` makes
    everything durable (fsync). One store object at a time per folder.

    ``snapshot`` marks the store's state (a checkpoint) without copying it; ``rollback`` returns
    the store to a snapshot after a crash, bit for bit: the rows overwritten since are kept, as
    they were, in an undo log (``flower_pfl.engine.undo_log``), and ``release`` drops the logs an
    older snapshot needed.
    """

    INDEX = "index.json"
    INITIAL = "initial.npy"
    FORMAT = "flower-pfl client model store"

    def __init__(self, initial: torch.Tensor, folder: str | Path, device: str | torch.device = "cpu") -> None:
        super().__init__(initial, device)
        self._initial = self.initial.cpu().numpy()
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self._written: set[int] = set()  # blocks written since the last flush
        self._offsets: dict[int, int] = {}  # where each block's rows start in its file
        self.undo = UndoLog(self.folder, self.dim)
        #: the last snapshot (0: none yet), the rows that existed then, and those logged since
        self._token, self._kept, self._logged = 0, 0, set[int]()
        if (self.folder / self.INDEX).exists():
            self._load_index(json.loads((self.folder / self.INDEX).read_text()))
        else:
            self._save_index()
        np.save(self.folder / self.INITIAL, self._initial)

    @classmethod
    def open(cls, folder: str | Path, device: str | torch.device = "cpu") -> DiskClientModelStore:
        """Reopen the store in ``folder`` with the initial model saved there."""
        path = Path(folder) / cls.INITIAL
        if not path.exists():
            raise FileNotFoundError(f"{folder} holds no client model store ({cls.INITIAL} missing)")
        return cls(torch.from_numpy(np.load(path)), folder, device)

    def flush(self) -> None:
        """Make the index and every row written so far durable (fsync)."""
        self._save_index()
        for path in [self._path(b) for b in sorted(self._written)] + [self.folder]:
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        self._written.clear()

    # -- snapshots ----------------------------------------------------------------------------

    def snapshot(self) -> int:
        """Make the store durable and mark its state; returns the snapshot's token for ``rollback``.
        Rows overwritten from now on are logged first (once each), so nothing is copied here."""
        self._token += 1
        self._kept, self._logged = len(self), set()
        self.undo.start(self._token)
        self.flush()  # the index now carries the token
        return self._token

    def release(self) -> None:
        """Drop the undo logs of snapshots before the last one (once a checkpoint durably refers to it)."""
        self.undo.release(self._token)

    def rollback(self, token: int, ids: Sequence[Hashable]) -> None:
        """Return the store to snapshot ``token``, whose clients were ``ids`` in the store's order (under
        the ids they have now: a new ``flwr run`` gives nodes new ids, so the rows are re-keyed): the
        logged rows get their old values back, newest logs first, clients added since are dropped, and
        logging starts afresh from that state."""
        if len(ids) > len(self._index) or len(set(ids)) != len(ids):
            raise ValueError(f"the store in {self.folder} holds {len(self._index)} clients, not the snapshot's {len(ids)}")
        for later in sorted((t for t in self.undo.tokens() if t >= token), reverse=True):
            positions, rows = self.undo.read(later)  # each position once: the value it had at snapshot ``later``
            if len(positions):
                self._scatter(torch.from_numpy(rows), self._plan(positions))
            if later > token:
                self.undo.drop(later)
        self._index = {self._new_id(cid): i for i, cid in enumerate(ids)}
        self._token = token
        self._kept, self._logged = len(ids), set()
        self.undo.start(token)
        self.flush()

    def put(self, ids: Sequence[Hashable], rows: torch.Tensor | Sequence[torch.Tensor]) -> None:
        """As ``ModelStore.put``, after logging the old values of rows that existed at the last snapshot."""
        if self._token:
            old = np.array(sorted({self._index[c] for c in ids if c in self._index} - self._logged), dtype=np.int64)
            old = old[old < self._kept]
            if len(old):
                before = torch.empty((len(old), self.dim), dtype=torch.float32)
                self._gather(before, self._plan(old))
                self.undo.append(self._token, old, before.numpy())
                self._logged.update(old.tolist())
        super().put(ids, rows)

    # -- files --------------------------------------------------------------------------------

    def _path(self, block: int) -> Path:
        return self.folder / f"rows_{block:05d}.npy"

    def _offset(self, block: int, row: int = 0) -> int:
        """Where row ``row`` of ``block`` starts in its file."""
        if block not in self._offsets:
            self._offsets[block] = int(np.load(self._path(block), mmap_mode="r").offset)  # the header's length
        return self._offsets[block] + 4 * self.dim * row

    def _rows(self, block: int, lo: int, hi: int, write: bool = False) -> np.memmap:
        """Rows ``[lo, hi)`` of ``block``, mapped until the caller drops them."""
        return np.memmap(self._path(block), dtype=np.float32, mode="r+" if write else "r",
                         offset=self._offset(block, lo), shape=(hi - lo, self.dim))

    def _load_index(self, index: dict) -> None:
        where = self.folder / self.INDEX
        if index.get("format") != self.FORMAT:
            raise ValueError(f"{where} is not a client model store's index")
        if index["dim"] != self.dim:
            raise ValueError(f"the store in {self.folder} holds models of dimension {index['dim']}, "
                             f"not {self.dim} as the initial model given")
        ids, sizes = index["ids"], [int(s) for s in index["blocks"]]
        if len(ids) > sum(sizes) or len(set(ids)) != len(ids):
            raise ValueError(f"{where} is inconsistent: {len(ids)} ids for {sum(sizes)} rows")
        for b, size in enumerate(sizes):
            path = self._path(b)
            if not path.exists():
                raise ValueError(f"the store in {self.folder} lacks {path.name}")
            rows = np.load(path, mmap_mode="r")
            if rows.shape != (size, self.dim) or rows.dtype != np.float32:
                raise ValueError(f"{path} holds {rows.dtype} rows of shape {rows.shape}, "
                                 f"not float32 rows of shape {(size, self.dim)}")
            del rows
        self._sizes = sizes
        self._starts = np.cumsum([0] + sizes[:-1]).astype(np.int64)
        self._capacity = sum(sizes)
        self._index = {cid: i for i, cid in enumerate(ids)}
        self._token = int(index.get("snapshot", 0))

    def _save_index(self) -> None:
        index = {"format": self.FORMAT, "version": 1, "dim": self.dim, "dtype": "float32",
                 "blocks": self._sizes, "ids": list(self._index), "snapshot": self._token}
        tmp = self.folder / (self.INDEX + ".tmp")
        tmp.write_text(json.dumps(index))
        os.replace(tmp, self.folder / self.INDEX)

    def _new_id(self, client_id: Hashable) -> Hashable:
        if isinstance(client_id, bool) or not isinstance(client_id, (str, Integral)):
            raise TypeError(f"the disk store keeps str or int client ids, not {type(client_id).__name__}")
        return client_id if isinstance(client_id, str) else int(client_id)

    def _clients_added(self) -> None:
        self._save_index()  # after the new rows are written

    # -- blocks -------------------------------------------------------------------------------

    def _work_device(self) -> torch.device:
        return torch.device("cpu")

    def _add_block(self, rows: int) -> None:
        b = len(self._sizes)
        mm = np.lib.format.open_memmap(self._path(b), mode="w+", dtype=np.float32, shape=(rows, self.dim))
        del mm
        if hasattr(os, "posix_fallocate"):  # the disk space now (OSError if there is none), not a
            fd = os.open(self._path(b), os.O_RDWR)  # SIGBUS when a mapped page is first written
            try:
                os.posix_fallocate(fd, 0, self._offset(b, rows))
            finally:
                os.close(fd)
        self._written.add(b)

    def _fill(self, block: int, lo: int, hi: int) -> None:
        for first in range(lo, hi, self._rows_per_map):
            rows = self._rows(block, first, min(hi, first + self._rows_per_map), write=True)
            rows[:] = self._initial
            del rows
        self._written.add(block)

    @property
    def _rows_per_map(self) -> int:
        return max(1, _MAP_BYTES // (4 * self.dim))

    def _pieces(self, plan: Plan) -> Iterator[tuple[int, int, int, int | None, np.ndarray | None, np.ndarray | None]]:
        """The mappings ``get``/``put`` go through, ``(block, lo, hi, position, positions, rows)``:
        rows ``[lo, hi)`` of ``block`` map to positions ``position ...`` (run by run, at most
        ``_MAP_BYTES`` or one row a mapping), or each of ``rows`` (relative to ``lo``) to the
        position beside it in ``positions``."""
        for b, pos, off, runs in plan:
            if runs is None:
                lo = int(off.min())
                yield b, lo, int(off.max()) + 1, None, pos, off - lo
                continue
            for p, o, n in runs:
                for k in range(0, n, self._rows_per_map):
                    yield b, o + k, o + min(n, k + self._rows_per_map), p + k, None, None

    def _prefetch(self, piece: tuple) -> int:
        """Ask the kernel to read a piece's rows now (the disk then reads several at once); its bytes."""
        b, lo, hi, p, _, off = piece
        spans = [(lo, hi - lo)] if p is not None else [(lo + int(o), 1) for o in off]
        fd = os.open(self._path(b), os.O_RDONLY)
        try:
            for o, n in spans:
                os.posix_fadvise(fd, self._offset(b, o), 4 * self.dim * n, os.POSIX_FADV_WILLNEED)
        finally:
            os.close(fd)
        return 4 * self.dim * sum(n for _, n in spans)

    def _gather(self, out: torch.Tensor, plan: Plan) -> None:
        dest, pieces = out.numpy(), list(self._pieces(plan))
        can_prefetch = hasattr(os, "posix_fadvise")
        ahead, pending = 0, list[int]()  # pieces asked for, bytes of those not read yet
        for i, piece in enumerate(pieces):
            while can_prefetch and ahead < len(pieces) and (ahead <= i or sum(pending) < _PREFETCH_BYTES):
                pending.append(self._prefetch(pieces[ahead]))
                ahead += 1
            b, lo, hi, p, pos, off = piece
            rows = self._rows(b, lo, hi)
            if p is not None:
                dest[p:p + hi - lo] = rows
            else:
                dest[pos] = rows[off]
            del rows  # unmapped: the pages read leave the resident set
            pending = pending[1:]

    def _scatter(self, source: torch.Tensor | list[torch.Tensor], plan: Plan) -> None:
        src = (torch.stack(source) if isinstance(source, list) else source).contiguous().numpy()
        for b, lo, hi, p, pos, off in self._pieces(plan):
            rows = self._rows(b, lo, hi, write=True)
            if p is not None:
                rows[:] = src[p:p + hi - lo]
            else:
                rows[off] = src[pos]
            del rows
            self._written.add(b)


def make_store(initial: torch.Tensor, device: str | torch.device = "cpu",
               folder: str | Path | None = None) -> ModelStore:
    """The in-memory store if ``folder`` is ``None``, else the disk store in ``folder``."""
    if folder is None:
        return ClientModelStore(initial, device=device)
    return DiskClientModelStore(initial, folder, device=device)
