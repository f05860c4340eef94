import itertools

import numpy as np
import pytest
import torch

from flower_pfl.engine import store as store_module
from flower_pfl.engine.disk_store import DiskClientModelStore, make_store
from flower_pfl.engine.layout import ParamLayout, flatten_module, load_flat_
from flower_pfl.engine.store import ClientModelStore, fits_on_device, to_device, to_host
from flower_pfl.experiment.models import DNN


def test_flatten_unflatten_roundtrip_and_offsets():
    model = DNN(4, 3, hidden=5)
    layout = ParamLayout.from_module(model)
    assert layout.names == ("fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias")
    assert layout.offsets == (0, 20, 25, 40, 43)
    vec = flatten_module(model)
    assert vec.dtype == torch.float32 and vec.shape == (43,)
    back = layout.unflatten(vec)
    for name, tensor in model.state_dict().items():
        assert torch.equal(back[name], tensor)
    other = DNN(4, 3, hidden=5)
    load_flat_(other, vec)
    assert torch.equal(flatten_module(other), vec)


def test_components_tensor_and_module_grouping():
    layout = ParamLayout.from_module(DNN(4, 3, hidden=5))
    assert [(n, s.start, s.stop) for n, s in layout.components("tensor")] == [
        ("fc1.weight", 0, 20), ("fc1.bias", 20, 25), ("fc2.weight", 25, 40), ("fc2.bias", 40, 43)]
    assert [(n, s.start, s.stop) for n, s in layout.components("module")] == [("fc1", 0, 25), ("fc2", 25, 43)]
    with pytest.raises(ValueError, match="grouping"):
        layout.components("layer")


def test_flatten_rejects_wrong_shapes():
    layout = ParamLayout(("a", "b"), ((2,), (1, 2)))
    assert layout.flatten([np.ones(2), np.zeros((1, 2))]).tolist() == [1, 1, 0, 0]
    with pytest.raises(ValueError, match="shapes"):
        layout.flatten([np.ones(3), np.zeros((1, 2))])
    with pytest.raises(ValueError, match="length 4"):
        layout.unflatten(torch.zeros(5))


def test_a_replys_float32_arrays_flatten_as_tensors_do_into_a_vector_of_their_own():
    layout = ParamLayout(("w", "b"), ((2, 3), (3,)))
    arrays = [np.arange(6, dtype=np.float32).reshape(2, 3) / 7, np.array([1e-30, -0.0, 3.5], np.float32)]
    vector = layout.flatten(arrays)
    assert vector.dtype == torch.float32 and torch.equal(vector, layout.flatten([torch.from_numpy(a) for a in arrays]))
    vector[0] = 99.0
    assert arrays[0][0, 0] == 0.0  # a copy, not a view of the reply's arrays
    with pytest.raises(ValueError, match="shapes"):
        layout.flatten([arrays[0].reshape(3, 2), arrays[1]])


def test_store_lazy_rows_put_get_and_growth():
    store = ClientModelStore(torch.tensor([1.0, 2.0]))
    assert store.get(["a", "b"]).tolist() == [[1, 2], [1, 2]]
    store.put(["b"], torch.tensor([[5.0, 6.0]]))
    ids = [f"c{i}" for i in range(50)]  # a new block
    store.put(ids, torch.arange(100, dtype=torch.float32).view(50, 2))
    assert store.get(["b", "a", "c7"]).tolist() == [[5, 6], [1, 2], [14, 15]]
    assert len(store) == 52
    restored = ClientModelStore(store.initial)
    restored.put(store.ids(), store.get(store.ids()))
    assert torch.equal(restored.get(store.ids()), store.get(store.ids()))


def test_store_get_returns_a_copy_and_put_checks_shape():
    store = ClientModelStore(torch.zeros(3))
    rows = store.get([1])
    rows += 7
    assert store.get([1]).sum() == 0
    with pytest.raises(ValueError, match="shape"):
        store.put([1, 2], torch.zeros(2, 4))
    with pytest.raises(ValueError, match="unique"):
        store.put([1, 1], torch.zeros(2, 3))


# -- both stores: in memory (CPU, CUDA when there) and on disk ---------------------------------

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
#: on a GPU also: a store whose device holds only every other block (the rest in pinned host memory),
#: and the disk store handing its rows to the GPU
GPU_KINDS = [("overflowing", "cuda"), ("disk", "cuda")] if torch.cuda.is_available() else []


