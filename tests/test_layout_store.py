import numpy as np
import pytest
import torch

from flower_pfl.layout import ParamLayout, flatten_module, load_flat_
from flower_pfl.models import DNN
from flower_pfl.store import ClientModelStore


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


def test_store_lazy_rows_put_get_and_growth():
    store = ClientModelStore(torch.tensor([1.0, 2.0]))
    assert store.get(["a", "b"]).tolist() == [[1, 2], [1, 2]]
    store.put(["b"], torch.tensor([[5.0, 6.0]]))
    ids = [f"c{i}" for i in range(50)]  # forces several reallocations
    store.put(ids, torch.arange(100, dtype=torch.float32).view(50, 2))
    assert store.get(["b", "a", "c7"]).tolist() == [[5, 6], [1, 2], [14, 15]]
    assert len(store) == 52
    restored = ClientModelStore.from_state_dict(store.state_dict())
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
