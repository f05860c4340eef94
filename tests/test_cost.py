"""A run's cost (``flower_pfl.run.cost``, ``strategies.traffic``): the bytes of the messages both APIs' strategies
send and receive, checked by hand against the arrays sent (SCAFFOLD's control variates, IFCA's cluster models);
what crosses to nodes hosting several clients; the clients' training time and the peak memory in a real run's
rows; the summary's totals."""

from __future__ import annotations

import io
import json
from dataclasses import dataclass

import fabricate as fb
import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict

import strategies
import strategies.message
from flower_pfl.engine.server_algorithm import GlobalModelAlgorithm
from flower_pfl.engine.wire import encode_vector
from flower_pfl.methods.ifca import CLUSTER, MODELS
from flower_pfl.methods.scaffold import CONTROL, CONTROL_DELTA
from flower_pfl.run.cost import (
    BYTES_DOWN,
    BYTES_DOWN_PER_CLIENT,
    BYTES_UP,
    BYTES_UP_PER_CLIENT,
    NODE_PEAK_MEMORY,
    PEAK_MEMORY,
    TRAIN_TIME,
    cost_summary,
    peak_rss_mib,
)
from flower_pfl.run.results import RunRecorder
from server_apps.client_grid import ClientGrid
from server_apps.inprocess import run_in_process
from server_apps.recording import WireMeter
from strategies.aggregated_metrics import PersonalizedMetrics, weighted_train_metrics
from strategies.client_packs import PACK, REPORT, Tally, pack, unpack

CONFIG = {"lr": 0.1, "local-steps": 2, "batch-size": 4}


@dataclass
class Average(GlobalModelAlgorithm):
    """FedAvg: one global model, sent to every client."""


def _fedavg(k: int) -> strategies.message.MethodStrategy:
    return strategies.message.MethodStrategy(Average(), clients_per_round=k, min_available_nodes=1)


@pytest.fixture(autouse=True)
def _identity():
    fb.set_task_identity()


def _npy(a: np.ndarray) -> int:
    """The bytes ``np.save`` writes for ``a``: what a message carries of it."""
    buffer = io.BytesIO()
    np.save(buffer, a, allow_pickle=False)
    return len(buffer.getvalue())


#: the fabricated model's bytes on the wire: 8 float32 values and two ``.npy`` headers
MODEL = sum(_npy(a) for a in fb.model_arrays(0.0).values())


def _size(value) -> int:
    """A config or metric value's bytes, as ``docs/evaluation.md#cost`` counts them."""
    if isinstance(value, bytes | str):
        return len(value if isinstance(value, bytes) else value.encode())
    if isinstance(value, list):
        return sum(_size(v) for v in value)
    return 1 if isinstance(value, bool) else 8


def _values(record) -> int:
    return sum(_size(v) for v in record.values())


def _message_round(strategy, grid, make_reply):
    msgs = list(strategy.configure_train(1, ArrayRecord({n: fb.Array(a) for n, a in fb.model_arrays(0.0).items()}),
                                         ConfigRecord(CONFIG), grid))
    replies = [make_reply(m) for m in msgs]
    return msgs, replies, strategy.aggregate_train(1, replies)[1]


def test_model_bytes_are_the_arrays_sent():
    assert MODEL == 4 * 8 + 2 * 128 == sum(len(fb.Array(a).data) for a in fb.model_arrays(0.0).values())


def test_fedavg_sends_each_client_the_model_and_its_config_and_gets_the_model_back_in_both_apis():
    k = 3
    message = _fedavg(k)
    msgs, _, metrics = _message_round(message, fb.FakeGrid(range(5)), lambda m: fb.train_reply(m, fb.model_arrays(1.0)))
    configs = [_values(m.content["config"]) for m in msgs]
    assert metrics[BYTES_DOWN] == k * MODEL + sum(configs)
    assert metrics[BYTES_DOWN_PER_CLIENT] == MODEL + sum(configs) / k
    assert metrics[BYTES_UP] == k * (MODEL + 2 * 8)  # the model, num-examples and train-loss
    assert metrics[BYTES_UP_PER_CLIENT] == MODEL + 16
    assert 0 < metrics[PEAK_MEMORY] == pytest.approx(peak_rss_mib(), rel=0.5)

    legacy = strategies.LegacyMethodStrategy(Average(), initial_parameters=fb.model_arrays(0.0), clients_per_round=k,
                                             min_available_clients=1, on_fit_config_fn=lambda _: dict(CONFIG))
    ins = legacy.configure_fit(1, legacy.initial_parameters, fb.client_manager([str(i) for i in range(5)]))
    _, legacy_metrics = legacy.aggregate_fit(1, [(p, fb.fit_res(list(fb.model_arrays(1.0).values()))) for p, _ in ins], [])
    assert [_values(fit.config) for _, fit in ins] == configs  # the same instructions
    for key in (BYTES_DOWN, BYTES_UP, BYTES_DOWN_PER_CLIENT, BYTES_UP_PER_CLIENT):
        assert legacy_metrics[key] == metrics[key], key


