"""The reply bounds by hand, refused evaluation replies, bounded waits for nodes, Flower's own
strategies behind the same checks, and runs that achieve nothing failing."""

from __future__ import annotations

import json
import math

import fabricate as fb
import numpy as np
import pytest
import torch
from flwr.app import ConfigRecord, Message, MetricRecord, RecordDict
from flwr.common import Code, EvaluateRes, Status
from test_twins import NODES, OURS, TRAINING, Clients, _twins
from test_twins import _model as twins_model

import strategies.message
from client_apps.flower_internals import unavailable_reply
from flower_pfl.engine.method_server import MethodServer
from flower_pfl.engine.reply_checks import (
    RawReply,
    Reply,
    ReplyBounds,
    RoundReplies,
    UpdateRejected,
    WeightBook,
    check_evaluation,
    lower_median,
)
from flower_pfl.engine.sampling import Sampler
from flower_pfl.experiment.build import load_client_data
from flower_pfl.experiment.config import ExperimentConfig
from flower_pfl.run.cost import BYTES_UP, COST_KEYS
from flower_pfl.run.results import RunFailed
from server_apps.inprocess import run_in_process
from strategies.aggregated_metrics import checked_evaluations
from strategies.nodes import NodeWatch, split_replies


def _reply(cid, n=10, value=0.0):
    return Reply(cid, torch.full((4,), value), n, {})


def test_lower_median_takes_the_lower_middle_value():
    assert lower_median([5.0, 1.0, 3.0]) == 3.0
    assert lower_median([1.0, 1e38]) == 1.0  # one outlier of two cannot move it
    assert lower_median([]) == 0.0


def test_update_bound_by_hand():
    """Changes 1, 2, 3 and 40 of models of norm 1: max-update-ratio 10 allows a change of 10."""
    replies = [_reply(c) for c in "abcd"]
    norms = [{"model": (1.0, 1.0)}, {"model": (2.0, 1.0)}, {"model": (3.0, 1.0)}, {"model": (40.0, 1.0)}]
    batch = RoundReplies()
    kept = ReplyBounds(max_update_ratio=10).apply(replies, norms, batch)
    assert [r.client_id for r in kept] == ["a", "b", "c"]
    assert batch.rejections[0][0] == "d" and "'model' changed by a norm of 40" in batch.rejections[0][1]
    assert batch.bound_use == pytest.approx(0.3)  # 3 of the 10 allowed
    assert len(ReplyBounds(10).apply(replies, norms[:3] + [{"model": (40.0, 5.0)}], RoundReplies())) == 4  # 40 <= 10 · 5
    assert len(ReplyBounds(math.inf).apply(replies, norms, RoundReplies())) == 4  # off


def test_a_model_sent_as_zeros_is_bounded_by_the_rounds_median_change():
    replies = [_reply(c) for c in "abcd"]
    norms = [{"model": (1.0, 0.0)}, {"model": (2.0, 0.0)}, {"model": (3.0, 0.0)}, {"model": (400.0, 0.0)}]
    batch = RoundReplies()
    assert [r.client_id for r in ReplyBounds(10).apply(replies, norms, batch)] == ["a", "b", "c"]  # 400 > 100 · 2
    assert "max-median-ratio = 100 times the round's median, 2" in batch.rejections[0][1]


def test_a_change_too_large_for_float32_norms_is_refused_not_waved_through():
    """Norms in float32 of a 1e30 change overflow to inf, and inf / inf is NaN, which compares False."""
    from flower_pfl.engine.reply_checks import model_change

    sent = torch.full((100,), 0.1)
    change = model_change(Reply("a", torch.full((100,), 1e30), 1, {}), sent)["model"]
    assert math.isfinite(change[0]) and change[0] == pytest.approx(1e31, rel=1e-6)
    batch = RoundReplies()
    assert ReplyBounds(10).apply([_reply("a"), _reply("b")], [{"model": (math.inf, 0.0)}, {"model": (math.inf, 0.0)}], batch) == []


def test_every_field_is_bounded_and_one_field_out_refuses_the_reply():
    replies = [_reply(c) for c in "abc"]
    norms = [{"model": (1.0, 1.0), "extra": (1.0, 0.0)}, {"model": (1.0, 1.0), "extra": (2.0, 0.0)},
             {"model": (1.0, 1.0), "extra": (300.0, 0.0)}]  # the median, 2, allows 200
    batch = RoundReplies()
    assert [r.client_id for r in ReplyBounds(10).apply(replies, norms, batch)] == ["a", "b"]
    assert "'extra'" in batch.rejections[0][1]


