"""pFedMe: the client's inner and outer steps by hand, β mixing, PM and GM both reported."""

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, RecordDict

import fabricate as fb
import strategies.message
from client_apps.app import PFEDME_STATE, Node
from flower_pfl.config import ExperimentConfig
from flower_pfl.methods.pfedme import pfedme_local_sgd
from flower_pfl.models import MLR
from flower_pfl.solvers import MinibatchStream
from strategies.metrics import personalized_evaluate_metrics_legacy


def test_client_steps_by_hand():
    x = torch.randn(32, 3, generator=torch.Generator().manual_seed(0))
    y = (x[:, 0] > 0).long()
    torch.manual_seed(0)
    model, ref = MLR(3, 2), MLR(3, 2)
    ref.load_state_dict(model.state_dict())
    _, theta = pfedme_local_sgd(model, x, y, steps=2, lr=0.1, batch_size=8, generator=torch.Generator().manual_seed(3),
                                lam=4.0, personal_lr=0.05, inner_steps=3)
    w = [p.detach().clone() for p in ref.parameters()]
    th = [p.clone() for p in w]
    stream = MinibatchStream(32, 8, torch.Generator().manual_seed(3))
    for _ in range(2):
        idx = stream.next()
        for _ in range(3):  # K steps on f(θ; D) + λ/2 ||θ − w||², no other term
            with torch.no_grad():
                for p, t in zip(ref.parameters(), th):
                    p.copy_(t)
            g = torch.autograd.grad(torch.nn.functional.cross_entropy(ref(x[idx]), y[idx]), list(ref.parameters()))
            th = [t - 0.05 * (gi + 4.0 * (t - wi)) for t, gi, wi in zip(th, g, w)]
        pull = [4.0 * (wi - t) for wi, t in zip(w, th)]
        assert all(p.abs().sum() > 0 for p in pull)  # the regularizer really moves w
        w = [wi - 0.1 * p for wi, p in zip(w, pull)]  # w <- w − η λ (w − θ)
    for a, b in zip(model.parameters(), w):
        assert torch.allclose(a, b, atol=1e-6)
    for a, b in zip(theta, th):
        assert torch.allclose(a, b, atol=1e-6)


def test_server_mixes_with_beta():
    fb.set_task_identity()
    grid = fb.FakeGrid([1, 2])
    strat = strategies.message.PFedMe(beta=0.5, fraction_train=1.0, min_train_nodes=2, min_available_nodes=2)
    arrays = ArrayRecord({"fc.weight": fb.Array(np.zeros((2, 3), np.float32)), "fc.bias": fb.Array(np.zeros(2, np.float32))})
    msgs = list(strat.configure_train(1, arrays, ConfigRecord({"lr": 0.1}), grid))
    assert all(m.content["config"]["pfedme-inner-steps"] == 5 for m in msgs)
    replies = [fb.train_reply(m, {"fc.weight": np.full((2, 3), 4.0, np.float32), "fc.bias": np.full(2, 2.0, np.float32)}) for m in msgs]
    new, _ = strat.aggregate_train(1, replies)
    assert np.allclose(new["fc.weight"].numpy(), 2.0) and np.allclose(new["fc.bias"].numpy(), 1.0)  # (1 − β)·0 + β·mean
    assert all(m.content["config"]["pfedme-pm-gm"] is True for m in strat.configure_evaluate(1, new, ConfigRecord(), grid))


def test_client_reports_pm_and_gm_and_they_aggregate():
    state = RecordDict()
    context = Context(run_id=1, node_id=3, node_config={"partition-id": 0, "num-partitions": 4}, state=state,
                      run_config=ExperimentConfig().to_run_config())
    node = Node.from_context(context)
    received = [v.clone() for v in node.model.state_dict().values()]
    before = node.evaluate({"pfedme-pm-gm": True})
    assert before["accuracy"] == before["global-accuracy"]  # no θ yet: PM is the global model
    node.fit({"lr": 0.05, "local-steps": 5, "batch-size": 20, "server-round": 1, "pfedme-lambda": 15.0,
              "pfedme-personal-lr": 0.05, "pfedme-inner-steps": 3})
    assert PFEDME_STATE in state
    node.load(received)
    after = node.evaluate({"pfedme-pm-gm": True})
    assert after["global-accuracy"] == before["global-accuracy"] and after["loss"] != before["loss"]
    agg = personalized_evaluate_metrics_legacy([(10, {"accuracy": 0.8, "global-accuracy": 0.5, "loss": 1.0}),
                                                (30, {"accuracy": 0.6, "global-accuracy": 0.3, "loss": 1.0})])
    assert np.isclose(agg["global_accuracy"], 0.4) and np.isclose(agg["global_accuracy_weighted"], 0.35)


def test_mechanism_transfer_variants_are_fedmcsa_with_the_methods_client_rule():
    """FedMCSA's Table 2: FedAvg+MCSA and pFedMe+MCSA by run config, not by new classes."""
    import pytest

    from flower_pfl.config import ConfigError
    from server_apps.factory import build_message_strategy

    fb.set_task_identity()
    fedavg = build_message_strategy(ExperimentConfig(method="fedavg", aggregation="mcsa"), 4)
    assert type(fedavg).__name__ == "FedMCSA" and fedavg.rule.client_config() == {"proximal-mu": 0.0}
    pfedme = build_message_strategy(ExperimentConfig(method="pfedme", aggregation="mcsa", pfedme_lambda=9.0), 4)
    assert type(pfedme).__name__ == "FedMCSA" and pfedme.rule.client_config() == {
        "pfedme-lambda": 9.0, "pfedme-personal-lr": 0.01, "pfedme-inner-steps": 5}
    arrays = ArrayRecord({"fc.weight": fb.Array(np.zeros((2, 3), np.float32)), "fc.bias": fb.Array(np.zeros(2, np.float32))})
    msgs = list(pfedme.configure_evaluate(1, arrays, ConfigRecord(), fb.FakeGrid([1, 2, 3, 4])))
    assert all(m.content["config"]["pfedme-pm-gm"] is True for m in msgs)  # the client reports θ_i
    with pytest.raises(ConfigError, match="'aggregation'"):
        ExperimentConfig.from_mapping({"method": "fedacs", "aggregation": "mcsa"})
    ablation = build_message_strategy(ExperimentConfig(method="fedmcsa", aggregation="mean", lam=5.0), 4)
    assert type(ablation).__name__ == "FedProx" and ablation.proximal_mu == 5.0  # FedMCSA^-MCSA
    with pytest.raises(ConfigError, match="'aggregation'"):
        ExperimentConfig.from_mapping({"method": "fedavg", "aggregation": "mean"})
