"""The ClientApp's handling of the proximal anchor kept in node state."""

import numpy as np
import torch
from flwr.app import Context, RecordDict

from client_apps.app import ANCHOR_STATE, Node
from client_apps.rules import proximal_anchor
from flower_pfl.config import ExperimentConfig


def _node(state: RecordDict) -> Node:
    context = Context(run_id=1, node_id=7, node_config={"partition-id": 1, "num-partitions": 3}, state=state,
                      run_config=ExperimentConfig(local_steps=3).to_run_config())
    return Node.from_context(context)


def _anchor(node: Node, mode: str | None):
    return proximal_anchor(mode, [p.detach() for p in node.model.parameters()], node.state)


def _params(node: Node) -> list[np.ndarray]:
    return [p.detach().numpy().copy() for p in node.model.parameters()]


def test_anchor_set_is_remembered_and_keep_uses_it():
    state = RecordDict()
    node = _node(state)
    node.load([np.full(a.shape, 0.5, np.float32) for a in node.arrays()])
    received = _params(node)
    assert _anchor(node, "set") is None and ANCHOR_STATE in state  # anchor = received, remembered
    assert all(np.array_equal(a, b) for a, b in zip(state[ANCHOR_STATE].to_numpy_ndarrays(), received))

    later = _node(state)  # next round, same node state
    later.load([np.full(a.shape, -1.0, np.float32) for a in later.arrays()])
    kept = _anchor(later, "keep")
    assert all(torch.equal(k, torch.as_tensor(r)) for k, r in zip(kept, received))
    assert _anchor(later, None) is None  # Flower's own strategies: anchor = received


def test_keep_without_remembered_anchor_falls_back_to_received():
    assert _anchor(_node(RecordDict()), "keep") is None


def test_fit_with_kept_anchor_is_pulled_toward_it():
    """Same start, same batches: a remembered anchor at 0 ends nearer 0 than the received-model anchor."""
    ends = {}
    for mode in ("keep", None):
        state = RecordDict()
        node = _node(state)
        node.load([np.zeros(a.shape, np.float32) for a in node.arrays()])
        _anchor(node, "set")  # remember the zero model
        node.load([np.full(a.shape, 2.0, np.float32) for a in node.arrays()])
        node.fit({"lr": 0.05, "local-steps": 3, "batch-size": 20, "proximal-mu": 5.0, "anchor": mode, "server-round": 2})
        ends[mode] = np.concatenate([p.ravel() for p in _params(node)])
    assert np.linalg.norm(ends["keep"]) < np.linalg.norm(ends[None]) - 1.0
