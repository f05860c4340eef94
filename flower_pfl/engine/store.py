"""Per-client model store: one flat float32 row per client, keyed by client id.

``ModelStore`` is the API (``get``, ``put``, ``ids``, ``len``, ``in``, ``dim``, ``device``,
``capacity``, ``state_dict``) and ``ClientModelStore`` keeps the rows in memory, on CPU or CUDA;
``flower_pfl.engine.disk_store`` keeps them in memory-mapped files. Both keep the rows in *blocks* appended as clients arrive: a new
block holds the rows asked for, or 5% of the rows held so far if that is more, so a store
never holds more than 1.05 times the rows it needs (``capacity <= 1.05 * len``), never copies
the rows it holds to grow, and keeps its rows in the order clients were added. ``get`` gathers
and ``put`` scatters across the blocks touched: a slice copy per run of consecutive rows when
the runs are long (large models: every row copied once, no temporary), else one indexed copy
per block.

On a CUDA device, ``ClientModelStore`` keeps a block on the device while it fits (``fits_on_device``:
it leaves at least half the device's free memory to the aggregation), and in pinned host memory
beyond; rows move between the two through pinned buffers (``pinned``), one copy per block touched.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Iterator, Sequence

import numpy as np
import torch

#: a new block holds at least this fraction of the rows already held
GROWTH = 0.05
#: copy run by run when the runs average at least this many bytes, else by indexed copies
_RUN_BYTES = {"cpu": 1 << 18, "cuda": 1 << 24}

#: what ``get``/``put`` do block by block: ``(block, positions, rows in the block, runs)``,
#: ``runs`` a list of ``(position, row in the block, length)`` when copied run by run, else ``None``
Plan = list[tuple[int, np.ndarray, np.ndarray, "list[tuple[int, int, int]] | None"]]


def pinned(shape: tuple[int, ...], dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """An empty host tensor in page-locked memory (what a CUDA copy reads and writes at full speed, and
    can overlap), or in ordinary memory where no CUDA device is visible."""
    return torch.empty(shape, dtype=dtype, pin_memory=torch.cuda.is_available())


def fits_on_device(device: torch.device, nbytes: int) -> bool:
    """Whether ``nbytes`` more on ``device`` leave it at least half of its free memory (the rest is for
    the round's work: a personalized method's ``(m, d)`` matrices and their products)."""
    if device.type != "cuda":
        return True
    free, _total = torch.cuda.mem_get_info(device)
    return nbytes <= free // 2


def to_device(rows: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``rows`` on ``device``: from the host through a pinned buffer (one asynchronous copy)."""
    if rows.device == device:
        return rows
    if device.type == "cuda" and rows.device.type == "cpu" and not rows.is_pinned():
        rows = pinned(tuple(rows.shape), rows.dtype).copy_(rows)
    return rows.to(device, non_blocking=True)


def to_host(rows: torch.Tensor) -> torch.Tensor:
    """``rows`` on the host, from a device in one copy into pinned memory."""
    if rows.device.type == "cpu":
        return rows
    return pinned(tuple(rows.shape), rows.dtype).copy_(rows)


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
        work = self._work_device()
        shape = (len(rows), self.dim)
        # rows gathered on the host for a device: into pinned memory, then one asynchronous copy
        out = pinned(shape) if work.type == "cpu" and self.device.type == "cuda" else torch.empty(shape, device=work)
        self._gather(out, self._plan(rows))
        if added:
            self._clients_added()
        return out.to(self.device, non_blocking=True)

    def put(self, ids: Sequence[Hashable], rows: torch.Tensor | Sequence[torch.Tensor]) -> None:
        """Overwrite the models of ``ids`` with ``rows``: a ``(len(ids), d)`` matrix, or ``len(ids)``
        flat rows, which the in-memory CPU store copies into place one by one (no stacked copy)."""
        source: torch.Tensor | list[torch.Tensor]
        if isinstance(rows, torch.Tensor):
            if rows.shape != (len(ids), self.dim):
                raise ValueError(f"expected rows of shape {(len(ids), self.dim)}, got {tuple(rows.shape)}")
            source = to_device(rows.detach().to(torch.float32), self._work_device())
        else:
            source = [r.detach().to(dtype=torch.float32) for r in rows]
            if len(source) != len(ids) or any(r.shape != (self.dim,) for r in source):
                raise ValueError(f"expected {len(ids)} rows of shape {(self.dim,)}, got {[tuple(r.shape) for r in source]}")
            work = self._work_device()
            if work.type != "cpu" and source:  # rows from the replies (on the host): stacked, then one copy
                source = to_device(torch.stack([r.to(source[0].device) for r in source]), work)
            else:
                source = [r.to(work) for r in source]
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
        if fits_on_device(self.device, 4 * rows * self.dim):
            self._blocks.append(torch.empty((rows, self.dim), dtype=torch.float32, device=self.device))
        else:  # beyond what the device holds: pinned host rows
            self._blocks.append(pinned((rows, self.dim)))

    @property
    def rows_on_device(self) -> int:
        """Rows allocated on the store's device (the others are in pinned host memory)."""
        return sum(len(b) for b in self._blocks if b.device == self.device)

    def _fill(self, block: int, lo: int, hi: int) -> None:
        blk = self._blocks[block]
        blk[lo:hi] = self.initial.to(blk.device)

    def _indices(self, a: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(a, dtype=np.int64)).to(self.device)

    def _gather(self, out: torch.Tensor, plan: Plan) -> None:
        if out.device.type == "cpu":
            _gather_numpy(out.numpy(), plan, lambda b: self._blocks[b].numpy())
            return
        for b, pos, off, runs in plan:
            blk = self._blocks[b]
            if blk.device != out.device:  # a host block: its rows gathered into pinned memory, then one copy
                staged = torch.index_select(blk, 0, torch.from_numpy(np.ascontiguousarray(off, dtype=np.int64)),
                                            out=pinned((len(off), self.dim)))
                out.index_copy_(0, self._indices(pos), staged.to(out.device, non_blocking=True))
            elif runs is not None:
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
            if blk.device != source.device:  # a host block: the rows copied out once, through pinned memory
                blk.index_copy_(0, torch.from_numpy(np.ascontiguousarray(off, dtype=np.int64)),
                                to_host(source.index_select(0, self._indices(pos))))
            elif runs is not None:
                for p, o, n in runs:
                    blk[o:o + n].copy_(source[p:p + n])
            elif len(pos) == len(source):  # pos is 0..m-1
                blk.index_copy_(0, self._indices(off), source)
            else:
                blk.index_copy_(0, self._indices(off), source.index_select(0, self._indices(pos)))