def test_sample_counts_are_capped_at_a_multiple_of_the_median_and_otherwise_untouched():
    replies = [_reply("a", 100), _reply("b", 200), _reply("c", 10**12)]
    kept = ReplyBounds(max_weight_ratio=1000).apply(replies, [{"model": (0.0, 1.0)}] * 3, RoundReplies())
    assert [r.num_examples for r in kept] == [100, 200, 200 * 1000]
    assert [r.num_examples for r in ReplyBounds(max_weight_ratio=math.inf).apply(replies, [{}] * 3, RoundReplies())] == [
        100, 200, 10**12]


@pytest.mark.parametrize("bad", [0.5, -1, math.nan, "10"])
def test_bounds_refuse_meaningless_settings(bad):
    with pytest.raises(ValueError, match="max_update_ratio"):
        ReplyBounds(max_update_ratio=bad)


EVALUATION_CASES = {
    "accuracy list": {"accuracy": [0.5, 0.5], "num-examples": 5},
    "accuracy string": {"accuracy": "0.5", "num-examples": 5},
    "accuracy nan": {"accuracy": math.nan, "num-examples": 5},
    "accuracy above one": {"accuracy": 7.0, "num-examples": 5},
    "accuracy negative": {"accuracy": -0.1, "num-examples": 5},
    "num-examples list": {"accuracy": 0.5, "num-examples": [5]},
    "num-examples zero": {"accuracy": 0.5, "num-examples": 0},
    "num-examples missing": {"accuracy": 0.5},
    "global accuracy nan": {"accuracy": 0.5, "num-examples": 5, "global-accuracy": math.nan},
}


@pytest.mark.parametrize("case", list(EVALUATION_CASES))
def test_check_evaluation_names_the_field(case):
    metrics = EVALUATION_CASES[case]
    with pytest.raises(UpdateRejected, match=case.split()[0] if case != "global accuracy nan" else "global-accuracy"):
        check_evaluation(metrics, "accuracy", fractions=("global-accuracy",))


def test_a_reply_without_the_accuracy_key_counts_for_its_other_metrics_only():
    assert check_evaluation({"num-examples": 5, "loss": 1.0, "hist": [1, 2]}) == {"num-examples": 5, "loss": 1.0, "hist": [1.0, 2.0]}
    kept, _ = checked_evaluations([(1, {"accuracy": 0.5, "loss": 1.0, "num-examples": 10}), (2, {"loss": 3.0, "num-examples": 10})])
    from strategies.aggregated_metrics import PersonalizedMetrics

    out = PersonalizedMetrics().legacy([(row["num-examples"], row) for _, row in kept])
    assert out["loss"] == 2.0 and out["accuracy"] == 0.5 and out["accuracy-mean"] == 0.5 and out["clients-evaluated"] == 1


def test_a_diverged_clients_nan_loss_is_dropped_but_its_accuracy_counts():
    assert check_evaluation({"accuracy": 0.1, "num-examples": 3, "loss": math.nan}) == {"accuracy": 0.1, "num-examples": 3}


def _figures(metrics: dict) -> dict:
    """A round's figures but its cost (the bytes received, the memory measured)."""
    return {k: v for k, v in metrics.items() if k not in COST_KEYS}


def _evaluate(strategy, api, rnd, hostile):
    """One evaluation round; the first node's reply is ``hostile`` metrics (None: it fails)."""
    if api == "message":
        msgs = list(strategy.configure_evaluate(rnd, strategy._arrays_for_test, ConfigRecord(), fb.FakeGrid(NODES)))
        replies = []
        for i, msg in enumerate(msgs):
            if i == 0:
                replies.append(fb.error_reply(msg) if hostile is None else
                               Message(RecordDict({"metrics": MetricRecord(hostile)}), reply_to=msg))
            else:
                replies.append(fb.eval_reply(msg, 0.1 * i, 10 * i))
        return dict(strategy.aggregate_evaluate(rnd, replies) or {})
    cm = fb.client_manager([str(n) for n in NODES])
    ins = strategy.configure_evaluate(rnd, strategy.initial_parameters, cm)
    results, failures = [], []
    for i, (proxy, _) in enumerate(ins):
        if i == 0:
            if hostile is None:
                failures.append(RuntimeError("crashed"))
                continue
            res = EvaluateRes(Status(Code.OK, ""), 1.0, 5, {k: v for k, v in hostile.items() if k != "num-examples"})
            res.num_examples = hostile.get("num-examples")
            results.append((proxy, res))
        else:
            results.append((proxy, EvaluateRes(Status(Code.OK, ""), 1.0, 10 * i, {"accuracy": 0.1 * i})))
    return dict(strategy.aggregate_evaluate(rnd, results, failures)[1])


