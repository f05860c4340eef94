"""Experiment configuration: every run-config key, its default and what it allows.

The keys every experiment has (data, model, rounds, training settings) are fields here; each
method's own hyperparameters are declared beside the method (``flower_pfl.methods``), each data set's
and model family's keys beside it (``flower_pfl.experiment.datasets``, ``flower_pfl.experiment.models``),
and read from their registries (``declared``), as are the ``method``, ``aggregation``, ``dataset`` and
``model`` values. ``ExperimentConfig.from_mapping``
turns a Flower run config (kebab-case keys) into a validated, typed object, and fails with a
``ConfigError`` that names the key and the allowed values. ``pyproject.toml``'s
``[tool.flwr.app.config]`` carries the same defaults (a test keeps the two in step).
"""

from __future__ import annotations

import difflib
import math
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from flower_pfl.engine.model_facts import ModelFacts
from flower_pfl.engine.params import PERCENT
from flower_pfl.engine.precision import PRECISIONS
from flower_pfl.engine.server_algorithm import PersonalizedAlgorithm
from flower_pfl.experiment.data.imports import is_import_path
from flower_pfl.experiment.data.info import KIND_TEXT, DataInfo
from flower_pfl.experiment.data.partition import SCHEMES
from flower_pfl.experiment.datasets import registry as data_sets
from flower_pfl.experiment.datasets.base import DATA_SOURCES, HUB, RENAMED_SOURCES
from flower_pfl.experiment.declared import declared_specs
from flower_pfl.experiment.models import registry as models
from flower_pfl.experiment.models.base import ModelSettings
from flower_pfl.methods import registry

APIS: tuple[str, ...] = ("message", "legacy")
DEVICES: tuple[str, ...] = ("auto", "cpu", "cuda")
STORES: tuple[str, ...] = ("memory", "disk")
#: the live trackers a run can write to (``flower_pfl.run.trackers``)
TRACKERS: tuple[str, ...] = ("tensorboard", "mlflow", "wandb")
#: the clients' starting models: one PyTorch-default model for all, zeros, or one PyTorch-default model each
INITS: tuple[str, ...] = ("shared", "zero", "independent")
#: "natural": the data set's own clients (Synthetic's users, writers, speaking roles, subjects, domains); the
#: others re-partition the pooled data by label
PARTITIONS: tuple[str, ...] = ("natural", *SCHEMES)


def parse_trackers(value: str | Sequence[str] | None) -> tuple[str, ...]:
    """``"tensorboard,mlflow"`` (or a sequence of names, or ``None``/``""``) as a tuple of tracker
    names; an unknown name raises ``ValueError`` naming the allowed ones."""
    if value is None:
        return ()
    names = [n.strip().lower() for n in (value.split(",") if isinstance(value, str) else value)]
    names = [n for n in names if n]
    unknown = [n for n in names if n not in TRACKERS]
    if unknown:
        raise ValueError(f"unknown tracker {unknown[0]!r}: use one or more of {', '.join(TRACKERS)}, comma-separated")
    return tuple(dict.fromkeys(names))


class ConfigError(ValueError):
    """A run-config value that is missing, of the wrong type or out of range."""


