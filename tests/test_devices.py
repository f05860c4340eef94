"""Every tensor a server or client algorithm makes on its own is made on the device of the tensors it
works on. A tensor made on the default device (the CPU) where the models live on a GPU stops a run:
HeurFedAMP's ``torch.eye(m)`` once did, in round 1 on CUDA. This needs no GPU: while the algorithms
run, a ``TorchFunctionMode`` records every factory call (``torch.zeros``, ``torch.eye``, ...) that names
no device; each must be one the algorithm meant for the CPU (none are, on these paths)."""

from __future__ import annotations

import fabricate as fb
import pytest
import torch
from torch.overrides import TorchFunctionMode

from flower_pfl.engine.client_algorithm import LOCAL_STEPS, LR
from flower_pfl.engine.method_server import MethodServer
from flower_pfl.engine.server_algorithm import PersonalizedAlgorithm
from flower_pfl.experiment.config import ExperimentConfig
from flower_pfl.experiment.models import DNN
from flower_pfl.methods.registry import entries

FACTORIES = {torch.zeros, torch.ones, torch.full, torch.empty, torch.eye, torch.arange, torch.linspace, torch.tensor,
             torch.rand, torch.randn, torch.randint, torch.randperm, torch.as_tensor}


class DefaultDeviceFactories(TorchFunctionMode):
    """Records the factory calls that name no device (they would make their tensor on the default device)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in FACTORIES and kwargs.get("device") is None:
            self.calls.append(func.__name__)
        return func(*args, **kwargs)


def _method(e):
    return e.declaration(**e.arguments(ExperimentConfig().to_run_config()))


#: the methods whose server turns the stored models into the ones it sends (APPLE and FedFomo send stored models as they are)
PERSONALIZED = [e for e in entries() if not e.builtin and issubclass(e.declaration, PersonalizedAlgorithm)
                and e.declaration.personalize is not PersonalizedAlgorithm.personalize]


@pytest.mark.parametrize("entry", PERSONALIZED, ids=lambda e: e.label)
def test_a_personalized_server_makes_its_tensors_on_the_stores_device(entry):
    """``personalize``, the math over the participants' stored models (on the device a run gives the
    store): no factory call without a device."""
    server = MethodServer(_method(entry), clients_per_round=4, seed=1)
    server.initialize({k: v.detach().numpy() for k, v in DNN(6, 3, 5, batch_norm=fb.needs_bn(entry)).state_dict().items()})
    method, models = server.method, torch.randn(4, server.layout.dim)
    with DefaultDeviceFactories() as watch:
        method.personalize(models, server.layout)
        method.personalize(models[:1], server.layout)  # one participant: the special case HeurFedAMP's was
    assert not watch.calls, f"{entry.label}: {watch.calls} made on the default device"


BATCHABLE = sorted({_method(e).client_algorithm() for e in entries() if not e.builtin}, key=lambda a: a.__name__)


@pytest.mark.parametrize("algorithm", BATCHABLE, ids=lambda a: a.__name__)
def test_a_client_algorithms_step_makes_its_tensors_on_the_models_device(algorithm):
    """One SGD step's ``loss`` and ``gradients`` on a model: no factory call without a device."""
    from flwr.app import RecordDict

    from client_apps.own_loop import RecordState

    e = next(e for e in entries() if not e.builtin and _method(e).client_algorithm() is algorithm)
    server = MethodServer(_method(e), clients_per_round=1)
    server.initialize({k: v.detach().numpy() for k, v in DNN(6, 3, 5).state_dict().items()})
    config = {**server.plan_training(1, [1])[0].config, LR: 0.1, LOCAL_STEPS: 2, "batch-size": 4}
    model = DNN(6, 3, 5)
    step = algorithm(model, config, RecordState(RecordDict()))
    x, y = torch.randn(4, 6), torch.tensor([0, 1, 2, 0])
    params = [p for p in model.parameters() if p.requires_grad]
    with DefaultDeviceFactories() as watch:
        loss = step.loss(model(x), y)
        grads = torch.autograd.grad(loss, params)
        with torch.no_grad():
            step.gradients(params, list(grads), (x, y))
    assert not watch.calls, f"{algorithm.__name__}: {watch.calls} made on the default device"