@pytest.mark.parametrize("api,case", [(api, c) for api in ("message", "legacy") for c in EVALUATION_CASES
                                      if c != "global accuracy nan" and not (api == "message" and c == "accuracy string")])
def test_every_method_leaves_out_a_hostile_evaluation_reply_as_if_the_client_had_failed(api, case, caplog):
    from flwr.app import ArrayRecord

    for entry in OURS:
        fb.set_task_identity()
        legacy, message, initial = _twins(entry)
        strategy = message if api == "message" else legacy
        strategy._arrays_for_test = ArrayRecord({k: torch.as_tensor(v) for k, v in initial.items()})
        if api == "message":
            list(strategy.configure_train(1, strategy._arrays_for_test, ConfigRecord({}), fb.FakeGrid(NODES)))
        caplog.clear()
        got = _evaluate(strategy, api, 1, EVALUATION_CASES[case])
        failed = _evaluate(strategy, api, 1, None)
        assert got[BYTES_UP] > failed[BYTES_UP], entry.label  # the hostile reply crossed; nothing else counts it
        assert _figures(got) == _figures(failed) and got["clients-evaluated"] == len(NODES) - 1, entry.label
        assert any("evaluation of client" in r.getMessage() and "left out" in r.getMessage() for r in caplog.records), entry.label


def test_evaluation_counts_are_capped_too():
    rows = [(1, {"accuracy": 0.5, "num-examples": 10}), (2, {"accuracy": 0.5, "num-examples": 20}),
            (3, {"accuracy": 0.0, "num-examples": 10**12})]
    kept, refused = checked_evaluations(rows, max_weight_ratio=1000)
    assert not refused and [r["num-examples"] for _, r in kept] == [10, 20, 20_000]


class ShrinkingGrid:
    def __init__(self, nodes):
        self.nodes = list(nodes)

    def get_node_ids(self):
        return list(self.nodes)


class Clock:
    """``time`` for ``strategies.nodes``: ``sleep`` moves ``monotonic`` on, no wall clock involved."""

    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def test_a_round_waits_for_missing_nodes_only_up_to_the_timeout_and_names_them(caplog, monkeypatch):
    import strategies.nodes

    clock = Clock()
    monkeypatch.setattr(strategies.nodes, "time", clock)
    watch = NodeWatch(timeout=0.3, poll=0.05)
    grid = ShrinkingGrid([1, 2, 3])
    assert watch.wait(grid, 3) == [1, 2, 3] and clock.now == 0
    grid.nodes = [1, 3]  # node 2 is lost: one wait of the timeout, in polls
    assert watch.wait(grid, 3) == [1, 3]
    assert 0.3 <= clock.now < 0.3 + 0.05 + 1e-9
    assert any("missing since an earlier round: [2]" in r.getMessage() for r in caplog.records)
    waited = clock.now  # node 2 lost for good: later rounds do not wait for it again
    assert watch.wait(grid, 3) == [1, 3] and clock.now == waited
    assert list(watch.failures.lost) == [2] and watch.failures.lost[2].cause == "disconnected"
    grid.nodes = [1]  # another loss: a new wait
    assert watch.wait(grid, 3) == [1] and clock.now - waited >= 0.3
    grid.nodes = [1, 2, 3, 4]  # 2 and 3 back under their old ids: lost for this run; 4 is new
    assert watch.wait(grid, 3) == [1, 4] and list(watch.failures.lost) == [2, 3]
    fresh = NodeWatch(timeout=0.3, poll=0.05, lost_after=0)  # 0: nothing is ever lost
    grid.nodes = [1, 2, 3]
    fresh.wait(grid, 3)
    grid.nodes = [1, 3]
    assert fresh.wait(grid, 3) == [1, 3]
    grid.nodes = [1, 2, 3, 4]  # back to full strength: the full number is wanted again
    assert fresh.wait(grid, 3) == [1, 2, 3, 4] and fresh.settled is None and not fresh.failures.lost


