"""The ClientApp's handling of the proximal anchor kept in node state."""

import numpy as np
import torch
from flwr.app import Context, RecordDict

from client_apps.app import Node
from client_apps.own_loop import RecordState
from flower_pfl.engine.client_algorithm import CLIENT_ALGORITHM, FINETUNE_STEPS, PROXIMAL_MU, Proximal
from flower_pfl.experiment.config import ExperimentConfig
from flower_pfl.methods.all_clients_train import ANCHOR, ANCHOR_STATE, AnchoredProximal


def _node(state: RecordDict) -> Node:
    context = Context(run_id=1, node_id=7, node_config={"partition-id": 1, "num-partitions": 3}, state=state,
                      run_config=ExperimentConfig(local_steps=3).to_run_config())
    return Node.from_context(context)


def _anchor(node: Node, mode: str | None) -> list[torch.Tensor]:
    """The anchor of the proximal step the node would run for an instruction with ``mode``."""
    config = {PROXIMAL_MU: 1.0} if mode is None else {PROXIMAL_MU: 1.0, ANCHOR: mode}
    step = AnchoredProximal if mode is not None else Proximal
    return step(node.model, config, RecordState(node.state)).anchor


def _params(node: Node) -> list[np.ndarray]:
    return [p.detach().numpy().copy() for p in node.model.parameters()]


def _same(tensors, arrays) -> bool:
    return all(torch.equal(t, torch.as_tensor(a)) for t, a in zip(tensors, arrays))


def test_anchor_set_is_remembered_and_keep_uses_it():
    state = RecordDict()
    node = _node(state)
    node.load([np.full(a.shape, 0.5, np.float32) for a in node.arrays()])
    received = _params(node)
    assert _same(_anchor(node, "set"), received) and ANCHOR_STATE in state  # anchor = received, remembered
    assert all(np.array_equal(a, b) for a, b in zip(state[ANCHOR_STATE].to_numpy_ndarrays(), received))

    later = _node(state)  # next round, same node state
    later.load([np.full(a.shape, -1.0, np.float32) for a in later.arrays()])
    assert _same(_anchor(later, "keep"), received)
    assert _same(_anchor(later, None), _params(later))  # Flower's own strategies: anchor = received
    assert all(np.array_equal(a, b) for a, b in zip(RecordState(state)[ANCHOR_STATE], received))  # keep changes nothing


def test_keep_without_remembered_anchor_falls_back_to_received():
    node = _node(RecordDict())
    assert _same(_anchor(node, "keep"), _params(node)) and ANCHOR_STATE not in node.state


def test_fit_with_kept_anchor_is_pulled_toward_it():
    """Same start, same batches: a remembered anchor at 0 ends nearer 0 than the received-model anchor."""
    ends = {}
    for mode in ("keep", None):
        state = RecordDict()
        node = _node(state)
        node.load([np.zeros(a.shape, np.float32) for a in node.arrays()])
        _anchor(node, "set")  # remember the zero model
        node.load([np.full(a.shape, 2.0, np.float32) for a in node.arrays()])
        named = {CLIENT_ALGORITHM: AnchoredProximal.name, ANCHOR: mode} if mode else {}  # None: Flower's FedProx, by its key
        metrics, extras = node.fit({"lr": 0.05, "local-steps": 3, "batch-size": 20, "proximal-mu": 5.0, "server-round": 2, **named})
        assert extras == {CLIENT_ALGORITHM: "anchored-proximal" if mode else "proximal"}
        assert metrics["num-examples"] == node.data.num_train and np.isfinite(metrics["train-loss"])
        ends[mode] = np.concatenate([p.ravel() for p in _params(node)])
    assert np.linalg.norm(ends["keep"]) < np.linalg.norm(ends[None]) - 1.0


def test_fit_with_set_remembers_the_received_model_not_the_trained_one():
    state = RecordDict()
    node = _node(state)
    node.load([np.full(a.shape, 0.25, np.float32) for a in node.arrays()])
    received = _params(node)
    node.fit({"lr": 0.05, "local-steps": 3, "batch-size": 20, "proximal-mu": 5.0, "anchor": "set", "server-round": 1,
              CLIENT_ALGORITHM: AnchoredProximal.name})
    assert not all(np.array_equal(a, b) for a, b in zip(_params(node), received))  # it trained
    assert all(np.array_equal(a, b) for a, b in zip(state[ANCHOR_STATE].to_numpy_ndarrays(), received))


def test_a_clients_dropout_draws_repeat_whatever_its_process_drew_before():
    """Dropout draws from torch's global random state, which differs between the processes that serve a
    client (a Ray worker's history, a SuperNode's): each message seeds it by the run's seed, the client and
    the round, and gives it back as it was."""
    run_config = ExperimentConfig(dataset="tests.family_data:tokens", model="textcnn", partition="iid", dropout=0.5,
                                  model_width=0.1, local_steps=3, batch_size=8, options={"text-embed-dim": 8}).to_run_config()
    node = Node.from_context(Context(run_id=1, node_id=7, node_config={"partition-id": 1, "num-partitions": 3}, state=RecordDict(),
                                     run_config=run_config))
    start = [t.clone() for t in node.model.state_dict().values()]
    trained = []
    for history, round_ in ((1, 1), (2, 1), (1, 2)):
        node.load([t.numpy() for t in start])
        torch.manual_seed(history)
        node.fit({"lr": 0.1, "local-steps": 3, "batch-size": 8, "server-round": round_})
        trained.append(_params(node))
        assert torch.initial_seed() == history  # the process's own random state is given back
    assert all(np.array_equal(a, b) for a, b in zip(trained[0], trained[1]))  # another history, the same draws
    assert not all(np.array_equal(a, b) for a, b in zip(trained[0], trained[2]))  # another round, other draws


