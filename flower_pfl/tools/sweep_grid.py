"""A sweep's definition: its methods, seeds, settings and grid, read from a sweep file (TOML) or
the command line, expanded into validated cells (``Sweep.cells``), and whether a cell already ran
(``finished``). ``flower_pfl.tools.sweep`` runs the cells; the file format is documented there."""

from __future__ import annotations

import difflib
import itertools
import json
import re
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flower_pfl.experiment.config import ConfigError, ExperimentConfig
from flower_pfl.methods.registry import renamed_keys
from flower_pfl.run.results import CONFIG, SUMMARY, figures_stand

#: the sweep's own key (not a run-config key): how many clients the federation has
NUM_NODES = "num-nodes"
DEFAULT_NUM_NODES = 100
#: run-config keys the sweep sets itself
RESERVED = ("seed", "output-dir", "resume-from")
#: keys only a method table may set
METHOD_KEYS = ("method", "aggregation")
DEFAULT_REFERENCES = ("local", "fedavg")
ENGINES = ("inprocess", "flwr-run")
TOP_LEVEL = ("name", "methods", "seeds", "references", "base", "grid", "settings", "method")


class SweepError(ConfigError):
    """A sweep file or command line that cannot describe a sweep; the message says what to fix."""


@dataclass(frozen=True)
class Cell:
    """One run of the sweep: a method (row name) in a setting with a seed."""

    method: str
    setting: str
    seed: int
    run_config: dict[str, Any]
    #: the sweep's ``num-nodes``: the clients of the federation (the run config's ``num-clients``)
    num_nodes: int
    folder: Path
    #: the nodes that host them (0: the engine's choice, ``nodes_for``)
    nodes: int = 0

    def nodes_for(self, fast: int) -> int:
        """The nodes of this cell's run: its own ``nodes``, else one per client for the legacy API (whose nodes are
        one client each), else at most ``fast`` (one per core: each node trains its clients as one computation)."""
        if self.nodes:
            return self.nodes
        return self.num_nodes if self.run_config.get("api") == "legacy" else min(self.num_nodes, max(fast, 1))

    def describe(self) -> dict[str, Any]:
        return {"method": self.method, "setting": self.setting, "seed": self.seed, NUM_NODES: self.num_nodes}


