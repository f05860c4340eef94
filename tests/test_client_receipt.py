"""A client algorithm's receipt: every algorithm a training instruction names says in ``finish``'s
extras that it ran (``client-algorithm`` = its name), and a strategy whose clients ignored it (a
plain-SGD ClientApp) says so once per run, naming the algorithm, what the method becomes and the fix.
Replies of the real algorithms (a user's loop with ``algorithm_for``, or the package's loop) raise nothing."""

from __future__ import annotations

import fabricate as fb
import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord
from flwr.common import parameters_to_ndarrays
from test_twins import NODES, Clients, _data, _model

import strategies
import strategies.message
from client_apps.own_loop import algorithm_for
from flower_pfl.engine.client_algorithm import BATCH_SIZE, CLIENT_ALGORITHM, LOCAL_STEPS, LR, PROXIMAL_MU, ClientAlgorithm, Proximal
from flower_pfl.engine.method_server import MethodServer
from flower_pfl.methods.igfl import IGFLCorrection
from flower_pfl.methods.registry import client_algorithm_for, method_classes

TRAINING = {LR: 0.01, LOCAL_STEPS: 3, BATCH_SIZE: 4}
#: methods whose client algorithm is more than plain SGD
ASKING = [cls for cls in method_classes() if cls.client is not ClientAlgorithm]


def _instruction_config(method_cls) -> dict:
    """A real training instruction of the method (its first round), with the training settings."""
    server = MethodServer(method_cls(), 1)
    server.initialize({k: v.numpy() for k, v in _model().state_dict().items()})
    return {**TRAINING, **server.plan_training(1, [NODES[0]])[0].config}


def _load(arrays: list[np.ndarray]) -> torch.nn.Module:
    model = _model()
    with torch.no_grad():
        for p, a in zip(model.state_dict().values(), arrays):
            p.copy_(torch.as_tensor(a))
    return model


def _user_loop(model, algorithm, node: int, config: dict) -> dict:
    data = _data(node)
    return fb.user_loop(model, algorithm, data.x, data.y, lr=config[LR], batch_size=config[BATCH_SIZE],
                        steps=config[LOCAL_STEPS], seed=node)


# ---------------------------------------------------------------- the receipt on the client

@pytest.mark.parametrize("method_cls", [c for c in ASKING if c.client.hookable], ids=lambda c: c.__name__)
def test_a_users_loop_returns_the_receipt_of_the_algorithm_the_instruction_names(method_cls):
    config = _instruction_config(method_cls)
    model = _model()
    algorithm = algorithm_for(config, model, {})
    assert type(algorithm) is method_cls().client_algorithm()  # FedMCSA without all-clients-train: Proximal
    assert issubclass(method_cls.client, type(algorithm))  # the method's own, or the base of it its settings call for
    extras = _user_loop(model, algorithm, NODES[0], config)
    assert extras[CLIENT_ALGORITHM] == config[CLIENT_ALGORITHM] == type(algorithm).name  # the name the instruction gave
    assert set(extras) == {CLIENT_ALGORITHM, *method_cls.client.reply_keys}  # the algorithm's own bytes beside it, nothing else


@pytest.mark.parametrize("method_cls", [c for c in ASKING if not c.client.hookable], ids=lambda c: c.__name__)
def test_the_package_loop_returns_the_receipt_of_algorithms_that_are_not_hooks(method_cls):
    config = _instruction_config(method_cls)
    _, _, extras = Clients().train(NODES[0], [a.numpy() for a in _model().state_dict().values()], config)
    assert extras[CLIENT_ALGORITHM] == config[CLIENT_ALGORITHM] == method_cls.client.name
    assert set(extras) == {CLIENT_ALGORITHM, *method_cls.client.reply_keys}


def test_plain_sgd_returns_no_receipt_and_flowers_fedprox_instruction_gets_the_proximal_ones():
    model = _model()
    assert ClientAlgorithm.receipt() is None and _user_loop(model, algorithm_for(TRAINING, model), NODES[0], TRAINING) == {}
    config = {**TRAINING, PROXIMAL_MU: 0.5}  # Flower's FedProx names no algorithm: its key asks for the proximal term
    assert _user_loop(model, algorithm_for(config, model), NODES[0], config) == {CLIENT_ALGORITHM: "proximal"}
    assert Proximal.receipt() == "proximal" and IGFLCorrection.receipt() == "igfl"