@dataclass(frozen=True)
class ExperimentConfig:
    """One experiment. Field ``foo_bar`` is run-config key ``foo-bar``; a method hyperparameter
    ``foo-bar`` is ``options["foo-bar"]`` (also ``cfg.foo_bar``)."""

    method: str = "fedmcsa"
    #: "default", or FedMCSA's Table 2: "mcsa" gives fedavg / pfedme FedMCSA's layer-wise attention;
    #: "mean" gives fedmcsa plain averaging instead of it (FedMCSA^-MCSA)
    aggregation: str = "default"
    api: str = "message"
    dataset: str = "synthetic"
    data_source: str = "torchvision"
    hub_dataset: str = ""
    data_dir: str = "data"
    download: bool = False
    train_fraction: float = 0.75
    #: the share of each client's samples taken out of its training part for validation (its test part stays
    #: as ``train-fraction`` leaves it); the summary then reports the test figures of the round chosen on
    #: validation beside BMTA, which is chosen on the test data itself (0: no validation part)
    val_fraction: float = 0.0
    partition: str = "natural"
    dirichlet_alpha: float = 0.5
    classes_per_client: int = 2
    shards_per_client: int = 2
    paired_clients: bool = False
    train_samples_per_client: int = 0
    model: str = "mlr"
    #: multiplies the channels and units of the package's model families (mlr and dnn excepted: hidden-units)
    model_width: float = 1.0
    #: dropout of the package's models whose architecture has it (VGG-11, MobileNetV2, TextCNN, the LSTM, the
    #: transformer); 0 by default, so that a round's clients can train as one computation
    dropout: float = 0.0
    #: a weights file (``torch.save`` of a ``state_dict``, or safetensors) for the starting model: its tensors
    #: whose names and shapes match are loaded (the head, sized for other classes, usually is not)
    pretrained: str = ""
    #: the text models' vocabulary (embedding rows); 0 takes it from the data
    vocab_size: int = 0
    #: the clients' starting models: "shared" (one PyTorch-default model, seeded by ``seed``), "zero"
    #: (all parameters 0), "independent" (each client its own PyTorch-default model, seeded by seed and
    #: partition id; methods that keep a model per client on the server only)
    init: str = "shared"
    #: multiplies the shared or independent starting models (1: PyTorch's default scale)
    init_scale: float = 1.0
    num_rounds: int = 100
    #: a natural client (writer, speaking role, subject) whose share would leave fewer test samples than this is
    #: left out, as LEAF's minimum-samples option leaves users out: one test sample's accuracy (0 or 1) would
    #: count as much as any client's in the unweighted mean (0: keep every client the split can serve)
    min_test_samples: int = 5
    #: the clients of the federation, spread over the nodes (``client_apps.hosting``): a node trains its round's
    #: clients as one computation; 0: one client per node
    num_clients: int = 0
    #: the share of the federation's clients that never train (a seeded draw of partition ids, the same in every
    #: layout; FL-bench's user split, pFL-Bench's new clients): they evaluate what their method gives a client
    #: it has never seen, reported apart from the participating clients (``unseen-accuracy-*``)
    unseen_fraction: float = 0.0
    #: the domains (or natural groups) whose clients never train, comma-separated: held-out domains of a
    #: feature-shift data set (the clients' ``client_groups`` in the summary name them)
    unseen_domains: str = ""
    #: local SGD steps a client that never trains takes on its own training part before it evaluates
    #: (FL-bench's finetune_epoch; with lr and batch-size); 0: it evaluates what it is sent
    new_client_finetune_steps: int = 0
    clients_per_round: int = 20
    lr: float = 0.02
    batch_size: int = 20
    local_steps: int = 20
    eval_every: int = 5
    #: the summary's ``rounds_to_target``: the first evaluated round whose validation mean (without a validation
    #: part: test mean) reaches this accuracy (0: not reported)
    target_accuracy: float = 0.0
    seed: int = 0
    #: the seed of the data alone: Synthetic's generation, the partition, each client's train/test split and
    #: data scarcity (-1: ``seed``, so each seed draws its own data); fixed, runs with other seeds share the data
    data_seed: int = -1
    device: str = "auto"
    #: the clients' arithmetic: "float32" (exact), or on CUDA "tf32" / "bfloat16" (``flower_pfl.engine.precision``)
    precision: str = "float32"
    output_dir: str = "results"
    #: where the server keeps the per-client models: "memory", or "disk" (memory-mapped files in the results folder)
    store: str = "memory"
    #: write the server's complete state every this many rounds (0: only after the last round)
    checkpoint_every: int = 10
    #: a results folder to continue: the run goes on after its last checkpointed round, in that folder
    resume_from: str = ""
    #: refuse an update that changes a model by more than this multiple of the model's norm as sent
    #: (0: off; see ``flower_pfl.engine.reply_checks.ReplyBounds``)
    max_update_ratio: float = 10.0
    #: refuse extras (SCAFFOLD's Δc_i, FedAttn's Z_i) above this multiple of the round's median (0: off)
    max_median_ratio: float = 100.0
    #: count a reply's num-examples at most this multiple of the median of the clients' first claims, and at
    #: most its client's first count (0: off; see ``flower_pfl.engine.reply_checks.WeightBook``)
    max_weight_ratio: float = 1000.0
    #: seconds a round waits for missing nodes before it goes on with those connected
    node_wait_timeout: float = 120.0
    #: the run fails when more than this share of its rounds accepted no update (1: never)
    max_idle_rounds: float = 0.5
    #: an evaluated round counts in BMTA, the last-10% mean and the final accuracy only when at least this
    #: share of the federation's clients reported an accuracy; a training round is short when fewer than
    #: this share of its sampled clients replied
    min_evaluated_share: float = 0.8
    #: a node that failed in this many consecutive rounds it was sent work is lost: named once and not sampled
    #: any more; the run stops when the nodes left cannot make an evaluated round that counts (0: never)
    lost_node_rounds: int = 3
    #: the clients' folder for their persisted state (an absolute path on shared storage in a Ray cluster;
    #: "": each node's own choice: its node config's ``client-state-dir``, else ``FLOWER_PFL_CLIENT_STATE_DIR``,
    #: else ``~/.cache/flower-pfl/client-state``); a node config's ``client-state-dir`` wins
    client_state_dir: str = ""
    #: a resumed run goes on when nodes lack the client state of the checkpoint's round (they start it afresh)
    allow_empty_client_state: bool = False
    #: keep Flower's round-by-round console lines (false: only the run's own progress lines)
    verbose: bool = False
    #: draw the run's figures (learning curve, partition, attention and similarity heatmaps); false: the numbers
    #: only (``python -m flower_pfl compare`` draws curves from them later)
    figures: bool = True
    #: a node's clients of a round train (and evaluate) as one computation where their client algorithm allows
    #: (``flower_pfl.engine.batched``), with the numbers of training them one by one within its tolerance
    batch_clients: bool = True
    #: how many of a round's clients a node trains as one computation (0: as many as half its device's free
    #: memory holds, ``flower_pfl.engine.memory``); a node config's ``clients-per-computation`` wins
    clients_per_computation: int = 0
    #: live trackers, comma-separated: "tensorboard", "mlflow", "wandb" ("": none; ``flower_pfl.run.trackers``)
    tracker: str = ""
    #: MLflow's experiment and W&B's project
    tracker_experiment: str = "flower-pfl"
    #: MLflow's tracking URI ("": a SQLite store ``mlflow.db`` in ``output-dir``)
    tracker_uri: str = ""
    #: a label that groups runs in the trackers (a sweep's setting)
    tracker_group: str = ""
    #: every method's, data set's and model family's keys by run-config key (declared beside each, see
    #: ``flower_pfl.experiment.declared``); missing keys take the declared defaults
    options: dict[str, Any] = field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        specs = declared_specs()
        object.__setattr__(self, "options", current_names(self.options))
        unknown = sorted(set(self.options) - set(specs))
        if unknown:
            raise ConfigError(f"run config keys {unknown} are not keys of any method, data set or model")
        options = {key: spec.default for key, spec in specs.items()} | dict(self.options)
        object.__setattr__(self, "options", options)
        if (source := RENAMED_SOURCES.get(self.data_source)) is not None:
            warnings.warn(f"run config 'data-source' = {self.data_source!r} is now {source!r} (the Hugging Face hub's files, "
                          f"read through datasets); {self.data_source!r} is still read but will go", FutureWarning, stacklevel=3)
            object.__setattr__(self, "data_source", source)
        choices = {
            "method": registry.methods(), "aggregation": registry.aggregations(), "api": APIS, "device": DEVICES, "precision": PRECISIONS,
            "partition": PARTITIONS, "data_source": DATA_SOURCES, "store": STORES, "init": INITS,
        }
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                _fail(name, getattr(self, name), f"one of {', '.join(allowed)}")
        for name in ("num_rounds", "clients_per_round", "batch_size", "local_steps", "eval_every",
                     "classes_per_client", "shards_per_client"):
            if getattr(self, name) < 1:
                _fail(name, getattr(self, name), "an integer >= 1")
        for name in ("lr", "dirichlet_alpha"):
            if not getattr(self, name) > 0:
                _fail(name, getattr(self, name), "a number > 0")
        for key, spec in specs.items():
            value = _coerce(key, options[key], spec.type) if spec.type is not object else options[key]
            if (must := spec.check(value)) is not None:
                _fail(key, value, must)
        _say_plausible_units(options, specs)
        if self.paired_clients and self.partition == "natural":
            _fail("paired_clients", self.paired_clients, f"false with partition 'natural' (twins split a partition of {', '.join(SCHEMES)})")
        if self.min_test_samples < 0:
            _fail("min_test_samples", self.min_test_samples, "an integer >= 0 (0: keep every natural client)")
        if self.num_clients < 0:
            _fail("num_clients", self.num_clients, "an integer >= 0 (0: one client per node)")
        if self.clients_per_computation < 0:
            _fail("clients_per_computation", self.clients_per_computation, "an integer >= 0 (0: as many as the node's memory holds)")
        if self.train_samples_per_client < 0:
            _fail("train_samples_per_client", self.train_samples_per_client, "an integer >= 0 (0 keeps all)")
        if not 0 < self.train_fraction < 1:
            _fail("train_fraction", self.train_fraction, "a number in (0, 1)")
        if not 0 <= self.val_fraction < self.train_fraction:
            _fail("val_fraction", self.val_fraction, f"a number in [0, train-fraction = {self.train_fraction:g}): it is "
                  "taken out of each client's training part")
        if not 0 <= self.target_accuracy <= 1:
            _fail("target_accuracy", self.target_accuracy, "an accuracy in [0, 1] (0: no rounds-to-target)")
        if not 0 <= self.unseen_fraction < 1:
            _fail("unseen_fraction", self.unseen_fraction, "a share in [0, 1) (some clients must train)")
        if self.new_client_finetune_steps < 0:
            _fail("new_client_finetune_steps", self.new_client_finetune_steps, "an integer >= 0 (0: no fine-tuning)")
        allowed = tuple(e.aggregation for e in registry.entries() if e.method == self.method)
        if self.aggregation not in allowed:
            _fail("aggregation", self.aggregation, f"one of {', '.join(allowed)} for method '{self.method}'")
        if (problem := self.entry.declaration.check_run(self.to_run_config()) if not self.entry.builtin else None):
            _fail(problem[0], self.to_run_config()[problem[0]], problem[1])
        self._check_data_and_model()
        self._check_init()
        if self.precision != "float32" and self.device == "cpu":
            _fail("precision", self.precision, "'float32' with device 'cpu' (tf32 and bfloat16 run on CUDA only)")
        if self.seed < 0:
            _fail("seed", self.seed, "an integer >= 0")
        if self.data_seed < -1:
            _fail("data_seed", self.data_seed, "an integer >= 0, or -1 (the data follows seed)")
        if self.checkpoint_every < 0:
            _fail("checkpoint_every", self.checkpoint_every, "an integer >= 0 (0: only after the last round)")
        for name in ("max_update_ratio", "max_weight_ratio", "max_median_ratio"):
            if not (getattr(self, name) == 0 or getattr(self, name) >= 1):
                _fail(name, getattr(self, name), "0 (off) or a number >= 1")
        if not self.node_wait_timeout >= 0:
            _fail("node_wait_timeout", self.node_wait_timeout, "a number of seconds >= 0")
        if not 0 <= self.max_idle_rounds <= 1:
            _fail("max_idle_rounds", self.max_idle_rounds, "a share in [0, 1] (1: never fail)")
        if self.lost_node_rounds < 0:
            _fail("lost_node_rounds", self.lost_node_rounds, "an integer >= 0 (0: never declare a node lost)")
        if not 0 <= self.min_evaluated_share <= 1:
            _fail("min_evaluated_share", self.min_evaluated_share, "a share in [0, 1] (0: every evaluated round counts)")
        if not self.output_dir:
            _fail("output_dir", self.output_dir, "a non-empty path")
        try:
            parse_trackers(self.tracker)
        except ValueError:
            _fail("tracker", self.tracker, f"'' or one or more of {', '.join(TRACKERS)}, comma-separated")
        if not self.tracker_experiment:
            _fail("tracker_experiment", self.tracker_experiment, "a non-empty name")

    def _check_data_and_model(self) -> None:
        """The data set and model by name (or import path), the data set's partitions and sources, and whether
        the model takes the data set's samples (a package data set's; one of one's own is checked when loaded)."""
        own_data, own_model = is_import_path(self.dataset), is_import_path(self.model)
        if not own_data and self.dataset not in data_sets.names():
            _fail("dataset", self.dataset, f"one of {', '.join(data_sets.names())}, or an import path 'package.module:function'")
        if not own_model and self.model not in models.model_names():
            _fail("model", self.model, f"one of {', '.join(models.model_names())}, or an import path 'package.module:factory'")
        if not own_data:
            cls = data_sets.data_set_class(self.dataset)
            if self.partition not in cls.partitions():
                why = f" ({cls.name} has no natural clients)" if self.partition == "natural" else ""
                _fail("partition", self.partition, f"one of {', '.join(cls.partitions())} for dataset '{self.dataset}'{why}")
            if self.data_source not in cls.sources():
                hub = ", ".join(c.name for c in data_sets.data_sets() if HUB in c.sources())
                _fail("dataset", self.dataset, f"one of {hub} with data-source '{HUB}' ({self.dataset} is not on the hub)")
            if not own_model and (problem := models.takes(self.model, cls.kind)) is not None:
                _fail("model", self.model, f"a model for {KIND_TEXT[cls.kind]}: {problem}")
            if not own_model:
                self._check_method_on_model(data_sets.instance(self.dataset, self.options).info())
        if not (math.isfinite(self.model_width) and self.model_width > 0):
            _fail("model_width", self.model_width, "a finite number > 0")
        if not 0 <= self.dropout < 1:
            _fail("dropout", self.dropout, "a number in [0, 1)")
        if self.vocab_size < 0:
            _fail("vocab_size", self.vocab_size, "an integer >= 0 (0: from the data)")

    def _check_method_on_model(self, data: DataInfo) -> None:
        """The method refuses a package model it cannot run on, with the reason (``Method.check_model``; a model
        of one's own is checked when the run starts)."""
        try:
            facts = models.model_facts(self.model, data, self.options, ModelSettings(self.model_width, self.dropout))
        except ValueError as err:  # the model cannot take the data's samples
            raise ConfigError(f"run config 'model' = {self.model!r}: {err}") from err
        self.refuse_unless_method_runs_on(facts)

    def refuse_unless_method_runs_on(self, facts: ModelFacts) -> None:
        """A ``ConfigError`` with the reason when this run's method cannot run on a model with ``facts``."""
        if (needs := self.entry.check_model(facts)) is not None:
            raise ConfigError(f"run config 'method' = {self.label!r} cannot run on model {self.model!r}: it needs {needs}")

    def _check_init(self) -> None:
        if not (math.isfinite(self.init_scale) and self.init_scale > 0):
            _fail("init_scale", self.init_scale, "a finite number > 0")
        if self.init == "zero" and self.init_scale != 1:
            _fail("init_scale", self.init_scale, "1 with init 'zero' (it scales the 'shared' and 'independent' models)")
        if self.init == "independent" and self.label not in per_client_methods():
            _fail("init", self.init, f"'shared' or 'zero' for method '{self.label}', which starts from one global "
                  f"model; 'independent' applies to {', '.join(per_client_methods())}")

    @property
    def entry(self) -> registry.Entry:
        """The registry entry of this run's ``(method, aggregation)``."""
        return registry.entry(self.method, self.aggregation)

    @property
    def trackers(self) -> tuple[str, ...]:
        """The names in ``tracker``, in order, each once."""
        return parse_trackers(self.tracker)

    @property
    def label(self) -> str:
        """``fedavg``, or ``fedavg+mcsa`` for a non-default aggregation."""
        return self.entry.label

    @property
    def data_rng_seed(self) -> int:
        """The seed the data is drawn with: ``data-seed``, or ``seed`` when that is -1."""
        return self.seed if self.data_seed < 0 else self.data_seed

    @property
    def run_name(self) -> str:
        """The results folder's name before its time stamp: ``<label>-<dataset>-<model>-seed<seed>``,
        with ``-legacy`` after the label for runs on Flower's legacy API (``fedavg-legacy-...``) and
        ``-data<data-seed>`` after the seed when the data has a seed of its own; a data set or model of
        one's own appears by its function's name."""
        api = "-legacy" if self.api == "legacy" else ""
        data = f"-data{self.data_seed}" if self.data_seed >= 0 else ""
        return f"{self.label}{api}-{short_name(self.dataset)}-{short_name(self.model)}-seed{self.seed}{data}"

    def bounds(self) -> dict[str, float]:
        """The reply bounds as strategy arguments (0 in the run config: ``math.inf``, off)."""
        return {name: getattr(self, name) or math.inf for name in ("max_update_ratio", "max_weight_ratio", "max_median_ratio")}

    def method_arguments(self) -> dict[str, Any]:
        """The strategy constructor's method arguments for this run."""
        return self.entry.arguments(self.to_run_config())

    def option(self, key: str) -> Any:
        """A method hyperparameter by its run-config key (``"fedattn-k"``)."""
        return self.options[key]

    def __getattr__(self, name: str) -> Any:
        """Method hyperparameters as attributes too: ``cfg.fedattn_k`` is ``cfg.option("fedattn-k")``."""
        options = self.__dict__.get("options", {})
        if _key(name) in options:
            return options[_key(name)]
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    @classmethod
    def from_mapping(cls, run_config: Mapping[str, Any], ignore_unknown: bool = False) -> ExperimentConfig:
        """Build from a run config: missing keys take defaults, a key no run config has is refused
        (``ConfigError``, naming the nearest known keys) unless ``ignore_unknown`` (the package's
        ClientApp under another ServerApp, whose own keys the run config carries)."""
        if not ignore_unknown and (unknown := sorted(set(run_config) - known_keys())):
            raise ConfigError("; ".join(unknown_key_message(key) for key in unknown))
        kwargs: dict[str, Any] = {}
        for f in fields(cls):
            key = _key(f.name)
            if f.name != "options" and key in run_config:
                kwargs[f.name] = _coerce(key, run_config[key], type(getattr(cls, f.name)))
        specs = declared_specs()
        run_config = current_names(run_config)
        options = {key: _coerce(key, run_config[key], spec.type) if spec.type is not object else run_config[key]
                   for key, spec in specs.items() if key in run_config}
        return cls(**kwargs, options=options)

    def to_run_config(self) -> dict[str, Any]:
        """The kebab-case run config (e.g. for ``config.json``)."""
        general = {_key(f.name): getattr(self, f.name) for f in fields(self) if f.name != "options"}
        return general | dict(self.options)