@pytest.fixture(params=[("memory", d) for d in DEVICES] + [("disk", "cpu")] + GPU_KINDS, ids=lambda p: "-".join(p))
def make(request, tmp_path, monkeypatch):
    """``make(initial)``: an empty store of the kind under test."""
    kind, device = request.param
    if kind == "overflowing":
        fits = itertools.cycle([True, False])
        monkeypatch.setattr(store_module, "fits_on_device", lambda _device, _nbytes: next(fits))
    folders = iter(tmp_path / f"store{i}" for i in range(100))
    return lambda initial: make_store(initial, device, next(folders) if kind == "disk" else None)


def _allocated_rows(store) -> int:
    """Rows actually allocated: the blocks' tensors, or the block files' shapes."""
    if isinstance(store, ClientModelStore):
        return sum(block.shape[0] for block in store._blocks)
    return sum(np.load(path, mmap_mode="r").shape[0] for path in sorted(store.folder.glob("rows_*.npy")))


def test_stores_start_unseen_clients_from_the_initial_model(make):
    store = make(torch.tensor([1.0, 2.0, 3.0]))
    assert len(store) == 0 and store.ids() == [] and store.dim == 3 and "a" not in store
    assert store.get([]).shape == (0, 3)
    got = store.get(["a", 7, "a"])  # duplicates allowed in get
    assert got.device.type == store.device.type and got.dtype == torch.float32
    assert got.tolist() == [[1, 2, 3]] * 3
    assert store.ids() == ["a", 7] and len(store) == 2 and "a" in store and 7 in store
    got += 1  # a copy
    assert store.get(["a"]).tolist() == [[1, 2, 3]]


@pytest.mark.parametrize("dim", [3, 1 << 16])  # indexed copies; slice copies run by run
def test_stores_get_put_round_trips_across_blocks(make, dim):
    store = make(torch.zeros(dim))
    rng = np.random.default_rng(0)
    expected = {}
    for step, size in enumerate([1, 1, 3, 7, 2, 12, 5, 9]):  # a new block nearly every step
        ids = [f"c{step}-{i}" for i in range(size)]
        ids = [ids[i] for i in rng.permutation(size)]
        rows = torch.from_numpy(rng.standard_normal((size, dim), dtype=np.float32))
        store.put(ids, rows.to(store.device) if step % 2 else list(rows.to(store.device)))  # a matrix, or its rows
        expected.update({cid: rows[i] for i, cid in enumerate(ids)})
    assert store.num_blocks > 4
    everyone = list(expected)
    assert store.ids() == everyone  # order of arrival
    for ids in (everyone, everyone[::-1], [everyone[i] for i in rng.permutation(len(everyone))][:13],
                [everyone[3], everyone[3], everyone[20]]):
        torch.testing.assert_close(store.get(ids).cpu(), torch.stack([expected[c] for c in ids]), rtol=0, atol=0)
    update = [everyone[i] for i in rng.permutation(len(everyone))[:17]] + ["late"]
    rows = torch.from_numpy(rng.standard_normal((len(update), dim), dtype=np.float32))
    store.put(update, rows)  # on the CPU whatever the store's device
    store.put(update[:5], [r.clone() for r in rows[:5]])  # rows of no common matrix
    expected.update({cid: rows[i] for i, cid in enumerate(update)})
    torch.testing.assert_close(store.get(list(expected)).cpu(), torch.stack(list(expected.values())), rtol=0, atol=0)
    assert store.ids() == list(expected)


def test_stores_check_ids_and_shapes_before_changing_anything(make):
    store = make(torch.zeros(3))
    store.get([1])
    with pytest.raises(ValueError, match="shape"):
        store.put([1, 2], torch.zeros(2, 4))
    with pytest.raises(ValueError, match="shape"):
        store.put([1, 2], torch.zeros(3, 3))
    with pytest.raises(ValueError, match="unique"):
        store.put([2, 2], torch.zeros(2, 3))
    with pytest.raises(ValueError, match="shape"):
        store.put([1, 2], [torch.zeros(3), torch.zeros(4)])
    with pytest.raises(ValueError, match="shape"):
        store.put([1, 2], [torch.zeros(3)])
    with pytest.raises(ValueError, match="unique"):
        store.put([2, 2], [torch.zeros(3), torch.zeros(3)])
    assert store.ids() == [1]
    with pytest.raises(ValueError, match="flat"):
        make(torch.zeros(2, 2))