def test_a_new_clients_finetuning_draws_repeat_and_a_plain_evaluation_leaves_the_random_state_alone():
    """A client that never trained takes ``finetune-steps`` before it evaluates: its dropout draws are seeded as
    a training's are. Evaluating the received model as it is draws nothing, and seeds nothing."""
    run_config = ExperimentConfig(dataset="tests.family_data:tokens", model="textcnn", partition="iid", dropout=0.5,
                                  model_width=0.1, batch_size=8, options={"text-embed-dim": 8}).to_run_config()
    node = _own_model(Node.from_context(Context(run_id=1, node_id=7, node_config={"partition-id": 1, "num-partitions": 3},
                                                state=RecordDict(), run_config=run_config)))
    start = [t.clone() for t in node.model.state_dict().values()]
    finetuned = []
    for history in (1, 2):
        node.load([t.numpy() for t in start])
        torch.manual_seed(history)
        finetuned.append(node.evaluate({"server-round": 4, FINETUNE_STEPS: 2, "lr": 0.5, "batch-size": 8}))
        assert torch.initial_seed() == history
    node.load([t.numpy() for t in start])
    plain = node.evaluate({"server-round": 4})
    assert finetuned[0]["loss"] == finetuned[1]["loss"] != plain["loss"]  # the same draws, and they changed the model
    torch.manual_seed(5)
    expected = torch.rand(2)
    torch.manual_seed(5)
    node.evaluate({"server-round": 4})
    assert torch.equal(torch.rand(2), expected)

def test_arrays_several_clients_hold_are_decoded_once():
    """FedPer's clients get one base and their own heads: records copy ``Array`` objects but share their bytes,
    and a node decodes each array's bytes once."""
    from flwr.app import ArrayRecord

    from client_apps.app import Decoded
    from strategies.arrays import numpy_array

    base = numpy_array(np.arange(6, dtype=np.float32))
    first = ArrayRecord({"base": base, "head": numpy_array(np.zeros(2, np.float32))})
    second = ArrayRecord({"base": base, "head": numpy_array(np.ones(2, np.float32))})
    decoded = Decoded()
    a, b = decoded(first), decoded(second)
    assert a["base"] is b["base"] and np.array_equal(a["base"], np.arange(6))
    assert a["head"] is not b["head"] and np.array_equal(b["head"], np.ones(2))
    assert decoded(first) is a


def _own_model(node: Node) -> Node:
    """``node`` with a model of its own (a process's nodes share one): the tests below write into it."""
    from copy import deepcopy
    from dataclasses import replace

    return replace(node, model=deepcopy(node.model))


def test_a_message_loads_its_model_again_only_when_the_node_model_changed(monkeypatch):
    """Clients of one message that received one model load it once, while nothing writes the node's model; a
    write in place (a client's fine-tuning) or a replaced tensor makes the next client load it again."""
    from flwr.app import ArrayRecord

    from client_apps.app import Decoded
    from strategies.arrays import numpy_record

    node = _own_model(_node(RecordDict()))
    sent = {k: np.full(v.shape, 0.25, np.float32) for k, v in node.model.state_dict().items()}
    record = numpy_record(sent)
    loads = []
    honest = Node.__dict__["load"]
    monkeypatch.setattr(Node, "load", lambda self, arrays: (loads.append(1), honest(self, arrays))[1])
    decoded = Decoded()
    decoded.load(node, record)
    decoded.load(node, record)
    assert len(loads) == 1 and all(np.array_equal(p.detach().numpy(), sent[k]) for k, p in node.model.state_dict().items())
    with torch.no_grad():
        next(node.model.parameters()).add_(1.0)  # written in place
    decoded.load(node, record)
    assert len(loads) == 2 and all(np.array_equal(p.detach().numpy(), sent[k]) for k, p in node.model.state_dict().items())
    first = next(iter(node.model._modules.values()))
    first.weight = torch.nn.Parameter(torch.zeros_like(first.weight))  # replaced
    decoded.load(node, record)
    assert len(loads) == 3 and np.array_equal(first.weight.detach().numpy(), sent[next(iter(sent))])
    decoded.load(node, ArrayRecord(dict(record)))  # another record: loaded
    assert len(loads) == 4


def test_clients_evaluating_an_unchanged_model_share_one_copy_of_its_state():
    from client_apps.app import Decoded

    node, decoded = _own_model(_node(RecordDict())), Decoded()
    first = decoded.state(node.model)
    assert decoded.state(node.model) is first
    assert all(a.data_ptr() != b.data_ptr() for a, b in zip(first, node.model.state_dict().values()))  # a copy
    with torch.no_grad():
        next(node.model.parameters()).mul_(2.0)
    second = decoded.state(node.model)
    assert second is not first and torch.equal(second[0], next(node.model.parameters()))
    assert not torch.equal(first[0], second[0])  # the earlier copy is as it was
