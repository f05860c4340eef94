"""FedCAC (Wu et al. 2023): the critical-parameter masks, the overlaps and the collaboration threshold by
hand, the server's customized and global models with fabricated replies (and what it refuses), the
client in a user's loop and in the package's, and a short run (τ = 0 is FedAvg)."""

from __future__ import annotations

import math

import fabricate as fb
import pytest
import torch
from floats import same_math

from client_apps.own_loop import algorithm_for
from flower_pfl.engine.client_algorithm import CLIENT_ALGORITHM, LR, TrainData, train_locally
from flower_pfl.engine.layout import ParamLayout, flatten_module
from flower_pfl.engine.method_server import MethodServer
from flower_pfl.engine.reply_checks import RawReply, UpdateRejected
from flower_pfl.engine.wire import encode_vector
from flower_pfl.experiment.models import DNN, MLR
from flower_pfl.methods.fedcac import (
    CRITICAL,
    TAU,
    FedCAC,
    FedCACClient,
    collaborators,
    critical_mask,
    decode_mask,
    encode_mask,
    overlap_rates,
)

from .runs import assert_as_recorded, short_run

D = 3 * 2 + 2  # MLR(3, 2)


def test_a_layers_critical_parameters_are_its_top_tau_by_sensitivity():
    start, end = torch.tensor([1.0, 1.0, 1.0, 1.0]), torch.tensor([2.0, 0.5, 1.0, -1.0])
    # |θ (θ − θ0)| = 2, 0.25, 0, 2: the top half is the two of sensitivity 2
    assert critical_mask(start, end, 0.5).tolist() == [True, False, False, True]
    assert critical_mask(start, end, 0.75).tolist() == [True, True, False, True]
    assert critical_mask(start, end, 0.2).tolist() == [False] * 4  # ⌊0.2 · 4⌋ = 0
    tiny = torch.tensor([1.0, 1.0 + 1e-6, 1.0, 1.0])  # the 3rd largest is 0: every parameter that moved
    assert critical_mask(start, tiny, 0.75).tolist() == [False, True, False, False]
    assert critical_mask(start, start, 0.75).tolist() == [False] * 4  # nothing moved: nothing is critical


def test_masks_travel_as_zeros_and_ones_and_other_values_are_refused():
    mask = torch.tensor([True, False, True])
    data = encode_mask(mask)
    assert data == encode_vector(torch.tensor([1.0, 0.0, 1.0])) and torch.equal(decode_mask(data, 3), mask)
    with pytest.raises(ValueError, match="expected 3 float32 values"):
        decode_mask(data[:8], 3)
    with pytest.raises(ValueError, match="NaN"):
        decode_mask(encode_vector(torch.tensor([1.0, math.nan, 0.0])), 3)
    with pytest.raises(ValueError, match="not a 0/1 mask"):
        decode_mask(encode_vector(torch.tensor([1.0, 0.5, 0.0])), 3)