# ---------------------------------------------------------------- the server notices

class Users:
    """Each node's own ClientApp: ``plain`` trains with plain SGD and ignores the config (nodes in
    ``plain``; all of them by default), the others run ``algorithm_for`` in the same loop, or
    the package's loop where the algorithm is not a hook."""

    def __init__(self, plain: set[int] | None = None) -> None:
        self.plain = set(NODES) if plain is None else plain
        self.package = Clients()
        self.states: dict[int, dict] = {n: {} for n in NODES}

    def train(self, node: int, arrays: list[np.ndarray], config: dict) -> tuple[list[np.ndarray], int, dict]:
        model = _load(arrays)
        if node in self.plain:
            algorithm: ClientAlgorithm = ClientAlgorithm(model, config)
        elif client_algorithm_for(config).hookable:
            algorithm = algorithm_for(config, model, self.states[node])
        else:
            return self.package.train(node, arrays, config)
        extras = _user_loop(model, algorithm, node, config)
        return [t.detach().numpy().copy() for t in model.state_dict().values()], 10 + node, extras


def _strategy(api: str, name: str, **args):
    initial = {k: v.numpy() for k, v in _model().state_dict().items()}
    if api == "message":
        return getattr(strategies.message, name)(clients_per_round=3, min_available_nodes=1, seed=3, **args), initial
    return getattr(strategies, name)(initial_parameters=initial, clients_per_round=3, min_available_clients=1, seed=3,
                                     on_fit_config_fn=lambda _: dict(TRAINING), **args), initial


def _rounds(api: str, strategy, initial: dict, users: Users, rounds: int = 3) -> None:
    """Drive ``rounds`` training rounds in one API with the users' replies; every reply is accepted."""
    fb.set_task_identity()
    names = list(initial)
    arrays, params = ArrayRecord({k: torch.as_tensor(v) for k, v in initial.items()}), getattr(strategy, "initial_parameters", None)
    for rnd in range(1, rounds + 1):
        if api == "message":
            msgs = list(strategy.configure_train(rnd, arrays, ConfigRecord(dict(TRAINING)), fb.FakeGrid(NODES)))
            replies = []
            for m in msgs:
                trained, n, extras = users.train(m.metadata.dst_node_id, [a.numpy() for a in m.content["arrays"].values()],
                                                 dict(m.content["config"]))
                replies.append(fb.train_reply(m, dict(zip(names, trained)), n, extras=extras or None))
            new, metrics = strategy.aggregate_train(rnd, replies)
            arrays = arrays if new is None else new
        else:
            fit = strategy.configure_fit(rnd, params, fb.client_manager([str(n) for n in NODES]))
            results = [(proxy, fb.fit_res(*users.train(int(proxy.cid), parameters_to_ndarrays(ins.parameters), dict(ins.config))))
                       for proxy, ins in fit]
            new, metrics = strategy.aggregate_fit(rnd, results, [])
            params = params if new is None else new
        assert metrics["clients-accepted"] == 3 and metrics["clients-rejected"] == 0


def _receipt_warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if f"'{CLIENT_ALGORITHM}'" in r.getMessage()]


CASES = [  # strategy, constructor arguments, client algorithm, its name, what the method becomes, the fix
    ("FedMCSA", {}, "Proximal", "proximal", "runs without its proximal term λ (eq. 9), i.e. as FedAvg+MCSA", "algorithm_for"),
    ("FedAMP", {}, "Proximal", "proximal", "runs without its proximal term toward the cloud model u_i",
     "algorithm_for"),
    ("IGFL", {}, "IGFLCorrection", "igfl", "runs as IGFL-S (server attention only", "algorithm_for"),
    ("IGFL", {"attention": None}, "IGFLCorrection", "igfl", "runs as FedAvg (no IGFL-C client correction", "algorithm_for"),
    ("PFedMe", {}, "PFedMeClient", "pfedme", "runs as FedAvg with server mixing β", "algorithm_for"),
    ("Ditto", {}, "DittoClient", "ditto", "runs as FedAvg: no personal model", "package's ClientApp (clientapp = \"client_apps.app:app\""),
]


