"""Every run-config key declared beside what reads it: a method's hyperparameters
(``flower_pfl.methods``), a data set's keys (``flower_pfl.experiment.datasets``) and a model family's
(``flower_pfl.experiment.models``); and their blocks of ``pyproject.toml``'s ``[tool.flwr.app.config]``,
which Flower reads the keys and defaults from (``python -m tests.regenerate`` writes them)."""

from __future__ import annotations

from functools import lru_cache

from flower_pfl.engine.params import ParamSpec, param_specs
from flower_pfl.experiment.datasets import registry as data_sets
from flower_pfl.experiment.models import registry as models
from flower_pfl.methods import registry as methods
from flower_pfl.methods.registry import toml_value

#: the marks around the data sets' and model families' keys in ``pyproject.toml`` (``data_and_model_block``)
BLOCK_START = "# --- every data set's and model family's keys, from their declarations (python -m tests.regenerate; do not edit)"
BLOCK_END = "# --- end of the data sets' and model families' keys"


@lru_cache(maxsize=1)
def declared_specs() -> dict[str, ParamSpec]:
    """Every declared run-config key, by key: the methods', the data sets' and the model families'. A key
    declared in two of them is a mistake."""
    parts = {"methods": methods.option_specs(), "data sets": data_sets.option_specs(), "model families": models.option_specs()}
    out: dict[str, ParamSpec] = {}
    owner: dict[str, str] = {}
    for who, specs in parts.items():
        for key, spec in specs.items():
            if key in out:
                raise RuntimeError(f"run-config key '{key}' is declared by {owner[key]} and by {who}")
            out[key], owner[key] = spec, who
    return out


def _users() -> dict[str, list[str]]:
    """The data sets and models that read each data set's and model family's key."""
    out: dict[str, list[str]] = {}
    for cls in data_sets.data_sets():
        for key in data_sets.keys_of(cls.name):
            out.setdefault(key, []).append(cls.name)
    for family in models.families():
        for spec in param_specs(family):
            if spec.key is not None:
                out.setdefault(spec.key, []).extend(family.models)
    return out


def data_and_model_block() -> str:
    """The data sets' and model families' keys of ``pyproject.toml``'s ``[tool.flwr.app.config]``, each with
    its declared documentation and who reads it."""
    lines, users = [BLOCK_START], _users()
    for key, spec in {**data_sets.option_specs(), **models.option_specs()}.items():
        assignment = f"{key} = {toml_value(spec.default)}"
        lines.append(f"{assignment:<29} # {', '.join(users[key])}: {spec.doc}")
    return "\n".join([*lines, BLOCK_END])


def with_declared_blocks(pyproject: str) -> str:
    """``pyproject.toml``'s text with its method keys and its data set and model keys rewritten."""
    text = methods.with_run_config_block(pyproject)
    head, start, rest = text.partition(BLOCK_START)
    _, end, tail = rest.partition(BLOCK_END)
    if not (start and end):
        raise ValueError(f"pyproject.toml lacks the marks {BLOCK_START!r} ... {BLOCK_END!r}")
    return head + data_and_model_block() + tail