def test_stores_grow_by_blocks_within_five_percent(make):
    store = make(torch.zeros(2))
    rng = np.random.default_rng(1)
    n = 0
    for step in range(300):
        size = int(rng.choice([1, 1, 1, 2, 5, 30]))
        store.get(list(range(n, n + size))) if step % 2 else store.put(list(range(n, n + size)), torch.ones(size, 2))
        n += size
        assert len(store) == n and store.capacity <= 1.05 * n
        if step % 20 == 0 or isinstance(store, ClientModelStore):
            assert _allocated_rows(store) == store.capacity
    assert _allocated_rows(store) == store.capacity <= 1.05 * n and store.num_blocks < 150
    if isinstance(store, ClientModelStore):  # growing never moves the rows held
        before = [block.data_ptr() for block in store._blocks]
        store.get(list(range(n, n + 100)))
        assert [block.data_ptr() for block in store._blocks[:len(before)]] == before
        assert _allocated_rows(store) <= 1.05 * len(store)


def test_make_store_picks_the_store(tmp_path):
    assert type(make_store(torch.zeros(2), "cpu", None)) is ClientModelStore
    disk = make_store(torch.zeros(2), "cpu", tmp_path / "s")
    assert type(disk) is DiskClientModelStore and (tmp_path / "s" / "index.json").exists()
    assert type(make_store(torch.zeros(2), "cpu", str(tmp_path / "t"))) is DiskClientModelStore


# -- the disk store ---------------------------------------------------------------------------

def test_disk_store_reopens_with_the_same_ids_and_rows(tmp_path):
    store = DiskClientModelStore(torch.tensor([1.0, 2.0]), tmp_path)
    ids = [5, "b", 2**63 + 1, np.int64(-3)] + [f"c{i}" for i in range(40)]
    rows = torch.arange(2 * len(ids), dtype=torch.float32).view(-1, 2)
    store.put(ids[:10], rows[:10])
    store.get(ids[10:])  # lazily, from the initial model
    store.put(ids[20:], rows[20:])
    store.flush()
    expected = store.get(ids)
    assert expected[10:20].tolist() == [[1, 2]] * 10

    again = DiskClientModelStore(torch.tensor([0.0, 0.0]), tmp_path)  # a new initial for unseen clients
    assert again.ids() == [5, "b", 2**63 + 1, -3] + ids[4:] and again.capacity == store.capacity
    assert torch.equal(again.get(ids), expected) and -3 in again and "5" not in again
    assert again.get(["new"]).tolist() == [[0, 0]]
    again.put(["b"], torch.tensor([[9.0, 9.0]]))
    del again
    opened = DiskClientModelStore.open(tmp_path)  # the initial model saved there
    assert opened.initial.tolist() == [0, 0] and opened.ids()[-1] == "new"
    assert opened.get(["b"]).tolist() == [[9, 9]] and len(opened) == len(ids) + 1


def test_disk_store_maps_long_runs_piece_by_piece(tmp_path, monkeypatch):
    import flower_pfl.engine.disk_store as disk_module
    import flower_pfl.engine.store as store_module

    monkeypatch.setattr(disk_module, "_MAP_BYTES", 3 * 4 * 5)  # three rows of 5 a mapping
    monkeypatch.setattr(store_module, "_RUN_BYTES", {"cpu": 1, "cuda": 1})  # always run by run
    store = DiskClientModelStore(torch.full((5,), -1.0), tmp_path)
    rows = torch.arange(50, dtype=torch.float32).view(10, 5)
    store.put(list(range(10)), rows)
    store.get(list(range(10, 17)))
    assert torch.equal(store.get(list(range(17))), torch.cat([rows, torch.full((7, 5), -1.0)]))
    assert torch.equal(store.get([9, 3, 4, 5, 6, 12]), torch.cat([rows[[9, 3, 4, 5, 6]], torch.full((1, 5), -1.0)]))