def test_evaluation_rows_count_the_model_down_and_the_metrics_up():
    strategy = strategies.message.FedMCSA(clients_per_round=2, min_available_nodes=1)
    grid = fb.FakeGrid(range(4))
    _message_round(strategy, grid, lambda m: fb.train_reply(m, fb.model_arrays(1.0)))
    msgs = list(strategy.configure_evaluate(1, ArrayRecord(), ConfigRecord(), grid))
    out = strategy.aggregate_evaluate(1, [fb.eval_reply(m, 0.5, 10) for m in msgs])
    assert out[BYTES_DOWN] == len(msgs) * MODEL + sum(_values(m.content["config"]) for m in msgs)
    assert out[BYTES_UP] == len(msgs) * 3 * 8 and out[BYTES_UP_PER_CLIENT] == 24  # accuracy, num-examples, loss


def test_scaffold_sends_its_control_variate_beside_the_model_both_ways():
    """SCAFFOLD's ``c`` goes down with the model and each ``Δc_i`` up with it: two models each way, where FedAvg
    and Ditto (whose personal model stays on the client) send one."""
    dim = sum(a.size for a in fb.model_arrays(0.0).values())
    delta = encode_vector(torch.full((dim,), 0.01))
    sent = {}
    for name, make, extras in (("fedavg", lambda: _fedavg(2), None),
                               ("ditto", lambda: strategies.message.Ditto(clients_per_round=2, min_available_nodes=1), None),
                               ("scaffold", lambda: strategies.message.SCAFFOLD(clients_per_round=2, min_available_nodes=1),
                                {CONTROL_DELTA: delta})):
        strategy = make()
        msgs, _, metrics = _message_round(strategy, fb.FakeGrid(range(4)),
                                          lambda m, e=extras: fb.train_reply(m, fb.model_arrays(0.5), extras=e))
        assert metrics["clients-accepted"] == 2, name
        config = msgs[0].content["config"]
        assert metrics[BYTES_DOWN_PER_CLIENT] == MODEL + _values(config), name
        sent[name] = (metrics, config)
    scaffold, config = sent["scaffold"]
    assert len(config[CONTROL]) == 4 * dim  # float32 c, the model's size
    assert scaffold[BYTES_UP_PER_CLIENT] == sent["fedavg"][0][BYTES_UP_PER_CLIENT] + len(delta) == MODEL + 16 + 4 * dim
    assert scaffold[BYTES_DOWN_PER_CLIENT] >= sent["fedavg"][0][BYTES_DOWN_PER_CLIENT] + 4 * dim
    assert sent["ditto"][0][BYTES_UP_PER_CLIENT] == sent["fedavg"][0][BYTES_UP_PER_CLIENT]


def test_ifca_sends_every_cluster_model_to_each_client_in_both_apis():
    """IFCA's k cluster models travel down in each client's config (k times the model's values, once per client),
    and each reply carries the client's one-hot cluster choice (k float32) beside its model."""
    k, clients = 3, 2
    dim = sum(a.size for a in fb.model_arrays(0.0).values())
    choice = encode_vector(torch.tensor([0.0, 1.0, 0.0]))
    message = strategies.message.IFCA(num_clusters=k, clients_per_round=clients, min_available_nodes=1)
    msgs, _, metrics = _message_round(message, fb.FakeGrid(range(4)),
                                      lambda m: fb.train_reply(m, fb.model_arrays(0.5), extras={CLUSTER: choice}))
    assert metrics["clients-accepted"] == clients
    configs = [m.content["config"] for m in msgs]
    assert all(len(c[MODELS]) == k * 4 * dim for c in configs)  # float32, every cluster's model
    # each message's arrays (the model its client was last assigned) and its config, the cluster models in it
    assert metrics[BYTES_DOWN] == clients * MODEL + sum(_values(c) for c in configs)
    assert metrics[BYTES_DOWN_PER_CLIENT] >= MODEL + k * 4 * dim
    assert metrics[BYTES_UP] == clients * (MODEL + 16 + len(choice)) and len(choice) == 4 * k

    legacy = strategies.IFCA(num_clusters=k, initial_parameters=fb.model_arrays(0.0), clients_per_round=clients,
                             min_available_clients=1, on_fit_config_fn=lambda _: dict(CONFIG))
    ins = legacy.configure_fit(1, legacy.initial_parameters, fb.client_manager([str(i) for i in range(4)]))
    assert all(len(fit.config[MODELS]) == k * 4 * dim for _, fit in ins)
    results = [(p, fb.fit_res(list(fb.model_arrays(0.5).values()), extras={CLUSTER: choice})) for p, _ in ins]
    _, legacy_metrics = legacy.aggregate_fit(1, results, [])
    assert legacy_metrics[BYTES_DOWN] == clients * MODEL + sum(_values(fit.config) for _, fit in ins)
    assert legacy_metrics[BYTES_UP] == metrics[BYTES_UP]  # the model, train-loss, the cluster choice, num-examples