def test_message_strategy_goes_on_without_a_lost_node(caplog):
    fb.set_task_identity()
    entry = next(e for e in OURS if e.method == "fedmcsa")
    _, _, initial = _twins(entry)
    from flwr.app import ArrayRecord

    import strategies.message

    strategy = strategies.message.FedMCSA(clients_per_round=3, min_available_nodes=3, node_wait_timeout=0.2)
    arrays = ArrayRecord({k: torch.as_tensor(v) for k, v in initial.items()})
    msgs = list(strategy.configure_train(1, arrays, ConfigRecord({}), fb.FakeGrid([21, 22])))
    assert sorted(m.metadata.dst_node_id for m in msgs) == [21, 22]


def test_an_error_the_superlink_makes_for_an_unreachable_node_names_that_node(caplog):
    fb.set_task_identity()
    sent = [Message(RecordDict({"config": ConfigRecord()}), message_type="train", dst_node_id=n) for n in (7, 8)]
    for i, msg in enumerate(sent):
        msg.metadata.__dict__["_message_id"] = f"id-{i}"
    lost = unavailable_reply(sent[0].metadata, "node_unavail")
    good, failed = split_replies(3, [lost], sent)
    assert lost.metadata.src_node_id == 1 and good == [] and failed == 2  # one failed, one never answered
    text = " ".join(r.getMessage() for r in caplog.records)
    assert "node 7 failed (Node Unavailable: Error: Node Unavailable" in text and "node 8 sent no reply" in text and "node 1 " not in text


def test_flowers_own_fedavg_is_guarded_in_the_package_app(tmp_path, monkeypatch):
    """A client that sends a huge model: FedAvg's run refuses it every round and ends like a run
    in which that client fails."""
    import client_apps.app as capp

    honest_arrays = capp.Node.arrays

    def poisoned(self):
        arrays = honest_arrays(self)
        return [np.full_like(a, 1e38) for a in arrays] if self.partition_id == 0 else arrays

    def crashed(self, config):
        if self.partition_id == 0:
            raise RuntimeError("crashed")
        return honest_fit(self, config)

    honest_fit = capp.Node.fit
    # one by one: the ClientApp's own path (what flwr run runs), where Node.arrays makes the reply
    base = {"method": "fedavg", "num-rounds": 3, "clients-per-round": 4, "local-steps": 5, "eval-every": 3, "seed": 2,
            "batch-clients": False}
    with monkeypatch.context() as m:
        m.setattr(capp.Node, "arrays", poisoned)
        poisoned_run = run_in_process({**base, "output-dir": str(tmp_path / "a")}, num_clients=4)
    with monkeypatch.context() as m:
        m.setattr(capp.Node, "fit", crashed)
        failed_run = run_in_process({**base, "output-dir": str(tmp_path / "b")}, num_clients=4)
    a, b = (json.loads((d / "summary.json").read_text()) for d in (poisoned_run, failed_run))
    assert a["status"] == "completed" and a["final_accuracy"] == b["final_accuracy"]
    rows = [json.loads(line) for line in (poisoned_run / "metrics.jsonl").read_text().splitlines()]
    assert [r["clients-rejected"] for r in rows if r["phase"] == "train"] == [1, 1, 1]


def test_flowers_fedavg_behind_the_guard_aggregates_the_checked_arrays_without_decoding_them_again(monkeypatch):
    """The guard hands Flower's FedAvg the arrays it read (``DecodedArray``): the same global model to the bit,
    and no reply array is decoded a second time."""
    from copy import deepcopy

    from flwr.app import Array
    from flwr.serverapp.strategy import FedAvg

    from server_apps.guard import ReplyGuard
    from strategies.arrays import DecodedArray, numpy_record, record_numpy

    fb.set_task_identity()
    initial = {"w": np.arange(6, dtype=np.float32).reshape(2, 3) / 7, "b": np.ones(2, np.float32)}
    strategy = FedAvg(fraction_train=1.0, min_train_nodes=3, min_available_nodes=3)
    msgs = list(strategy.configure_train(1, numpy_record(initial), ConfigRecord({}), fb.FakeGrid([21, 22, 23])))
    replies = [fb.train_reply(m, {k: v + 0.1 * i for k, v in initial.items()}, num_examples=10 + i) for i, m in enumerate(msgs)]
    expected, _ = strategy.aggregate_train(1, deepcopy(replies))
    accepted, _ = ReplyGuard(ReplyBounds()).messages(1, replies, initial, msgs)
    assert len(accepted) == 3 and all(isinstance(a, DecodedArray) for m in accepted for a in m.content["arrays"].values())
    monkeypatch.setattr(Array, "numpy", lambda self: pytest.fail("a reply's array decoded again"))
    got, _ = strategy.aggregate_train(1, accepted)
    monkeypatch.undo()
    want, have = record_numpy(expected), record_numpy(got)
    assert list(have) == list(want) and all(np.array_equal(have[k], want[k]) and have[k].dtype == want[k].dtype for k in want)