def test_disk_store_refuses_another_dimension_and_odd_ids(tmp_path):
    store = DiskClientModelStore(torch.zeros(3), tmp_path)
    store.get(["a"])
    with pytest.raises(ValueError, match="dimension 3, not 4"):
        DiskClientModelStore(torch.zeros(4), tmp_path)
    with pytest.raises(TypeError, match="str or int"):
        store.get(["b", (1, 2)])
    assert store.ids() == ["a"]
    (tmp_path / "rows_00000.npy").unlink()
    with pytest.raises(ValueError, match="lacks rows_00000.npy"):
        DiskClientModelStore(torch.zeros(3), tmp_path)
    with pytest.raises(FileNotFoundError):
        DiskClientModelStore.open(tmp_path / "nothing")


def test_disk_store_keeps_its_rows_in_files(tmp_path):
    memory = ClientModelStore(torch.zeros(4))
    memory.put(["x", "y"], torch.tensor([[1.0, 2, 3, 4], [5, 6, 7, 8]]))
    disk = DiskClientModelStore(memory.initial, tmp_path)
    disk.put(memory.ids(), memory.get(memory.ids()))
    assert disk.ids() == ["x", "y"] and torch.equal(disk.get(["y", "x"]), memory.get(["y", "x"]))
    blocks = sorted(tmp_path.glob("rows_*.npy"))
    assert len(blocks) == 1 and np.load(blocks[0])[:2].tolist() == [[1, 2, 3, 4], [5, 6, 7, 8]]


def test_a_disk_store_rolls_back_to_a_snapshot_bit_for_bit(tmp_path):
    """Snapshot, overwrite some rows (some twice), add clients, snapshot again without releasing the first
    (a checkpoint that never reached the disk), change more: rolling back to either snapshot restores
    exactly its rows and clients, and the undo logs hold only the rows that changed."""
    rng = np.random.default_rng(0)
    store = DiskClientModelStore(torch.zeros(6), tmp_path)
    store.put(list(range(8)), torch.from_numpy(rng.standard_normal((8, 6), dtype=np.float32)))
    first = store.snapshot()
    at_first = store.get(store.ids())
    store.put([1, 3], torch.ones(2, 6))
    store.put([3, 8, 9], torch.full((3, 6), 2.0))  # 3 again (logged once), 8 and 9 new
    assert store.undo.read(first)[0].tolist() == [1, 3]
    second = store.snapshot()
    at_second = store.get(store.ids())
    store.put([0, 9, 10], torch.full((3, 6), 3.0))
    store.rollback(second, list(range(10)))
    assert store.ids() == list(range(10)) and torch.equal(store.get(store.ids()), at_second)
    store.put([2], torch.full((1, 6), 4.0))  # the crash again, after the first rollback
    reopened = DiskClientModelStore.open(tmp_path)
    reopened.rollback(first, list(range(8)))
    assert reopened.ids() == list(range(8)) and torch.equal(reopened.get(reopened.ids()), at_first)
    assert reopened.undo.tokens() == [first]
    reopened.put([11], torch.zeros(1, 6))  # new clients take the dropped rows' places
    assert reopened.ids() == [*range(8), 11] and torch.equal(reopened.get(list(range(8))), at_first)


def test_release_drops_the_logs_of_older_snapshots_and_rollback_rekeys_the_clients(tmp_path):
    store = DiskClientModelStore(torch.zeros(3), tmp_path)
    store.put(["a", "b"], torch.ones(2, 3))
    first = store.snapshot()
    store.put(["a"], torch.zeros(1, 3))
    second = store.snapshot()
    store.release()
    assert store.undo.tokens() == [second] and first < second
    with pytest.raises(ValueError, match="holds 2 clients, not the snapshot's 3"):
        store.rollback(second, ["a", "b", "c"])
    store.rollback(second, ["x", "y"])  # the same clients under new ids (a new flwr run's node ids), in the store's order
    assert store.ids() == ["x", "y"] and torch.equal(store.get(["x", "y"]), torch.tensor([[0.0] * 3, [1.0] * 3]))


def test_a_cpu_store_keeps_every_row_in_ordinary_memory():
    """Nothing of the GPU's paths on the CPU: every block where the store is, no copy on the way in or out."""
    store = ClientModelStore(torch.zeros(4))
    rows = torch.arange(8.0).reshape(2, 4)
    store.put([1, 2], rows)
    assert fits_on_device(torch.device("cpu"), 1 << 60) and store.rows_on_device == store.capacity
    assert all(not block.is_pinned() for block in store._blocks)
    assert to_host(rows) is rows and to_device(rows, torch.device("cpu")) is rows