class _Nodes:
    """Nodes 50 (clients 0-2) and 60 (clients 3-4), each answering a pack of training instructions with every
    client's model trained to ones."""

    def __init__(self) -> None:
        self.sent: list[Message] = []
        self.replies: list[Message] = []

    def get_node_ids(self):
        return [50, 60]

    def send_and_receive(self, messages, *, timeout=None):
        for msg in messages:
            self.sent.append(msg)
            contents, _ = unpack(msg.content)
            ok = {c: RecordDict({"arrays": ArrayRecord({k: fb.Array(v) for k, v in fb.model_arrays(1.0).items()}),
                                 "metrics": MetricRecord({"num-examples": 10, "train-loss": 0.5})}) for c in contents}
            self.replies.append(Message(pack(ok, report=Tally(together=len(ok)).record()), reply_to=msg))
        return list(self.replies[-len(messages):])


def test_a_node_hosting_several_clients_gets_a_model_they_share_once_and_each_client_counts_its_own():
    nodes = _Nodes()
    grid = ClientGrid(nodes, {0: 50, 1: 50, 2: 50, 3: 60, 4: 60})
    strategy = _fedavg(5)
    meter = WireMeter(MessageType.TRAIN)
    msgs = list(strategy.configure_train(1, ArrayRecord({n: fb.Array(a) for n, a in fb.model_arrays(0.0).items()}),
                                         ConfigRecord(CONFIG), grid))
    meter.start(grid)
    metrics = strategy.aggregate_train(1, grid.send_and_receive(msgs))[1]
    configs = sum(_values(m.content["config"]) for m in msgs)
    assert len(nodes.sent) == 2 and metrics["clients-accepted"] == 5
    # per client: its own instruction and reply, as if it were a node of its own
    assert metrics[BYTES_DOWN] == 5 * MODEL + configs and metrics[BYTES_DOWN_PER_CLIENT] == MODEL + configs / 5
    assert metrics[BYTES_UP] == 5 * (MODEL + 16)
    # on the wire: each node's message holds the model once, every client's config and the pack's table
    wire = meter.read(dict(metrics))
    tables = sum(_values(m.content[PACK]) for m in nodes.sent)
    assert wire[BYTES_DOWN] == 2 * MODEL + configs + tables
    assert wire[BYTES_UP] == 5 * (MODEL + 16) + sum(_values(r.content[PACK]) + _values(r.content[REPORT]) for r in nodes.replies)
    assert wire[BYTES_DOWN_PER_CLIENT] == metrics[BYTES_DOWN_PER_CLIENT]  # the clients' own figures stay
    again = list(strategy.configure_train(2, ArrayRecord(), ConfigRecord(CONFIG), grid))
    meter.start(grid)
    grid.send_and_receive(again)
    assert meter.read({})[BYTES_DOWN] == 2 * MODEL + sum(_values(m.content["config"]) for m in again) + \
        sum(_values(m.content[PACK]) for m in nodes.sent[2:])  # this round's messages only