def short_name(value: str) -> str:
    """A data set's or model's name, or the function's name of an import path (``"pkg.mod:fn"`` -> ``"fn"``)."""
    return value.rpartition(":")[2].rpartition(".")[2] if is_import_path(value) else value


def known_keys() -> set[str]:
    """Every key a run config may have: the general settings, every method's, data set's and model family's
    keys and the old names of method keys."""
    general = {_key(f.name) for f in fields(ExperimentConfig) if f.name != "options"}
    return general | set(declared_specs()) | set(registry.renamed_keys())


def unknown_key_message(key: str) -> str:
    """What is said of run-config key ``key`` that no run config has, with the nearest known keys."""
    return f"run config key '{key}' is not a key of flower-pfl{nearest_keys(key)}"


def nearest_keys(key: str) -> str:
    """``"; did you mean 'num-rounds'?"``: the known keys nearest ``key`` (or where to find them all)."""
    known = known_keys()
    spelled = key.strip().lower().replace("_", "-")
    near = [spelled] if spelled in known else difflib.get_close_matches(spelled, sorted(known), n=3, cutoff=0.6)
    if not near:
        return " (python -m flower_pfl methods lists every method's keys)"
    return f"; did you mean {' or '.join(repr(k) for k in near)}?"


def _say_plausible_units(options: Mapping[str, Any], specs: Mapping[str, Any]) -> None:
    """Warn of a percent set to a value that reads as a fraction (0.8 for 80 %, as other libraries write it)."""
    for key, spec in specs.items():
        value = options[key]
        if spec.must is PERCENT and value != spec.default and 0 < value <= 1:
            warnings.warn(f"run config '{key}' = {value!r} is a percent: {value} % (write {100 * value:g} for "
                          f"{100 * value:g} %, which other libraries write as the fraction {value})", UserWarning, stacklevel=4)


