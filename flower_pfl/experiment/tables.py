"""The data set table, the model table and which methods refuse which models, made from the declarations
(``python -m flower_pfl data`` and ``models``, and the documentation's pages)."""

from __future__ import annotations

from functools import lru_cache

import torch
from torch import nn

from flower_pfl.engine.model_facts import ModelFacts
from flower_pfl.engine.params import param_specs
from flower_pfl.experiment.data.info import KIND_TEXT, DataInfo
from flower_pfl.experiment.datasets import registry as data_sets
from flower_pfl.experiment.models import registry as models
from flower_pfl.methods import registry as methods
from flower_pfl.methods.registry import toml_value

#: the samples each kind of model is counted on in the model table: CIFAR-10's images, AG News's default
#: sequences, Shakespeare's windows, HAR's windows, Synthetic's features
REFERENCE: dict[str, tuple[str, DataInfo]] = {
    "image": ("3x32x32, 10 classes", DataInfo((3, 32, 32), 10, "image")),
    "tokens": ("200 tokens of 32,000, 4 classes", DataInfo((200,), 4, "tokens", 32000, 0)),
    "signals": ("9x128, 6 classes", DataInfo((9, 128), 6, "signals")),
    "features": ("60 features, 10 classes", DataInfo((60,), 10, "features")),
}
#: the character LSTM is counted on Shakespeare's samples
CHARACTERS = ("80 characters of 81, 80 classes", DataInfo((80,), 80, "tokens", 81))


def reference(name: str) -> tuple[str, DataInfo]:
    """The samples model ``name`` is counted and checked on."""
    return CHARACTERS if name == "char-lstm" else REFERENCE[models.family_of(name).takes[0]]


@lru_cache(maxsize=64)
def model_facts(name: str) -> tuple[int, ModelFacts]:
    """Model ``name``'s parameter count and facts on its reference samples (built on the meta device)."""
    with torch.device("meta"):
        model: nn.Module = models.build_model(name, reference(name)[1])
    return sum(p.numel() for p in model.parameters()), ModelFacts.of_model(model)


def data_table() -> str:
    """Every data set: what it is, its samples, its partitions, where it is read from, its keys."""
    rows = ["| `dataset` | samples | classes | partitions | files (`data-source = \"torchvision\"`) | hub | keys |",
            "|---|---|---|---|---|---|---|"]
    for cls in data_sets.data_sets():
        ds = cls()
        info = ds.info()
        shape = "x".join(str(s) for s in info.input_shape)
        natural = [f"natural (one {cls.natural} per client)" if p == "natural" else p for p in cls.partitions()]
        hub = f"`{cls.hub.id}`" if cls.hub else "no"
        keys = ", ".join(f"`{s.key} = {toml_value(s.default)}`" for s in param_specs(cls) if s.key) or "none"
        rows.append(f"| `{cls.name}` | {KIND_TEXT[cls.kind].split(' (')[0]} {shape} | {info.num_classes} | {', '.join(natural)} | "
                    f"{cls.files_text} | {hub} | {keys} |")
    return "\n".join(rows)


def model_table() -> str:
    """Every model: its family's line, what it takes, its parameters on reference samples, its family's keys."""
    rows = ["| `model` | what it is | takes | parameters (on) | keys |", "|---|---|---|---:|---|"]
    for family in models.families():
        keys = ", ".join(f"`{s.key} = {toml_value(s.default)}`" for s in param_specs(family) if s.key) or "none"
        for name, line in family.models.items():
            count, _ = model_facts(name)
            takes = " or ".join(KIND_TEXT[k].split(" (")[0] for k in family.takes)
            rows.append(f"| `{name}` | {line} | {takes} | {count:,} ({reference(name)[0]}) | {keys} |")
    return "\n".join(rows)


def refusals() -> dict[str, dict[str, str]]:
    """``method label -> {model: what the method needs}`` for every package model a method refuses."""
    out: dict[str, dict[str, str]] = {}
    for e in methods.entries():
        for name in models.model_names():
            if (needs := e.check_model(model_facts(name)[1])) is not None:
                out.setdefault(e.label, {})[name] = needs
    return out


def refusals_table() -> str:
    """The methods that refuse some of the package's models, and why."""
    rows = ["| method | refuses | because it needs |", "|---|---|---|"]
    for label, refused in refusals().items():
        for needs in dict.fromkeys(refused.values()):
            names = ", ".join(f"`{n}`" for n, why in refused.items() if why == needs)
            rows.append(f"| `{label}` | {names} | {needs} |")
    return "\n".join(rows)