def test_training_time_is_a_plain_mean_and_node_memory_the_largest_in_both_aggregations():
    rows = [(10, {"train-loss": 1.0, TRAIN_TIME: 1.0, NODE_PEAK_MEMORY: 100.0}),
            (30, {"train-loss": 2.0, TRAIN_TIME: 3.0, NODE_PEAK_MEMORY: 50.0})]
    out = weighted_train_metrics(rows)
    assert out == {"train-loss": 1.75, TRAIN_TIME: 2.0, NODE_PEAK_MEMORY: 100.0}
    evaluated = PersonalizedMetrics().aggregate([{"accuracy": 0.5, NODE_PEAK_MEMORY: 7.0}, {"accuracy": 1.0, NODE_PEAK_MEMORY: 9.0}],
                                                [1.0, 3.0])
    assert evaluated[NODE_PEAK_MEMORY] == 9.0 and evaluated["accuracy"] == 0.875


ROWS = [
    {"round": 1, "phase": "train", "clients-accepted": 2.0, BYTES_DOWN: 100.0, BYTES_UP: 90.0, BYTES_DOWN_PER_CLIENT: 50.0,
     BYTES_UP_PER_CLIENT: 45.0, TRAIN_TIME: 1.0, PEAK_MEMORY: 300.0, NODE_PEAK_MEMORY: 200.0},
    {"round": 1, "phase": "evaluate", "accuracy-mean": 0.5, "clients-evaluated": 2.0, BYTES_DOWN: 100.0, BYTES_UP: 10.0,
     PEAK_MEMORY: 310.0, NODE_PEAK_MEMORY: 250.0},
    {"round": 2, "phase": "train", "clients-accepted": 4.0, BYTES_DOWN: 200.0, BYTES_UP: 180.0, BYTES_DOWN_PER_CLIENT: 50.0,
     BYTES_UP_PER_CLIENT: 45.0, TRAIN_TIME: 2.5, PEAK_MEMORY: 305.0, NODE_PEAK_MEMORY: 220.0},
]


def test_the_summary_sums_the_bytes_weights_the_time_by_clients_and_takes_the_largest_memory():
    assert cost_summary(ROWS) == {"bytes_down_total": 400.0, "bytes_up_total": 280.0, "bytes_total": 680.0,
                                  "bytes_down_per_client_round": 50.0, "bytes_up_per_client_round": 45.0,
                                  "train_time_per_client_round_s": (2 * 1.0 + 4 * 2.5) / 6,
                                  "peak_memory_server_mib": 310.0, "peak_memory_node_mib": 250.0}
    assert cost_summary([{"round": 1, "phase": "train", "clients-accepted": 1.0}]) == {}


def test_a_resumed_runs_totals_count_the_rounds_before_the_resume(tmp_path):
    def write(recorder, rows):
        for row in rows:
            metrics = {k: v for k, v in row.items() if k not in ("round", "phase")}
            (recorder.on_train if row["phase"] == "train" else recorder.on_evaluate)(row["round"], metrics)

    first = RunRecorder(tmp_path, {}, num_rounds=2, log=lambda _: None, figures=False)
    write(first, ROWS[:2])
    resumed = RunRecorder.resume(tmp_path, num_rounds=2, last_round=1, elapsed=1.0, log=lambda _: None, figures=False)
    write(resumed, ROWS[2:])
    summary = resumed.finish()
    assert summary["bytes_total"] == 680.0 and summary["peak_memory_node_mib"] == 250.0
    assert json.loads((tmp_path / "summary.json").read_text())["bytes_down_total"] == 400.0


@pytest.mark.parametrize("api,nodes", [("message", 2), ("legacy", 4)])
def test_a_real_runs_rows_have_its_clients_training_time_and_the_peak_memory(tmp_path, api, nodes):
    out = run_in_process({"method": "ditto", "api": api, "num-rounds": 2, "clients-per-round": 4, "local-steps": 3,
                          "eval-every": 1, "figures": False, "output-dir": str(tmp_path)}, num_clients=4, num_nodes=nodes)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if r["phase"] == "train"]
    assert len(train) == 2 and all(r[TRAIN_TIME] > 0 and r[NODE_PEAK_MEMORY] > 0 and r[PEAK_MEMORY] > 0 for r in train)
    assert all(r[BYTES_DOWN_PER_CLIENT] > MODEL and r[BYTES_UP] > 0 for r in rows)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["bytes_total"] == sum(r[BYTES_DOWN] + r[BYTES_UP] for r in rows)
    assert summary["train_time_per_client_round_s"] > 0 and summary["peak_memory_node_mib"] > 0
    assert summary["peak_memory_server_mib"] == max(r[PEAK_MEMORY] for r in rows)
    clients = [json.loads(line) for line in (out / "clients.jsonl").read_text().splitlines()]
    assert clients and all(NODE_PEAK_MEMORY not in c for c in clients)  # the round's row holds the largest