@pytest.mark.parametrize("api", ["message", "legacy"])
@pytest.mark.parametrize("name,args,algorithm,key,consequence,fix", CASES, ids=[f"{c[0]}{c[1] or ''}" for c in CASES])
def test_clients_that_ignore_the_algorithm_are_warned_about_once_and_real_ones_not_at_all(api, name, args, algorithm, key,
                                                                                          consequence, fix, caplog):
    strategy, initial = _strategy(api, name, **args)
    _rounds(api, strategy, initial, Users())
    (warning,) = _receipt_warnings(caplog)  # three rounds of plain clients: one warning
    assert f"{name}: round 1: 3 of 3 clients" in warning
    for text in (f"client algorithm {algorithm}", f"'{CLIENT_ALGORITHM}' = '{key}'", f"{name} then {consequence}", fix,
                 "Using a strategy in your own Flower app"):
        assert text in warning, text
    caplog.clear()
    strategy, initial = _strategy(api, name, **args)
    _rounds(api, strategy, initial, Users(plain=set()))
    assert not _receipt_warnings(caplog)


@pytest.mark.parametrize("api", ["message", "legacy"])
def test_one_client_that_ignores_the_step_is_counted(api, caplog):
    strategy, initial = _strategy(api, "FedMCSA")
    _rounds(api, strategy, initial, Users(plain={NODES[0]}), rounds=4)
    warnings = _receipt_warnings(caplog)
    assert len(warnings) == 1 and "1 of 3 clients" in warnings[0]


@pytest.mark.parametrize("api", ["message", "legacy"])
@pytest.mark.parametrize("name,args", [("IGFL", {"client_correction": False}), ("FedMCSA", {"lam": 0.0}), ("FedACS", {})])
def test_instructions_that_name_plain_sgd_expect_no_receipt(api, name, args, caplog):
    """IGFL-S and FedAvg+MCSA (λ = 0) name plain SGD: any client runs it."""
    strategy, initial = _strategy(api, name, **args)
    _rounds(api, strategy, initial, Users())
    assert not _receipt_warnings(caplog)


@pytest.mark.parametrize("api", ["message", "legacy"])
@pytest.mark.parametrize("name", ["SCAFFOLD", "FedAttn"])
def test_algorithms_whose_replies_show_they_ran_need_no_receipt(api, name, caplog):
    """SCAFFOLD's Δc_i and FedAttn's Z_i already show the algorithm ran (their absence is AlgorithmOutputMissing's
    warning): a hand-written client that returns them without the receipt is not warned about."""

    class WithoutReceipt(Users):
        def train(self, node, arrays, config):
            trained, n, extras = super().train(node, arrays, config)
            assert extras.pop(CLIENT_ALGORITHM) == client_algorithm_for(config).receipt()
            return trained, n, extras

    strategy, initial = _strategy(api, name)
    _rounds(api, strategy, initial, WithoutReceipt(plain=set()))
    assert not _receipt_warnings(caplog) and not [r for r in caplog.records if "does not run it" in r.getMessage()]


@pytest.mark.parametrize("api", ["message", "legacy"])
@pytest.mark.parametrize("receipt", ["proximal", b"igfl", 1.0], ids=["another-algorithm", "bytes", "number"])
def test_a_receipt_of_another_algorithm_or_not_a_str_counts_as_ignoring_the_one_named(api, receipt, caplog):
    class Confused(Users):
        def train(self, node, arrays, config):
            trained, n, extras = super().train(node, arrays, config)
            return trained, n, {**extras, CLIENT_ALGORITHM: receipt}  # e.g. it ran the proximal term instead of IGFL-C

    strategy, initial = _strategy(api, "IGFL")
    _rounds(api, strategy, initial, Confused(plain=set()), rounds=2)
    (warning,) = _receipt_warnings(caplog)
    assert "3 of 3 clients" in warning and "IGFLCorrection" in warning


@pytest.mark.parametrize("api", ["message", "legacy"])
def test_the_package_apps_send_the_receipt(api, tmp_path, caplog):
    """The package's ServerApp and ClientApp (in one process): every method's clients run its algorithm."""
    from server_apps.inprocess import run_in_process

    for method in ("fedmcsa", "igfl", "ditto"):
        run_in_process({"num-rounds": 2, "clients-per-round": 3, "local-steps": 2, "eval-every": 2, "seed": 0, "method": method,
                        "api": api, "output-dir": str(tmp_path)}, num_clients=4)
    assert not _receipt_warnings(caplog)