@dataclass
class Sweep:
    """What to run; ``cells`` expands and validates it."""

    methods: list[str]
    seeds: list[int]
    base: dict[str, Any] = field(default_factory=dict)
    grid: dict[str, list[Any]] = field(default_factory=dict)
    settings: list[dict[str, Any]] = field(default_factory=list)
    method_tables: dict[str, dict[str, Any]] = field(default_factory=dict)
    references: list[str] = field(default_factory=list)
    name: str = "sweep"

    def __post_init__(self) -> None:
        if not self.methods or not all(isinstance(m, str) and m for m in self.methods):
            raise SweepError(f"'methods' must be a non-empty list of method names, not {self.methods!r}")
        if not self.seeds or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in self.seeds):
            raise SweepError(f"'seeds' must be a non-empty list of integers >= 0, not {self.seeds!r}")
        if len(set(self.seeds)) != len(self.seeds):
            raise SweepError(f"'seeds' lists a seed twice: {self.seeds}")
        if not all(isinstance(m, str) and m for m in self.references):
            raise SweepError(f"'references' must be a list of method names, not {self.references!r}")
        _check_keys("[base]", self.base)
        for key, values in self.grid.items():
            if not isinstance(values, list) or not values:
                raise SweepError(f"[grid] '{key}' must be a non-empty list of values, not {values!r}")
            if len({json.dumps(v) for v in values}) != len(values):
                raise SweepError(f"[grid] '{key}' lists a value twice: {values}")
        _check_keys("[grid]", self.grid)
        names = [s.get("name") for s in self.settings]
        if not all(isinstance(n, str) and n for n in names) or len(set(names)) != len(names):
            raise SweepError(f"every [[settings]] needs its own 'name' (a string); got {names}")
        for s in self.settings:
            _check_keys(f"[[settings]] '{s['name']}'", {k: v for k, v in s.items() if k != "name"})
        for name, table in self.method_tables.items():
            if not isinstance(table, dict):
                raise SweepError(f"[method.{name}] must be a table of run-config keys, not {table!r}")
            _check_keys(f"[method.{name}]", table, allowed=METHOD_KEYS)
        unused = sorted(set(self.method_tables) - set(self.all_methods))
        if unused:
            raise SweepError(f"[method.{unused[0]}] names no method of 'methods' or 'references' ({', '.join(self.all_methods)})")

    @property
    def all_methods(self) -> list[str]:
        """The methods, then the references not among them."""
        return list(dict.fromkeys([*self.methods, *self.references]))

    def setting_list(self) -> list[tuple[str, dict[str, Any]]]:
        """Every setting's name and run-config values: each named setting with each grid point."""
        named = [(s["name"], {k: v for k, v in s.items() if k != "name"}) for s in self.settings] or [("", {})]
        keys = list(self.grid)
        out = []
        for name, values in named:
            for combo in itertools.product(*(self.grid[k] for k in keys)):
                point = dict(zip(keys, combo))
                label = ", ".join(filter(None, [name, *(f"{k}={_show(v)}" for k, v in point.items())]))
                out.append((label or "base", {**values, **point}))
        return out

    def method_config(self, name: str) -> dict[str, Any]:
        """The run-config keys a method name stands for (its table, or ``a+b``: method a, aggregation b)."""
        table = dict(self.method_tables.get(name, {}))
        if "method" not in table:
            method, _, aggregation = name.partition("+")
            table = {"method": method, **({"aggregation": aggregation} if aggregation else {}), **table}
        return table

    def cells(self, out: str | Path) -> list[Cell]:
        """Every cell (setting-major, then method, then seed), each validated; raises ``ConfigError``."""
        out = Path(out).resolve()
        defaults = ExperimentConfig().to_run_config()
        cells, folders = [], set()
        for setting, values in self.setting_list():
            for method in self.all_methods:
                for seed in self.seeds:
                    merged = {**self.base, **values, **self.method_config(method)}
                    num_nodes = merged.pop(NUM_NODES, DEFAULT_NUM_NODES)
                    if not isinstance(num_nodes, int) or isinstance(num_nodes, bool) or num_nodes < 1:
                        raise SweepError(f"'{NUM_NODES}' = {num_nodes!r} is invalid: must be an integer >= 1")
                    folder = out / "runs" / _slug(method) / _slug(setting) / f"seed{seed}"
                    if folder in folders:
                        raise SweepError(f"two cells would share the folder {folder}: rename a method or setting")
                    folders.add(folder)
                    run_config = {**merged, "seed": seed, "output-dir": str(folder), **self.tracker_keys(merged, setting, out)}
                    try:
                        cfg = ExperimentConfig.from_mapping({**defaults, **run_config})
                    except ConfigError as err:
                        raise ConfigError(f"{err} (method {method!r}, setting {setting!r})") from None
                    cells.append(Cell(method, setting, seed, {**cfg.to_run_config(), "num-clients": cfg.num_clients or num_nodes},
                                      cfg.num_clients or num_nodes, folder))
        return cells

    def tracker_keys(self, merged: Mapping[str, Any], setting: str, out: Path) -> dict[str, Any]:
        """A tracked sweep groups its cells: one MLflow store (``<sweep>/mlflow.db``) and experiment (the sweep's
        name), the setting as the runs' group; keys the sweep file sets win. TensorBoard: the cells' folders."""
        if not merged.get("tracker"):
            return {}
        return {"tracker-experiment": merged.get("tracker-experiment") or self.name,
                "tracker-uri": merged.get("tracker-uri") or f"sqlite:///{out / 'mlflow.db'}",
                "tracker-group": merged.get("tracker-group") or setting}

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "methods": self.methods, "seeds": self.seeds, "references": self.references,
                "base": self.base, "grid": self.grid, "settings": self.settings, "method": self.method_tables}


def _check_keys(where: str, mapping: Mapping[str, Any], allowed: Sequence[str] = ()) -> None:
    known = set(ExperimentConfig().to_run_config()) | set(renamed_keys()) | {NUM_NODES}
    for key in mapping:
        if key in RESERVED or (key in METHOD_KEYS and key not in allowed):
            owner = "'seeds'" if key == "seed" else "the sweep" if key in RESERVED else "'methods' or a [method.<name>] table"
            raise SweepError(f"{where}: '{key}' is set by {owner}, not here")
        if key not in known:
            near = difflib.get_close_matches(key, sorted(known), n=3)
            raise ConfigError(f"{where}: '{key}' is not a run-config key" + (f" (did you mean {', '.join(near)}?)" if near else ""))


