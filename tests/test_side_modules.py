"""Side modules (``flower_pfl.engine.side_modules``): sized from the model's last layer, built from a seed
without touching the global random state, carried as bytes both ways, checked, bounded, averaged and
saved with the server's state; the methods built on them run a round with the CNN too."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from flower_pfl.engine.client_algorithm import LR, TrainData, train_locally
from flower_pfl.engine.layout import ParamLayout, flatten_module, load_flat_
from flower_pfl.engine.method_server import MethodServer
from flower_pfl.engine.reply_checks import AlgorithmOutputMissing, RawReply, Reply
from flower_pfl.engine.side_modules import SideModules, built, head_shape, received_modules, reply_entry
from flower_pfl.engine.wire import encode_vector
from flower_pfl.experiment.models import DNN, ConvNet
from flower_pfl.methods.fedcp import FedCP
from flower_pfl.methods.registry import client_algorithm_for, entry


def _build(features: int, classes: int) -> nn.ModuleDict:
    return nn.ModuleDict({"a": nn.Linear(features, 2), "b": nn.Embedding(classes, 1)})


def _side() -> SideModules:
    side = SideModules(_build, "x-modules", "x-local-modules", "XClient")
    side.setup(ParamLayout.from_module(DNN(6, 3, hidden=4)), seed=1)
    return side


def test_the_modules_are_sized_by_the_models_last_linear_layer_and_seeded():
    assert head_shape(ParamLayout.from_module(DNN(6, 3, hidden=4))) == (4, 3)  # fc2: (3, 4)
    with pytest.raises(ValueError, match="last layer is linear"):
        head_shape(ParamLayout.from_arrays({"w": torch.zeros(3)}))
    torch.manual_seed(5)
    before = torch.rand(1)
    torch.manual_seed(5)
    a, b = built(_build, 4, 3, seed=1), built(_build, 4, 3, seed=1)
    assert torch.rand(1) == before  # the global random state is as it was
    assert torch.equal(flatten_module(a), flatten_module(b)) and not torch.equal(flatten_module(a), flatten_module(built(_build, 4, 3, seed=2)))
    assert _side().dim == 4 * 2 + 2 + 3 * 1


def test_a_client_receives_the_servers_values_and_returns_its_own():
    side, model = _side(), DNN(6, 3, hidden=4)
    modules = received_modules(_build, model, side.settings(), "x-modules", "X")
    assert torch.equal(flatten_module(modules), side.vector)
    with torch.no_grad():
        modules["a"].bias.fill_(7.0)
    assert torch.equal(side.check(reply_entry(modules, "x-local-modules")), flatten_module(modules))
    with pytest.raises(ValueError, match="'x-modules'"):
        received_modules(_build, model, {}, "x-modules", "X")


def test_replies_are_checked_bounded_averaged_and_the_state_round_trips():
    side = _side()
    with pytest.raises(AlgorithmOutputMissing, match="lacks 'x-local-modules'"):
        side.check({})
    with pytest.raises(ValueError, match="expected 13 float32 values"):
        side.check({"x-local-modules": encode_vector(torch.zeros(4))})
    with pytest.raises(ValueError, match="NaN or Inf"):
        side.check({"x-local-modules": encode_vector(torch.full((13,), float("nan")))})
    moved = side.vector + torch.tensor([3.0, 4.0] + [0.0] * 11)
    assert side.change(moved) == {"x-local-modules": (pytest.approx(5.0), 0.0)}  # against the round's median
    example = side.check(side.example(torch.Generator().manual_seed(0)))
    assert 0 < float((example - side.vector).norm()) < 1
    saved = side.get_state()
    side.aggregate([torch.ones(13), torch.full((13,), 4.0)], [1, 2])
    assert torch.allclose(side.vector, torch.full((13,), 3.0))
    side.set_state(saved)
    assert torch.equal(side.vector, saved)


def test_a_server_algorithm_with_side_modules_averages_them_after_the_model():

    method = FedCP()  # a method built on side modules
    model = DNN(6, 3, hidden=4)
    layout = ParamLayout.from_module(model)
    method.setup(layout, flatten_module(model), torch.device("cpu"), seed=0)
    v = method.side.vector
    replies = [Reply(i, flatten_module(model), n, {}, v + i) for i, n in ((1, 10), (2, 30))]
    norms = method.update_norms(replies[0], flatten_module(model))
    assert norms["fedcp-local-modules"] == (pytest.approx(float(torch.ones_like(v).norm()), rel=1e-5), 0.0) and "model" in norms
    method.aggregate(1, replies)
    assert torch.allclose(method.side.vector, v + (1 * 10 + 2 * 30) / 40)


@pytest.mark.parametrize("method", ["fedcp", "gpfl"])
def test_the_methods_built_on_side_modules_run_a_round_with_the_cnn(method):
    torch.manual_seed(0)
    make = lambda: ConvNet((1, 16, 16), 3, channels=(2, 3), hidden=(8,))
    initial = {k: v.numpy() for k, v in make().state_dict().items()}
    server = MethodServer(entry(method).declaration(), clients_per_round=2)
    server.initialize(initial)
    replies = []
    for ins in server.plan_training(1, [1, 2]):
        model = make()
        load_flat_(model, ins.model)
        config = {**ins.config, LR: 0.05}
        data = TrainData(torch.randn(12, 1, 16, 16), torch.tensor([0, 1, 2] * 4))
        _, extras = train_locally(client_algorithm_for(config)(model, config, {}), model, data, steps=2, lr=0.05,
                                  batch_size=4, generator=torch.Generator().manual_seed(ins.client_id))
        replies.append(server.check(RawReply(ins.client_id, [t.numpy() for t in model.state_dict().values()], None, 12, {}, extras)))
    before = server.method.side.vector.clone()
    server.aggregate(1, replies)
    assert server.method.side.dim == len(before) > 0 and not torch.equal(server.method.side.vector, before)
    assert server.method.side.vector.isfinite().all()
