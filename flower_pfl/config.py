"""Experiment configuration: every run-config key, its default and what it allows.

``ExperimentConfig.from_mapping`` turns a Flower run config (kebab-case keys) into
a validated, typed object, and fails with a ``ConfigError`` that names the key
and the allowed values. ``pyproject.toml``'s ``[tool.flwr.app.config]`` carries
the same defaults (a test keeps the two in step).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any, Mapping

from .data.hub import HUB
from .methods.igfl import ATTENTION_MODES
from .data.images import EMNIST_CLASSES
from .data.partition import SCHEMES
from .layout import GROUPINGS
from .models import MODELS

METHODS: tuple[str, ...] = ("fedmcsa", "fedacs", "igfl", "igfl-c", "igfl-s", "fedattn", "fedamp", "heurfedamp", "ditto", "per-fedavg", "pfedme", "apfl", "fedavg", "fedprox", "fedavgm", "fedadam", "scaffold", "local")
DATASETS: tuple[str, ...] = ("synthetic", "fmnist", "emnist", "cifar10", "femnist")
DATA_SOURCES: tuple[str, ...] = ("torchvision", "flwr-datasets")
APIS: tuple[str, ...] = ("message", "legacy")
#: FedMCSA's Table 2: "mcsa" gives fedavg / pfedme FedMCSA's layer-wise attention; "mean" gives fedmcsa
#: plain averaging instead of it (FedMCSA^-MCSA)
AGGREGATIONS: tuple[str, ...] = ("default", "mcsa", "mean")
DEVICES: tuple[str, ...] = ("auto", "cpu", "cuda")
#: "natural": the data set's own clients (Synthetic's users); the others re-partition the pooled data by label
PARTITIONS: tuple[str, ...] = ("natural", *SCHEMES)
#: fields that decide a client's data (runs that share them share the generated data)
DATA_FIELDS: tuple[str, ...] = (
    "dataset", "synthetic_alpha", "synthetic_beta", "train_fraction", "partition", "dirichlet_alpha",
    "classes_per_client", "shards_per_client", "paired_clients", "train_samples_per_client", "seed",
    "data_dir", "download", "emnist_split", "data_source", "hub_dataset",
)


class ConfigError(ValueError):
    """A run-config value that is missing, of the wrong type or out of range."""


@dataclass(frozen=True)
class ExperimentConfig:
    """One experiment. Field ``foo_bar`` is run-config key ``foo-bar``."""

    method: str = "fedmcsa"
    aggregation: str = "default"
    api: str = "message"
    dataset: str = "synthetic"
    data_source: str = "torchvision"
    hub_dataset: str = ""
    data_dir: str = "data"
    download: bool = False
    emnist_split: str = "byclass"
    synthetic_alpha: float = 0.5
    synthetic_beta: float = 0.5
    train_fraction: float = 0.75
    partition: str = "natural"
    dirichlet_alpha: float = 0.5
    classes_per_client: int = 2
    shards_per_client: int = 2
    paired_clients: bool = False
    train_samples_per_client: int = 0
    model: str = "mlr"
    hidden_units: int = 20
    num_rounds: int = 100
    clients_per_round: int = 20
    lr: float = 0.02
    batch_size: int = 20
    local_steps: int = 20
    lam: float = 5.0
    proximal_mu: float = 0.01
    sigma: float = 50.0
    layer_grouping: str = "tensor"
    all_clients_train: bool = False
    fedacs_p: float = 0.5
    igfl_attention: str = "self"
    ditto_lambda: float = 1.0
    per_fedavg_alpha: float = 0.01
    apfl_alpha_init: float = 0.5
    apfl_alpha_lr: float = 0.02
    pfedme_beta: float = 1.0
    pfedme_lambda: float = 15.0
    pfedme_personal_lr: float = 0.01
    pfedme_inner_steps: int = 5
    fedamp_alpha_k: float = 0.05
    fedamp_sigma: float = 1.0
    fedamp_lambda: float = 1.0
    heurfedamp_sigma: float = 10.0
    heurfedamp_self_weight: float = 0.3
    fedattn_k: int = 5
    fedattn_dk: int = 16
    fedattn_lr: float = 0.01
    fedattn_bias_reg: float = 0.0
    fedattn_warmup: int = 0
    fedattn_learn_values: bool = True
    server_momentum: float = 0.9
    fedadam_eta: float = 0.01
    fedadam_tau: float = 0.001
    eval_every: int = 5
    seed: int = 0
    device: str = "auto"
    output_dir: str = "results"

    def __post_init__(self) -> None:
        choices = {
            "method": METHODS, "aggregation": AGGREGATIONS, "api": APIS, "dataset": DATASETS, "model": MODELS,
            "layer_grouping": GROUPINGS, "device": DEVICES, "partition": PARTITIONS,
            "emnist_split": tuple(EMNIST_CLASSES), "data_source": DATA_SOURCES, "igfl_attention": ATTENTION_MODES,
        }
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                _fail(name, getattr(self, name), f"one of {', '.join(allowed)}")
        for name in ("num_rounds", "clients_per_round", "batch_size", "local_steps", "eval_every", "hidden_units",
                     "classes_per_client", "shards_per_client", "fedattn_k", "fedattn_dk", "pfedme_inner_steps"):
            if getattr(self, name) < 1:
                _fail(name, getattr(self, name), "an integer >= 1")
        for name in ("lr", "sigma", "fedattn_lr", "per_fedavg_alpha", "pfedme_lambda", "pfedme_personal_lr", "fedamp_alpha_k", "fedamp_sigma", "fedamp_lambda", "heurfedamp_sigma"):
            if not getattr(self, name) > 0:
                _fail(name, getattr(self, name), "a number > 0")
        for name in ("lam", "proximal_mu", "synthetic_alpha", "synthetic_beta", "fedattn_bias_reg", "ditto_lambda"):
            if not getattr(self, name) >= 0:
                _fail(name, getattr(self, name), "a number >= 0")
        if self.data_source == "flwr-datasets" and self.dataset not in HUB and self.dataset != "synthetic":
            _fail("dataset", self.dataset, f"one of {', '.join(HUB)} with data-source 'flwr-datasets'")
        if self.dataset == "femnist" and self.data_source != "flwr-datasets":
            _fail("data_source", self.data_source, "'flwr-datasets' for dataset 'femnist'")
        if self.partition == "natural" and self.dataset not in ("synthetic", "femnist"):
            _fail("partition", self.partition, f"one of {', '.join(SCHEMES)} for dataset '{self.dataset}' (it has no natural clients)")
        if self.paired_clients and self.partition == "natural":
            _fail("paired_clients", self.paired_clients, f"false with partition 'natural' (twins split a partition of {', '.join(SCHEMES)})")
        if not self.dirichlet_alpha > 0:
            _fail("dirichlet_alpha", self.dirichlet_alpha, "a number > 0")
        if self.train_samples_per_client < 0:
            _fail("train_samples_per_client", self.train_samples_per_client, "an integer >= 0 (0 keeps all)")
        if not 0 <= self.server_momentum < 1:
            _fail("server_momentum", self.server_momentum, "a number in [0, 1)")
        for name in ("fedadam_eta", "fedadam_tau"):
            if not getattr(self, name) > 0:
                _fail(name, getattr(self, name), "a number > 0")
        if not 0 <= self.fedacs_p < 1:
            _fail("fedacs_p", self.fedacs_p, "a number in [0, 1)")
        if not 0 < self.train_fraction < 1:
            _fail("train_fraction", self.train_fraction, "a number in (0, 1)")
        if self.method == "fedamp" and (self.clients_per_round - 1) * self.fedamp_alpha_k / self.fedamp_sigma > 1:
            _fail("fedamp_alpha_k", self.fedamp_alpha_k, f"at most fedamp-sigma / (clients-per-round - 1) = "
                  f"{self.fedamp_sigma / (self.clients_per_round - 1):.4g}, so no self weight can turn negative")
        if self.aggregation == "mcsa" and self.method not in ("fedavg", "pfedme"):
            _fail("aggregation", self.aggregation, "'default' for this method ('mcsa' transfers to fedavg and pfedme)")
        if self.aggregation == "mean" and self.method != "fedmcsa":
            _fail("aggregation", self.aggregation, "'default' for this method ('mean' replaces fedmcsa's attention)")
        if not 0 <= self.apfl_alpha_init <= 1:
            _fail("apfl_alpha_init", self.apfl_alpha_init, "a number in [0, 1]")
        if self.apfl_alpha_lr < 0:
            _fail("apfl_alpha_lr", self.apfl_alpha_lr, "a number >= 0")
        if not 0 < self.pfedme_beta <= 2:
            _fail("pfedme_beta", self.pfedme_beta, "a number in (0, 2]")
        if not 0 <= self.heurfedamp_self_weight <= 1:
            _fail("heurfedamp_self_weight", self.heurfedamp_self_weight, "a number in [0, 1]")
        if self.fedattn_warmup < 0:
            _fail("fedattn_warmup", self.fedattn_warmup, "an integer >= 0")
        if self.seed < 0:
            _fail("seed", self.seed, "an integer >= 0")
        if not self.output_dir:
            _fail("output_dir", self.output_dir, "a non-empty path")

    @classmethod
    def from_mapping(cls, run_config: Mapping[str, Any]) -> ExperimentConfig:
        """Build from a run config; unknown keys are ignored, missing keys take defaults."""
        kwargs: dict[str, Any] = {}
        for f in fields(cls):
            key = _key(f.name)
            if key in run_config:
                kwargs[f.name] = _coerce(key, run_config[key], type(getattr(cls, f.name)))
        return cls(**kwargs)

    def to_run_config(self) -> dict[str, Any]:
        """The kebab-case run config (e.g. for ``config.json``)."""
        return {_key(k): v for k, v in asdict(self).items()}


def _key(field_name: str) -> str:
    return field_name.replace("_", "-")


def _fail(field_name: str, value: Any, allowed: str) -> None:
    raise ConfigError(f"run config '{_key(field_name)}' = {value!r} is invalid: must be {allowed}")


def _coerce(key: str, value: Any, kind: type) -> Any:
    """Accept an int where a float is expected; reject anything else of the wrong type."""
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, bool) != (kind is bool) or not isinstance(value, kind):
        raise ConfigError(f"run config '{key}' = {value!r} is invalid: must be of type {kind.__name__}")
    return value
