"""Names renamed in this release still import for one release, each with a ``FutureWarning`` that
names its new place (``docs/changelog.md``), and give the very object of the new name."""

from __future__ import annotations

import importlib

import pytest
import torch

import client_apps.own_loop
import strategies
import strategies.message
from flower_pfl.engine import client_algorithm, reply_checks, server_algorithm

OLD_NAMES = [
    ("client_apps.rules", "step_for", client_apps.own_loop.algorithm_for),
    ("client_apps.rules", "RecordState", client_apps.own_loop.RecordState),
    ("flower_pfl.engine.client_step", "ClientStep", client_algorithm.ClientAlgorithm),
    ("flower_pfl.engine.client_step", "Proximal", client_algorithm.Proximal),
    ("flower_pfl.engine.server_step", "ServerStep", server_algorithm.ServerAlgorithm),
    ("flower_pfl.engine.server_step", "PersonalizedStep", server_algorithm.PersonalizedAlgorithm),
    ("flower_pfl.engine.server_step", "GlobalModelStep", server_algorithm.GlobalModelAlgorithm),
    ("flower_pfl.engine.reply_checks", "ClientStepNotRun", reply_checks.ClientAlgorithmNotRun),
    ("flower_pfl.engine.reply_checks", "StepOutputMissing", reply_checks.AlgorithmOutputMissing),
    ("strategies", "PersonalizedStrategy", strategies.LegacyMethodStrategy),
    ("strategies", "GlobalModelStrategy", strategies.LegacyMethodStrategy),
    ("strategies.message", "PersonalizedStrategy", strategies.message.MethodStrategy),
    ("strategies.message", "GlobalModelStrategy", strategies.message.MethodStrategy),
]


@pytest.mark.parametrize("module,name,new", OLD_NAMES, ids=[f"{m}.{n}" for m, n, _ in OLD_NAMES])
def test_an_old_name_imports_with_a_warning_naming_the_new_one(module, name, new):
    with pytest.warns(FutureWarning, match=rf"{module}\.{name} is now .*{new.__name__}"):
        assert getattr(importlib.import_module(module), name) is new


def test_an_unknown_name_is_still_an_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'Nothing'"):
        importlib.import_module("flower_pfl.engine.reply_checks").Nothing  # noqa: B018
    with pytest.raises(AttributeError, match="no attribute 'Nothing'"):
        importlib.import_module("strategies").Nothing  # noqa: B018


def test_the_deprecated_client_rule_class_is_algorithm_for():
    from client_apps.rules import ClientRule

    model = torch.nn.Linear(3, 2)
    config = {"lr": 0.1, "local-steps": 2, "batch-size": 4, "proximal-mu": 1.0}
    with pytest.warns(FutureWarning, match="algorithm_for"):
        old = ClientRule.from_config(config, model)
    assert type(old) is type(client_apps.own_loop.algorithm_for(config, model)) is client_algorithm.Proximal