def _show(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._=+-]+", "_", text).strip("_") or "base"


def from_mapping(data: Mapping[str, Any], name: str = "sweep") -> Sweep:
    """A sweep from a parsed sweep file (see the module docstring)."""
    unknown = sorted(set(data) - set(TOP_LEVEL))
    if unknown:
        raise SweepError(f"unknown sweep-file key(s) {unknown}: the file may hold {', '.join(TOP_LEVEL)}")
    tables = {"base": dict, "grid": dict, "method": dict, "settings": list}
    for key, kind in tables.items():
        if key in data and not isinstance(data[key], kind):
            raise SweepError(f"'{key}' must be a {'table' if kind is dict else 'list of tables ([[settings]])'}")
    if "methods" not in data or "seeds" not in data:
        raise SweepError("a sweep file needs 'methods' and 'seeds'")
    return Sweep(methods=list(data["methods"]), seeds=list(data["seeds"]), base=dict(data.get("base", {})),
                 grid={k: v for k, v in data.get("grid", {}).items()}, settings=[dict(s) for s in data.get("settings", [])],
                 method_tables={k: dict(v) if isinstance(v, dict) else v for k, v in data.get("method", {}).items()},
                 references=list(data.get("references", DEFAULT_REFERENCES)), name=str(data.get("name", name)))


def from_toml(path: str | Path) -> Sweep:
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as err:
        raise SweepError(f"{path} is not valid TOML: {err}") from None
    return from_mapping(data, name=path.stem)


def parse_value(text: str) -> Any:
    """A TOML value (``0.1``, ``true``, ``'x'``), or the text itself (a bare word)."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


#: keys whose value is itself a comma-separated list (never a grid axis)
LIST_KEYS = ("tracker",)


def parse_set(items: Sequence[str]) -> tuple[dict[str, Any], dict[str, list[Any]]]:
    """``--set key=value`` (base) and ``--set key=v1,v2`` (grid; ``LIST_KEYS`` take the list as one value)."""
    base, grid = {}, {}
    for item in items:
        key, sep, values = item.partition("=")
        if not sep or not key.strip() or not values.strip():
            raise SweepError(f"--set {item!r}: expected key=value or key=v1,v2,...")
        parsed = [values.strip()] if key.strip() in LIST_KEYS else [parse_value(v.strip()) for v in values.split(",")]
        if len(parsed) == 1:
            base[key.strip()] = parsed[0]
        else:
            grid[key.strip()] = parsed
    return base, grid


# --- running ---------------------------------------------------------------------------------

def finished(cell: Cell) -> Path | None:
    """The newest results folder of ``cell`` whose figures stand (``figures_stand``: completed, or
    degraded by idle rounds alone, which a rerun repeats) with the cell's run config."""
    if not cell.folder.is_dir():
        return None
    expected = _comparable(cell.run_config)
    for folder in sorted((p for p in cell.folder.iterdir() if p.is_dir()), reverse=True):
        try:
            summary = json.loads((folder / SUMMARY).read_text())
            config = json.loads((folder / CONFIG).read_text())
        except (OSError, json.JSONDecodeError):
            continue
        if figures_stand(summary) and _comparable(config) == expected:
            return folder
    return None


def unfinished_reason(cell: Cell) -> str:
    """Why ``finished(cell)`` found nothing: the newest summary's status and error, or that none was written.
    A run ``degraded`` by rounds short of clients (``flower_pfl.run.results.Coverage``) is not a finished
    cell: its figures would not be comparable, so the sweep retries it."""
    summaries = sorted(cell.folder.glob(f"*/{SUMMARY}"), reverse=True) if cell.folder.is_dir() else []
    try:
        summary = json.loads(summaries[0].read_text()) if summaries else None
    except (OSError, json.JSONDecodeError):
        summary = None
    if summary is None:
        return "no summary written"
    if summary.get("status") == "degraded":
        return (f"run degraded: {summary.get('short_evaluated_rounds', 0)} evaluated and "
                f"{summary.get('short_training_rounds', 0)} training rounds short of clients")
    return f"run {summary.get('status', '?')}: {summary.get('error', 'see its log')}"


def _comparable(config: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in json.loads(json.dumps(dict(config))).items() if k not in ("output-dir", "client-state-dir")}
