"""Per-client model store: one flat float32 row per client, keyed by client id.

Two stores with one API (``get``, ``put``, ``ids``, ``len``, ``in``, ``dim``, ``device``,
``capacity``, ``state_dict``):

- ``ClientModelStore`` keeps the rows in memory, on CPU or CUDA;
- ``DiskClientModelStore`` keeps them in memory-mapped ``.npy`` files in a folder, with the
  client ids in a JSON index beside them, so that the server's memory is bounded by a round's
  participants rather than by the federation; the folder can be reopened.

``make_store`` picks one. Both keep the rows in *blocks* appended as clients arrive: a new
block holds the rows asked for, or 5% of the rows held so far if that is more, so a store
never holds more than 1.05 times the rows it needs (``capacity <= 1.05 * len``), never copies
the rows it holds to grow, and keeps its rows in the order clients were added. ``get`` gathers
and ``put`` scatters across the blocks touched: a slice copy per run of consecutive rows when
the runs are long (large models: every row copied once, no temporary), else one indexed copy
per block.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Hashable, Iterable, Iterator, Sequence
from numbers import Integral
from pathlib import Path

import numpy as np
import torch

from flower_pfl.engine.undo_log import UndoLog

#: a new block holds at least this fraction of the rows already held
GROWTH = 0.05
#: copy run by run when the runs average at least this many bytes, else by indexed copies
_RUN_BYTES = {"cpu": 1 << 18, "cuda": 1 << 24}
#: the disk store maps at most this many bytes at once when copying run by run
_MAP_BYTES = 1 << 26
#: and asks the kernel to read ahead at most this many bytes of the rows ``get`` reads next
_PREFETCH_BYTES = 1 << 30

#: what ``get``/``put`` do block by block: ``(block, positions, rows in the block, runs)``,
#: ``runs`` a list of ``(position, row in the block, length)`` when copied run by run, else ``None``
Plan = list[tuple[int, np.ndarray, np.ndarray, "list[tuple[int, int, int]] | None"]]


def _next_capacity(capacity: int, need: int) -> int:
    """Rows held after growing from ``capacity`` to hold ``need > capacity`` rows: at most
    ``1.05 * need``."""
    return max(need, capacity + int(capacity * GROWTH))


def _gather_numpy(dest: np.ndarray, plan: Plan, block: Callable[[int], np.ndarray]) -> None:
    """``dest[positions] = block(b)[rows]`` along ``plan`` with numpy's copies, in one thread:
    many copies then do not each wait for a thread pool (as torch's do when the CPU is busy)."""
    for b, pos, off, runs in plan:
        rows = block(b)
        if runs is not None:
            for p, o, n in runs:
                dest[p:p + n] = rows[o:o + n]
        else:
            dest[pos] = rows[off]


def _scatter_numpy(source: np.ndarray | list[np.ndarray], plan: Plan, block: Callable[[int], np.ndarray]) -> None:
    """``block(b)[rows] = source[positions]`` along ``plan``; ``source`` a matrix or a list of its rows
    (copied one at a time)."""
    for b, pos, off, runs in plan:
        rows = block(b)
        if isinstance(source, list):
            for p, o in zip(pos.tolist(), off.tolist()):
                rows[o] = source[p]
        elif runs is not None:
            for p, o, n in runs:
                rows[o:o + n] = source[p:p + n]
        else:
            rows[off] = source[pos]


class ModelStore:
    """What both stores share: the id index, the blocks' geometry and how ``get``/``put``
    split their rows across blocks. Subclasses hold the blocks (``_add_block``, ``_fill``,
    ``_gather``, ``_scatter``)."""

    def __init__(self, initial: torch.Tensor, device: str | torch.device = "cpu") -> None:
        if initial.ndim != 1:
            raise ValueError("initial must be a flat vector")
        self.initial = initial.detach().to(device=device, dtype=torch.float32).clone()
        self._index: dict[Hashable, int] = {}
        self._sizes: list[int] = []  # rows of each block
        self._starts = np.zeros(0, dtype=np.int64)  # first (global) row of each block
        self._capacity = 0
        #: the starting rows of new clients, ``(ids) -> (len(ids), d)``; ``None``: every client starts from ``initial``
        self.initial_rows: Callable[[list[Hashable]], torch.Tensor] | None = None

    @property
    def dim(self) -> int:
        return int(self.initial.numel())

    @property
    def device(self) -> torch.device:
        return self.initial.device

    @property
    def capacity(self) -> int:
        """Rows allocated, used or not: at most ``1.05 * len(self)``."""
        return self._capacity

    @property
    def num_blocks(self) -> int:
        return len(self._sizes)

    def __len__(self) -> int:
        return len(self._index)

    def __contains__(self, client_id: Hashable) -> bool:
        return client_id in self._index

    def ids(self) -> list[Hashable]:
        """Ids of the clients that have a row, in the order they were added."""
        return list(self._index)

    def get(self, ids: Sequence[Hashable]) -> torch.Tensor:
        """The ``(m, d)`` models of ``ids`` (a copy); unseen clients get their starting model
        (``initial_rows``, else ``initial``)."""
        rows, added = self._ensure(ids, fill=True)
        out = torch.empty((len(rows), self.dim), dtype=torch.float32, device=self._work_device())
        self._gather(out, self._plan(rows))
        if added:
            self._clients_added()
        return out.to(self.device)

    def put(self, ids: Sequence[Hashable], rows: torch.Tensor | Sequence[torch.Tensor]) -> None:
        """Overwrite the models of ``ids`` with ``rows``: a ``(len(ids), d)`` matrix, or ``len(ids)``
        flat rows, which the in-memory CPU store copies into place one by one (no stacked copy)."""
        source: torch.Tensor | list[torch.Tensor]
        if isinstance(rows, torch.Tensor):
            if rows.shape != (len(ids), self.dim):
                raise ValueError(f"expected rows of shape {(len(ids), self.dim)}, got {tuple(rows.shape)}")
            source = rows.detach().to(device=self._work_device(), dtype=torch.float32)
        else:
            source = [r.detach().to(device=self._work_device(), dtype=torch.float32) for r in rows]
            if len(source) != len(ids) or any(r.shape != (self.dim,) for r in source):
                raise ValueError(f"expected {len(ids)} rows of shape {(self.dim,)}, got {[tuple(r.shape) for r in source]}")
        if len(set(ids)) != len(ids):
            raise ValueError("ids must be unique")
        index, added = self._ensure(ids, fill=False)  # new clients' rows are written right below
        self._scatter(source, self._plan(index))
        if added:
            self._clients_added()

    # -- the blocks' geometry -----------------------------------------------------------------

    def _new_id(self, client_id: Hashable) -> Hashable:
        """The id a new client is indexed under (the disk store checks it can be saved)."""
        return client_id

    def _ensure(self, ids: Iterable[Hashable], fill: bool) -> tuple[np.ndarray, bool]:
        """The rows of ``ids``, adding rows (set to their starting models if ``fill``) for unseen
        clients, and whether any were added."""
        ids = list(ids)
        new = [self._new_id(cid) for cid in dict.fromkeys(ids) if cid not in self._index]
        if new:
            starting = self._starting_rows(new) if fill and self.initial_rows is not None else None  # may fail: nothing changed yet
            first, need = len(self._index), len(self._index) + len(new)
            if need > self._capacity:
                size = _next_capacity(self._capacity, need) - self._capacity
                self._add_block(size)  # may fail (memory, disk): nothing changed yet
                self._starts = np.append(self._starts, self._capacity)
                self._sizes.append(size)
                self._capacity += size
            if starting is not None:
                self._scatter(starting, self._plan(np.arange(first, need)))
            elif fill:
                for b, lo, hi in self._ranges(first, need):
                    self._fill(b, lo, hi)
            for i, cid in enumerate(new):
                self._index[cid] = first + i
        rows = np.fromiter((self._index[cid] for cid in ids), dtype=np.int64, count=len(ids))
        return rows, bool(new)

    def _starting_rows(self, ids: list[Hashable]) -> torch.Tensor:
        rows = self.initial_rows(ids)  # type: ignore[misc]
        if tuple(rows.shape) != (len(ids), self.dim):
            raise ValueError(f"initial_rows gave rows of shape {tuple(rows.shape)}, not {(len(ids), self.dim)}")
        return rows.detach().to(device=self._work_device(), dtype=torch.float32)

    def _ranges(self, first: int, stop: int) -> Iterator[tuple[int, int, int]]:
        """``(block, lo, hi)``: the rows ``[lo, hi)`` of the blocks that hold rows ``[first, stop)``."""
        b = int(np.searchsorted(self._starts, first, side="right")) - 1
        while first < stop:
            start = int(self._starts[b])
            hi = min(stop, start + self._sizes[b])
            yield b, first - start, hi - start
            first, b = hi, b + 1

    def _plan(self, rows: np.ndarray) -> Plan:
        """How to move the rows ``rows`` (one per position of the ``(m, d)`` matrix), block by block."""
        if len(rows) == 0:
            return []
        block = np.searchsorted(self._starts, rows, side="right") - 1
        local = rows - self._starts[block]
        order = np.argsort(block, kind="stable")
        cuts = np.flatnonzero(np.diff(block[order])) + 1
        run_bytes = _RUN_BYTES["cuda" if self._work_device().type == "cuda" else "cpu"]
        plan: Plan = []
        for pos in np.split(order, cuts):  # positions in increasing order
            off = local[pos]
            breaks = np.flatnonzero((np.diff(pos) != 1) | (np.diff(off) != 1)) + 1
            runs = None
            if 4 * self.dim * len(pos) >= run_bytes * (len(breaks) + 1):
                starts = np.concatenate(([0], breaks))
                lengths = np.diff(np.concatenate((starts, [len(pos)])))
                runs = [(int(pos[s]), int(off[s]), int(n)) for s, n in zip(starts, lengths)]
            plan.append((int(block[pos[0]]), pos, off, runs))
        return plan

    # -- what the stores define ---------------------------------------------------------------

    def _work_device(self) -> torch.device:
        """Where ``get`` assembles its rows and ``put`` reads them from."""
        return self.device

    def _clients_added(self) -> None:
        """Called at the end of a ``get``/``put`` that added clients."""

    def _add_block(self, rows: int) -> None:
        raise NotImplementedError

    def _fill(self, block: int, lo: int, hi: int) -> None:
        """Set the rows ``[lo, hi)`` of ``block`` to ``initial``."""
        raise NotImplementedError

    def _gather(self, out: torch.Tensor, plan: Plan) -> None:
        raise NotImplementedError

    def _scatter(self, source: torch.Tensor | list[torch.Tensor], plan: Plan) -> None:
        """Write ``source`` (a matrix or a list of its rows) along ``plan``."""
        raise NotImplementedError



class ClientModelStore(ModelStore):
    """Personalized models of all clients as the rows of ``(rows, d)`` blocks on ``device``,
    in the order clients were added.

    A client seen for the first time starts from ``initial``. No per-client
    ``nn.Module`` is ever built: methods read and write whole row blocks, which is
    what the vectorized aggregation functions work on.
    """

    def __init__(self, initial: torch.Tensor, device: str | torch.device = "cpu") -> None:
        super().__init__(initial, device)
        self._blocks: list[torch.Tensor] = []

    def _add_block(self, rows: int) -> None:
        self._blocks.append(torch.empty((rows, self.dim), dtype=torch.float32, device=self.device))

    def _fill(self, block: int, lo: int, hi: int) -> None:
        self._blocks[block][lo:hi] = self.initial

    def _indices(self, a: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(a, dtype=np.int64)).to(self.device)

    def _gather(self, out: torch.Tensor, plan: Plan) -> None:
        if out.device.type == "cpu":
            _gather_numpy(out.numpy(), plan, lambda b: self._blocks[b].numpy())
            return
        for b, pos, off, runs in plan:
            blk = self._blocks[b]
            if runs is not None:
                for p, o, n in runs:
                    out[p:p + n].copy_(blk[o:o + n])
            elif len(pos) == len(out):  # one block holds them all (pos is 0..m-1)
                torch.index_select(blk, 0, self._indices(off), out=out)
            else:
                out.index_copy_(0, self._indices(pos), blk.index_select(0, self._indices(off)))

    def _scatter(self, source: torch.Tensor | list[torch.Tensor], plan: Plan) -> None:
        if self.device.type == "cpu":
            src = [r.numpy() for r in source] if isinstance(source, list) else source.contiguous().numpy()
            _scatter_numpy(src, plan, lambda b: self._blocks[b].numpy())
            return
        if isinstance(source, list):
            source = torch.stack(source)
        for b, pos, off, runs in plan:
            blk = self._blocks[b]
            if runs is not None:
                for p, o, n in runs:
                    blk[o:o + n].copy_(source[p:p + n])
            elif len(pos) == len(source):  # pos is 0..m-1
                blk.index_copy_(0, self._indices(off), source)
            else:
                blk.index_copy_(0, self._indices(off), source.index_select(0, self._indices(pos)))



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