#: the value of a renamed key in ``pyproject.toml`` (Flower accepts only keys listed there): not set
NOT_SET = ""


def current_names(run_config: Mapping[str, Any]) -> dict[str, Any]:
    """``run_config`` with method keys under their current names (``fedmcsa-lambda`` for ``lam``): a
    renamed key that is set warns (``FutureWarning``) and gives its value to the new key, unless both
    are set to different values (``ConfigError``)."""
    out = dict(run_config)
    for old, new in registry.renamed_keys().items():
        value = out.pop(old, NOT_SET)
        if isinstance(value, str) and value == NOT_SET:
            continue
        default = registry.option_specs()[new].default
        if new in out and out[new] != default and out[new] != value:
            raise ConfigError(f"run config sets both '{old}' = {value!r} and '{new}' = {out[new]!r}: '{old}' is the old "
                              f"name of '{new}'; set only '{new}'")
        warnings.warn(f"run config key '{old}' is now '{new}'; '{old}' is still read but will go", FutureWarning, stacklevel=3)
        out[new] = value
    return out


def current_values(run_config: Mapping[str, Any]) -> dict[str, Any]:
    """``run_config`` with renamed values under their current names (``data-source`` ``flwr-datasets`` is
    ``huggingface``), without a warning: a config written before the rename (a checkpoint's) reads as today's."""
    out = dict(run_config)
    if isinstance(source := out.get("data-source"), str) and source in RENAMED_SOURCES:
        out["data-source"] = RENAMED_SOURCES[source]
    return out


def per_client_methods() -> tuple[str, ...]:
    """The methods (labels) whose server keeps one model per client, so each client can start from its own."""
    return tuple(e.label for e in registry.entries()
                 if isinstance(e.declaration, type) and issubclass(e.declaration, PersonalizedAlgorithm))


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