def test_overlaps_and_the_rising_threshold_by_hand():
    masks = torch.tensor([[1, 1, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [0, 0, 0, 0]], dtype=torch.bool)
    o = overlap_rates(masks)
    # o_01 = 1 − 0 / 4, o_02 = 1 − 2 / 4, o_20 = 1 − 2 / 4; a client without critical parameters overlaps 0
    assert o[0, 1] == 1 and o[0, 2] == 0.5 and o[2, 0] == 0.5 and o[1, 2] == 0.5 and o[3].eq(0).all()
    o3 = overlap_rates(masks[:3])
    pairs = [1.0, 0.5, 1.0, 0.5, 0.5, 0.5]  # mean 2/3, max 1
    assert o3[~torch.eye(3, dtype=torch.bool)].tolist() == pairs
    # round 1 of β = 2: threshold 2/3 + 1/2 · 1/3 = 5/6: 0 and 1 collaborate, 2 alone
    assert collaborators(o3, 1, 2).tolist() == [[True, True, False], [True, True, False], [False, False, True]]
    assert collaborators(o3, 10, 1).tolist() == torch.eye(3, dtype=torch.bool).tolist()  # threshold above the max
    assert collaborators(o3[:1, :1], 1, 5).tolist() == [[True]]


def _arrays(values: list[float]) -> dict:
    return {"fc.weight": torch.tensor(values[:6]).view(2, 3).numpy(), "fc.bias": torch.tensor(values[6:]).numpy()}


def _server(beta: int = 2, tau: float = 0.5) -> MethodServer:
    server = MethodServer(FedCAC(tau=tau, beta=beta), clients_per_round=3, seed=0)
    server.initialize(_arrays([0.0] * D))
    return server


def _mask(bits: str) -> bytes:
    return encode_mask(torch.tensor([b == "1" for b in bits]))


def test_the_server_mixes_customized_critical_and_global_parameters_by_hand():
    server = _server(beta=2)
    plan = server.plan_training(1, [1, 2, 3])
    assert all(ins.config == {CLIENT_ALGORITHM: "fedcac", TAU: 0.5} for ins in plan)
    assert all(torch.equal(ins.model, torch.zeros(D)) for ins in plan)  # no mask yet: the global model
    models = {1: [1.0] * D, 2: [2.0] * D, 3: [6.0] * D}
    masks = {1: "11000000", 2: "11000000", 3: "10100000"}  # the overlaps of the test above (padded): 1 and 2 collaborate
    replies = [server.check(RawReply(c, list(_arrays(models[c]).values()), None, n, {}, {CRITICAL: _mask(masks[c])}))
               for c, n in [(1, 10), (2, 10), (3, 20)]]
    server.aggregate(1, replies)
    fedavg = (10 * 1.0 + 10 * 2.0 + 20 * 6.0) / 40
    assert torch.allclose(server.method.global_model(), torch.full((D,), fedavg))
    evaluated = server.method.models_for_evaluation([1, 2, 3, 4])
    expected = torch.full((4, D), fedavg)
    expected[0, :2] = expected[1, :2] = 1.5  # critical parameters: the plain mean of clients 1 and 2
    expected[2, [0, 2]] = 6.0  # client 3 collaborates with nobody: its own
    assert torch.allclose(evaluated, expected)  # client 4 never trained: the global model
    again = {ins.client_id: ins.model for ins in server.plan_training(2, [1, 2, 3])}
    assert all(torch.allclose(again[c], expected[c - 1]) for c in (1, 2, 3))


def test_the_state_round_trips_and_replies_without_a_good_mask_are_refused():
    server = _server()
    plan = server.plan_training(1, [1, 2])
    replies = [server.check(RawReply(i.client_id, list(_arrays([float(i.client_id)] * D).values()), None, 10, {},
                                     {CRITICAL: _mask("1100000" + str(i.client_id % 2))})) for i in plan]
    server.aggregate(1, replies)
    copy = _server()
    copy.method.set_state(server.method.get_state())
    assert torch.equal(copy.method.models_for_evaluation([1, 2]), server.method.models_for_evaluation([1, 2]))
    assert copy.method.masks.keys() == server.method.masks.keys()
    with pytest.raises(UpdateRejected, match=CRITICAL):
        server.check(RawReply(1, list(_arrays([1.0] * D).values()), None, 10, {}, {}))
    with pytest.raises(UpdateRejected, match="0/1 mask"):
        server.check(RawReply(1, list(_arrays([1.0] * D).values()), None, 10, {}, {CRITICAL: encode_vector(torch.full((D,), 2.0))}))
    for bad in ({"tau": 1.5}, {"tau": -0.1}, {"beta": 0}, {"beta": 2.5}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            FedCAC(**bad)


def _data() -> TrainData:
    x = torch.randn(40, 3, generator=torch.Generator().manual_seed(0))
    return TrainData(x, (x[:, 0] > 0).long())


def _model() -> MLR:
    torch.manual_seed(4)
    return MLR(3, 2)


def test_the_client_trains_plain_sgd_then_sends_the_masks_of_its_layers():
    data, config = _data(), {CLIENT_ALGORITHM: "fedcac", TAU: 0.5, LR: 0.3}
    model = _model()
    received = [p.detach().clone() for p in model.parameters()]
    _, extras = train_locally(FedCACClient(model, config), model, data, steps=4, lr=0.3, batch_size=8,
                              generator=torch.Generator().manual_seed(1))
    by_hand = torch.cat([critical_mask(r, p.detach(), 0.5) for r, p in zip(received, model.parameters())])
    sent = decode_mask(extras[CRITICAL], D)
    assert torch.equal(sent, by_hand) and sent[:6].sum() == 3 and sent[6:].sum() == 1  # half of each layer
    assert extras[CLIENT_ALGORITHM] == "fedcac"
    # a user's own loop: the same model and mask
    theirs = _model()
    step = algorithm_for(config, theirs, None, torch.optim.SGD(theirs.parameters(), lr=0.3))
    their_extras = fb.user_loop(theirs, step, data.x, data.y, lr=0.3, batch_size=8, steps=4, seed=1)
    assert torch.allclose(flatten_module(theirs), flatten_module(model), atol=1e-6)
    assert their_extras[CRITICAL] == extras[CRITICAL]
    with pytest.raises(ValueError, match="fedcac-tau"):
        FedCACClient(_model(), {LR: 0.3})
    with pytest.raises(ValueError, match="tau"):
        FedCACClient(_model(), {TAU: 2.0, LR: 0.3})


def test_buffers_are_in_the_mask_and_never_critical():
    torch.manual_seed(0)
    model = DNN(3, 2, hidden=4, batch_norm=True)
    data = _data()
    _, extras = train_locally(FedCACClient(model, {TAU: 1.0, LR: 0.3}), model, data, steps=2, lr=0.3, batch_size=8,
                              generator=torch.Generator().manual_seed(1))
    layout = ParamLayout.from_module(model)
    mask = decode_mask(extras[CRITICAL], layout.dim)
    columns = dict(zip(layout.names, layout.tensor_slices()))
    assert mask[columns["fc2.weight"]].all()  # τ = 1: every parameter that moved
    assert not any(mask[columns[name]].any() for name in ("bn1.running_mean", "bn1.running_var", "bn1.num_batches_tracked"))


def test_short_run_as_recorded_and_without_critical_parameters_it_is_fedavg(short_runs, tmp_path):
    run, fedavg = short_runs("fedcac"), short_runs("fedavg")
    plain = short_run("fedcac", tmp_path, **{"fedcac-tau": 0.0})
    assert plain["train_loss"] == same_math(fedavg["train_loss"])
    assert plain["client_loss"] == same_math(fedavg["client_loss"])
    assert run["train_loss"] != pytest.approx(fedavg["train_loss"], rel=1e-3)  # the critical parameters change training
    assert_as_recorded("fedcac", run)