def test_a_run_in_which_no_update_is_accepted_fails_with_a_clear_reason(tmp_path):
    with pytest.raises(RunFailed, match="accepted no client update.*max-idle-rounds"):
        run_in_process({"method": "fedavg", "num-rounds": 4, "clients-per-round": 4, "local-steps": 2, "lr": 1e30,
                        "output-dir": str(tmp_path)}, num_clients=4)
    (run_dir,) = list(tmp_path.iterdir())
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["idle_rounds"] == 3 and "max-idle-rounds" in summary["error"]


@pytest.mark.parametrize("trick", ["second reply", "uninvited node", "two array records", "metrics as config"])
def test_replies_that_do_not_answer_the_rounds_instructions_once_are_refused(trick, caplog):
    from flwr.app import ArrayRecord

    import strategies.message

    fb.set_task_identity()
    entry = next(e for e in OURS if e.method == "fedmcsa")
    _, _, initial = _twins(entry)
    strategy = strategies.message.FedMCSA(clients_per_round=2, min_available_nodes=1, seed=3)
    arrays = ArrayRecord({k: torch.as_tensor(v) for k, v in initial.items()})
    msgs = list(strategy.configure_train(1, arrays, ConfigRecord({}), fb.FakeGrid(NODES)))
    before = strategy.method.store.get(NODES).clone()
    honest = [fb.train_reply(m, {k: v + 0.01 for k, v in initial.items()}) for m in msgs]
    if trick == "second reply":
        extra = fb.train_reply(msgs[0], {k: v - 0.01 for k, v in initial.items()})
    elif trick == "uninvited node":
        stranger = next(n for n in NODES if n not in {m.metadata.dst_node_id for m in msgs})
        extra = fb.train_reply(Message(RecordDict({"config": ConfigRecord()}), message_type="train", dst_node_id=stranger),
                               {k: v + 0.01 for k, v in initial.items()})
    else:
        extra = honest.pop()
        if trick == "two array records":
            extra.content["more"] = ArrayRecord({k: torch.as_tensor(v) for k, v in initial.items()})
        else:
            del extra.content["metrics"]
            extra.content["metrics"] = ConfigRecord({"num-examples": 10})
    _, metrics = strategy.aggregate_train(1, [*honest, extra])
    assert metrics["clients-rejected"] == 1 and metrics["clients-accepted"] == len(honest)
    after = strategy.method.store.get(NODES)
    changed = {n for n, a, b in zip(NODES, before, after) if not torch.equal(a, b)}
    assert changed == {m.metadata.src_node_id for m in honest}  # only the honest replies were stored


def test_training_metrics_average_only_finite_numbers():
    from strategies.aggregated_metrics import weighted_train_metrics

    got = weighted_train_metrics([(10, {"train-loss": 1.0, "acc": 0.5, "tag": [1, 2]}), (30, {"train-loss": math.nan, "acc": 1e308}),
                                  (10, {"train-loss": 2.0, "acc": 1e308})])
    # train-loss: the NaN client is left out of that metric only; acc's weighted sum overflows: left out
    assert got == {"train-loss": 1.5, "tag": [1.0, 2.0]}
    assert weighted_train_metrics([(10, {"a": 1.0}), (30, {"a": 3.0})]) == {"a": 2.5}


