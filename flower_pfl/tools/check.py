"""``flower-pfl check [APP] --run-config "key=value ..."`` (or ``python -m flower_pfl check``): the run
config ``flwr run`` would start, checked as the package's ServerApp and ClientApp check it, before
anything starts.

Flower refuses a ``--run-config`` key that the app's ``pyproject.toml`` does not list with only
``Invalid run configuration`` (the key is named in the SuperLink's log), and the ServerApp refuses a
bad value only once the run has started. This reads the app's defaults (``APP``'s ``pyproject.toml``;
without ``APP``, the current folder's when it is a Flower app, else the package's own defaults, so it
runs from any folder) and the overrides as ``flwr run`` reads them, and says every problem at once: a
key no run config has (with the nearest known keys), a value out of range, a device this machine lacks,
data files that are not under ``data-dir`` (looked for, not loaded), a natural partition the run would
stop on (the run's own reading and partitioning of the files, images' pixels excepted, over the run's
clients: ``num-clients``, else ``--federation-config``'s ``num-supernodes`` as ``flwr run`` takes it), a
model that cannot take the data's samples; a percent written as a fraction is said as a warning. Exit
status 0 when the run config is good, 2 when it is not.
"""

from __future__ import annotations

import argparse
import sys
import tomllib
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from client_apps.flower_internals import parse_config_args
from flower_pfl.engine.wording import counted
from flower_pfl.experiment.build import check_device, check_method_applies, make_model
from flower_pfl.experiment.clients import missing_data, natural_partition_problem
from flower_pfl.experiment.config import ConfigError, ExperimentConfig, nearest_keys


def app_config(app: Path) -> dict[str, Any]:
    """The run config's defaults in ``app``'s ``pyproject.toml`` (``[tool.flwr.app.config]``, flattened as
    Flower flattens its tables: ``a.b``)."""
    with (app / "pyproject.toml").open("rb") as file:
        table = tomllib.load(file)["tool"]["flwr"]["app"].get("config", {})

    def flat(values: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in values.items():
            out.update(flat(value, f"{prefix}{key}.") if isinstance(value, Mapping) else {f"{prefix}{key}": value})
        return out

    return flat(table)


def _is_app(folder: Path) -> bool:
    """Whether ``folder`` holds a Flower app's ``pyproject.toml`` (with ``[tool.flwr.app]``)."""
    try:
        with (folder / "pyproject.toml").open("rb") as file:
            return "app" in tomllib.load(file).get("tool", {}).get("flwr", {})
    except (OSError, tomllib.TOMLDecodeError):
        return False


def problems(run_config: Mapping[str, Any], defaults: Mapping[str, Any], app: str,
             nodes: int = 0) -> tuple[list[str], list[str], ExperimentConfig | None]:
    """What is wrong with ``run_config`` (the app's ``defaults`` with the overrides) on ``nodes`` nodes (0: not
    known), what is worth a warning, and the parsed config when nothing is wrong."""
    where = f"{app}/pyproject.toml's [tool.flwr.app.config], so flwr run refuses it" if app != "the package" else "any run config"
    errors = [f"run config key '{key}' is not in {where}{nearest_keys(key)}" for key in run_config if key not in defaults]
    cfg = None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            cfg = ExperimentConfig.from_mapping({k: v for k, v in run_config.items() if k in defaults})
            check_device(cfg.device)
        except ConfigError as err:
            errors.append(str(err))
        if cfg is not None:
            errors += data_and_model_problems(cfg, cfg.num_clients or nodes)
    return errors, [str(w.message) for w in caught], (None if errors else cfg)


def data_and_model_problems(cfg: ExperimentConfig, num_clients: int = 0) -> list[str]:
    """The data files a run of ``cfg`` would miss (looked for, not loaded), what a natural partition over its
    ``num_clients`` clients (0: not known, one) would stop on, and whether its model can be built for the data and
    the method (``make_model`` runs a model of one's own on a batch of the data's shape)."""
    try:
        if (missing := missing_data(cfg) or natural_partition_problem(cfg, num_clients or 1)) is not None:
            return [missing]
        make_model(cfg)
        check_method_applies(cfg)
    except ConfigError as err:
        return [str(err)]
    return []


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m flower_pfl check", description=__doc__.splitlines()[0])
    parser.add_argument("app", nargs="?", help="the Flower app's folder, as flwr run takes it (default: the current folder "
                                               "when it is a Flower app, else the package's own run config)")
    parser.add_argument("--run-config", action="append", help='"key=value ..." or a .toml file, as flwr run takes it')
    parser.add_argument("--federation-config", action="append", help='"num-supernodes=N ...", as flwr run takes it: the '
                                                                      "nodes, one client each where num-clients is 0")
    args = parser.parse_args(argv)
    app = args.app if args.app is not None else "." if _is_app(Path(".")) else None
    try:
        defaults = app_config(Path(app)) if app is not None else ExperimentConfig().to_run_config()
        overrides = parse_config_args(args.run_config)
        nodes = parse_config_args(args.federation_config).get("num-supernodes", 0)
    except Exception as err:  # no pyproject, no [tool.flwr.app], a malformed --run-config: Flower's own words
        print(f"flower-pfl: cannot read the run config: {getattr(err, 'message', None) or err}", file=sys.stderr)
        return 2
    if not isinstance(nodes, int) or isinstance(nodes, bool) or nodes < 0:
        print(f"flower-pfl: --federation-config num-supernodes = {nodes!r} is not a number of nodes", file=sys.stderr)
        return 2
    errors, warned, cfg = problems({**defaults, **overrides}, defaults, app or "the package", nodes)
    for message in warned:
        print(f"flower-pfl: warning: {message}", file=sys.stderr)
    for message in errors:
        print(f"flower-pfl: {message}", file=sys.stderr)
    if cfg is None:
        return 2
    print(f"flower-pfl: the run config is good: {cfg.label} on {cfg.dataset} ({cfg.model}), {counted(cfg.num_rounds, 'round')}, "
          f"{counted(cfg.clients_per_round, 'client')} per round")
    return 0


if __name__ == "__main__":
    sys.exit(main())
