"""One method, one place: everything that knows about methods reads the registry."""

from __future__ import annotations

import ast
import inspect
import json
from pathlib import Path

import pytest
import torch

import strategies
import strategies.message
from flower_pfl.engine.client_algorithm import CLIENT_ALGORITHM, ClientAlgorithm, Proximal
from flower_pfl.engine.method_server import MethodServer
from flower_pfl.engine.params import param_specs
from flower_pfl.experiment.models import DNN
from flower_pfl.methods.registry import (
    UnknownClientAlgorithm,
    client_algorithm_for,
    client_algorithms,
    entries,
    method_classes,
    methods,
)

ROOT = Path(__file__).resolve().parents[1]
RECORDED = json.loads((ROOT / "tests" / "methods" / "recorded.json").read_text())


@pytest.mark.parametrize("entry", entries(), ids=[e.label for e in entries()])
def test_every_entry_has_both_twins_a_test_file_and_a_recorded_run(entry):
    assert hasattr(strategies, entry.strategy) and hasattr(strategies.message, entry.strategy)
    assert entry.label in RECORDED
    if not entry.builtin:
        module = entry.declaration.__module__.rsplit(".", 1)[1]
        tests = ROOT / "tests" / "methods" / f"test_{module}.py"
        assert tests.exists() or entry.aggregation != "default", f"{entry.label} has no {tests.name}"


@pytest.mark.parametrize("method", method_classes(), ids=[m.name for m in method_classes()])
@pytest.mark.parametrize("twin", [strategies, strategies.message], ids=["legacy", "message"])
def test_constructors_are_typed_documented_and_strict(method, twin):
    cls = getattr(twin, method.strategy)
    signature = inspect.signature(cls)
    assert not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in signature.parameters.values())
    for spec in param_specs(method):
        parameter = signature.parameters[spec.name]
        assert parameter.default == spec.default and parameter.annotation is not inspect.Parameter.empty
        assert f"{spec.name} :" in cls.__doc__ and (spec.key is None or f"``{spec.key}``" in cls.__doc__)
    assert signature.parameters["clients_per_round"].default == method.default_clients_per_round
    with pytest.raises(TypeError):
        cls(no_such_argument=1)
    assert cls().method == method()  # the declared defaults


def test_a_bad_value_names_the_argument():
    with pytest.raises(ValueError, match="FedMCSA: sigma = -1.0 is invalid: must be a number > 0"):
        strategies.message.FedMCSA(sigma=-1.0)
    with pytest.raises(ValueError, match="IGFL: attention = 'all'"):
        strategies.IGFL(attention="all")


def test_an_instruction_names_its_client_algorithm_and_the_client_finds_it():
    known = client_algorithms()
    assert {"sgd", "proximal", "anchored-proximal"} <= set(known) and all(a.name == name for name, a in known.items())
    for name, algorithm in known.items():
        assert client_algorithm_for({CLIENT_ALGORITHM: name, "proximal-mu": 0.0}) is algorithm  # the name decides
    for cls in method_classes():  # what each method's instructions name, the client finds
        assert client_algorithm_for({CLIENT_ALGORITHM: cls().client_algorithm().name}) is cls().client_algorithm()
        if cls.client.__module__ == cls.__module__:  # a method's own client algorithm carries the method's name
            assert cls.client.name == cls.name


def test_only_flowers_own_instructions_are_read_by_their_keys():
    """Flower's FedProx names no client algorithm: its ``proximal-mu`` asks for the proximal term."""
    assert client_algorithm_for({"proximal-mu": 0.5}) is Proximal and client_algorithm_for({"proximal_mu": 0.5}) is Proximal
    assert client_algorithm_for({"proximal-mu": 0.0}) is ClientAlgorithm and client_algorithm_for({}) is ClientAlgorithm
    assert client_algorithm_for({"moon-mu": 1.0, "scaffold-control": b""}) is ClientAlgorithm  # no key sniffing beyond it


def test_an_unknown_client_algorithm_is_refused_naming_it_and_what_to_install():
    with pytest.raises(UnknownClientAlgorithm, match=r"method \('fednext'\) asks this client to run its client algorithm 'fednext'"
                                                     r".*install the flower-pfl release the server runs"):
        client_algorithm_for({CLIENT_ALGORITHM: "fednext"})


def test_no_module_outside_the_methods_lists_method_names():
    names = set(methods())
    for path in ["flower_pfl/experiment/config.py", "server_apps/factory.py", "server_apps/app.py", "client_apps/app.py",
                 "client_apps/own_loop.py", "strategies/__init__.py", "strategies/message/__init__.py"]:
        tree = ast.parse((ROOT / path).read_text())
        listed = {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and n.value in names}
        assert listed <= {"fedmcsa"}, (path, listed)  # the run config's default method may be named


@pytest.mark.parametrize("method", [m for m in method_classes() if m.client.reply_keys], ids=lambda m: m.name)
def test_a_methods_example_extras_are_what_its_client_returns_and_pass_its_checks(method):
    """``example_extras`` (what benchmarks fabricate replies with) holds the client algorithm's reply keys, valid for ``check_extras``."""
    server = MethodServer(method(), clients_per_round=2)
    server.initialize({k: v.numpy() for k, v in DNN(6, 3, hidden=4).state_dict().items()})
    example = server.method.example_extras(torch.Generator().manual_seed(0))
    assert set(example) == set(method.client.reply_keys)
    server.method.check_extras(example)