def test_a_client_claiming_a_trillion_examples_weighs_as_a_thousand_median_clients():
    from flower_pfl.engine.method_server import MethodServer
    from flower_pfl.engine.reply_checks import RawReply
    from flower_pfl.engine.server_algorithm import GlobalModelAlgorithm

    server = MethodServer(GlobalModelAlgorithm(), clients_per_round=3, seed=0)
    initial = {"w": np.ones(4, np.float32)}
    server.initialize(initial)
    plan = server.plan_training(1, [1, 2, 3])
    counts = {1: 100, 2: 200, 3: 10**12}
    values = {1: 1.0, 2: 1.5, 3: 4.0}  # client 3's model would win with its claimed count
    raws = [RawReply(ins.client_id, [np.full(4, values[ins.client_id], np.float32)], ["w"], counts[ins.client_id], {})
            for ins in plan]
    batch = server.receive(raws)
    model = server.aggregate(1, batch.accepted)
    weights = np.array([100, 200, 200_000], float)  # 1000 × the median, 200
    expected = (weights * [1.0, 1.5, 4.0]).sum() / weights.sum()
    np.testing.assert_allclose(model.numpy(), np.full(4, expected), rtol=1e-6)


def test_an_exploding_attention_temperature_fails_the_run(tmp_path):
    """sigma = 1e308 makes FedMCSA's attention overflow: every model sent is NaN, every update refused."""
    with pytest.raises(RunFailed, match="accepted no client update"):
        run_in_process({"method": "fedmcsa", "sigma": 1e308, "num-rounds": 4, "clients-per-round": 4, "local-steps": 2,
                        "output-dir": str(tmp_path)}, num_clients=4)


def test_the_weight_book_by_hand():
    """A claim never grows past the client's first count; newcomers are capped at ratio × the lower median
    of every first claim seen (this round's included), which colluders in one round cannot raise."""
    book = WeightBook(ratio=10)
    assert book.count(["a", "b", "c"], [100, 200, 10**12]) == [100, 200, 2000]  # median of {100, 200, 1e12}: 200
    assert book.first == {"a": 100, "b": 200, "c": 2000}
    assert book.count(["a", "b", "c"], [150, 10**9, 2000]) == [100, 200, 2000]  # grown claims count their first
    honest = WeightBook(ratio=10)
    honest.count(["a", "b", "c"], [100, 200, 300])
    # two colluders join a round of three claiming 1e9: the round's median would be 1e9 (a cap of 1e10);
    # the median of all five first claims is 300
    assert honest.count(["a", "x", "y"], [100, 10**9, 10**9]) == [100, 3000, 3000]
    book.set_state(WeightBook().get_state())
    assert book.first == {}
    assert WeightBook(math.inf).count(["a"], [10**12]) == [10**12]


def test_an_honest_federation_is_counted_as_it_claims():
    """Synthetic(0.5, 0.5)'s 100 clients (up to ~130× apart in these seeds), 20 per round for 100 rounds:
    every count is the claim."""
    for seed in (0, 2):
        cfg = ExperimentConfig(seed=seed)
        sizes = [load_client_data(cfg, p, 100).num_train for p in range(100)]
        book, sampler = WeightBook(), Sampler(seed, {p: p for p in range(100)})
        for _ in range(100):
            ids = sampler.sample(list(range(100)), 20)
            assert book.count(ids, [sizes[i] for i in ids]) == [sizes[i] for i in ids]


@pytest.mark.parametrize("name", ["Ditto", "FedAttn", "PerFedAvg", "PFedMe", "APFL"])
def test_a_client_that_joined_honestly_cannot_outweigh_a_round_later_with_a_huge_claim(name):
    """Round 1: five clients train and claim their sizes; round 2: one claims 10^12. It counts its first
    claim, not 1000 × the median (which would be 99.6% of the round's weight)."""
    server = MethodServer(getattr(strategies.message, name)().method, clients_per_round=5, seed=0)
    names = list(twins_model().state_dict())
    server.initialize({k: t.detach().numpy() for k, t in twins_model().state_dict().items()})
    clients, sizes = Clients(), dict(zip(NODES, [100, 200, 300, 400, 500]))
    for server_round, claim in ((1, 500), (2, 10**12)):
        raws = []
        for ins in server.plan_training(server_round, NODES):
            trained, _, extras = clients.train(ins.client_id, server.to_arrays(ins.model), {**ins.config, **TRAINING})
            n = claim if ins.client_id == NODES[-1] else sizes[ins.client_id]
            raws.append(RawReply(ins.client_id, trained, names, n, {}, extras))
        batch = server.receive(raws)
        assert not batch.rejections and {r.client_id: r.num_examples for r in batch.accepted} == sizes
