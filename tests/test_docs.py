"""The documentation (README.md and docs/) stays true to the code: every ``flwr run`` command it shows
sets only keys its app's run config accepts, to values the package's own parser accepts (a renamed or
misspelt key fails here), and only Flower's federation-config keys; every ``--set`` of a sweep command
names a run-config key; every relative link points at a file of the repository (or a page that
``docs/hooks.py`` makes) and, for a hand-written page, at one of its headings; and the site builds
with ``mkdocs build --strict`` (in this process, into a temporary folder)."""

from __future__ import annotations

import importlib.util
import re
import shlex
import tomllib
import unicodedata
from dataclasses import fields
from pathlib import Path

import pytest

from client_apps.flower_internals import parse_config_args
from flower_pfl.experiment.config import ConfigError, ExperimentConfig
from flower_pfl.experiment.declared import declared_specs

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
#: the keys of ``flwr run --federation-config`` for a simulation (Flower's ``SimulationConfig``, listed by
#: ``flwr federation simulation-config --help``), with what each value must be
FEDERATION_KEYS = {
    "num-supernodes": lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 1,
    "client-resources-num-cpus": lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 1,
    "client-resources-num-gpus": lambda v: isinstance(v, int | float) and not isinstance(v, bool) and v >= 0,
    "backend": lambda v: v == "ray",
    "verbose": lambda v: isinstance(v, bool),
    "init-args-num-cpus": lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 1,
    "init-args-num-gpus": lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0,
    "init-args-logging-level": lambda v: isinstance(v, str),
    "init-args-log-to-driver": lambda v: isinstance(v, bool),
}
#: keys of a sweep besides the run config's (``flower_pfl.tools.sweep``)
SWEEP_KEYS = {"num-nodes"}

_FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.M | re.S)
_LINK = re.compile(r"\]\(([^)\s]+)\)")


def _name(path: Path) -> str:
    return str(path.relative_to(ROOT))


def _commands(path: Path) -> list[str]:
    """The shell commands in ``path``'s code blocks, continuation lines joined."""
    out = []
    for block in _FENCE.findall(path.read_text()):
        for line in block.replace("\\\n", " ").split("\n"):
            if line.strip() and not line.lstrip().startswith("#"):
                out.append(line)
    return out


def _tokens(command: str) -> list[str]:
    lexer = shlex.shlex(command, posix=True, punctuation_chars=";&|")
    lexer.whitespace_split = True
    lexer.commenters = "#"
    return list(lexer)


def _flwr_runs(command: str) -> list[list[str]]:
    """The arguments after ``flwr run`` of each ``flwr run`` in ``command``."""
    if "flwr run" not in command:
        return []
    tokens = _tokens(command)
    runs = []
    for i in range(len(tokens) - 1):
        if tokens[i] == "flwr" and tokens[i + 1] == "run":
            end = next((j for j in range(i + 2, len(tokens)) if tokens[j] in (";", "&&", "||", "|", "&")), len(tokens))
            runs.append(tokens[i + 2:end])
    return runs


def _options(args: list[str], name: str) -> list[str]:
    return [args[i + 1] for i in range(len(args) - 1) if args[i] == name]


def _app_config(app: str) -> dict[str, object]:
    """The run config (``[tool.flwr.app.config]``) of the app at ``app`` (a folder of this repository)."""
    pyproject = ROOT / app / "pyproject.toml"
    assert pyproject.exists(), f"`flwr run {app}`: no app at {app}"
    return tomllib.loads(pyproject.read_text())["tool"]["flwr"]["app"]["config"]


def _package_keys() -> set[str]:
    """The run-config keys of this package under their current names (no earlier names)."""
    general = {f.name.replace("_", "-") for f in fields(ExperimentConfig) if f.name != "options"}
    return general | set(declared_specs())


FLWR_RUNS = [(path, args) for path in PAGES for command in _commands(path) for args in _flwr_runs(command)]


def test_the_documentation_shows_flwr_run_commands():
    assert any(path.name == "README.md" for path, _ in FLWR_RUNS) and len(FLWR_RUNS) >= 10


@pytest.mark.parametrize("path,args", FLWR_RUNS, ids=[f"{_name(p)}:{' '.join(a)[:60]}" for p, a in FLWR_RUNS])
def test_flwr_run_commands_set_keys_the_run_config_accepts(path, args):
    app = args[0] if args and not args[0].startswith("-") else "."  # `flwr run [APP] [FEDERATION] [OPTIONS]`
    defaults = _app_config(app)
    overrides = parse_config_args(_options(args, "--run-config"))
    where = f"{_name(path)}: flwr run {' '.join(args)}"
    unknown = sorted(set(overrides) - set(defaults))
    assert not unknown, f"{where}: {unknown} are not keys of {app}/pyproject.toml's [tool.flwr.app.config]"
    if (ROOT / app).resolve() == ROOT:
        renamed = sorted(set(overrides) - _package_keys())
        assert not renamed, f"{where}: {renamed} are earlier names or unknown to flower_pfl.experiment.config"
        try:
            ExperimentConfig.from_mapping({**defaults, **overrides})
        except ConfigError as err:
            pytest.fail(f"{where}: {err}")
    federation = parse_config_args(_options(args, "--federation-config"))
    for key, value in federation.items():
        assert key in FEDERATION_KEYS, f"{where}: '{key}' is not a key of Flower's --federation-config"
        assert FEDERATION_KEYS[key](value), f"{where}: --federation-config {key}={value!r} is not allowed"


SWEEPS = [(path, command) for path in PAGES for command in _commands(path) if "flower_pfl sweep" in command]


@pytest.mark.parametrize("path,command", SWEEPS, ids=[f"{_name(p)}:{c.strip()[:60]}" for p, c in SWEEPS])
def test_sweep_commands_set_run_config_keys(path, command):
    tokens = _tokens(command)
    keys = [tokens[i + 1].split("=", 1)[0] for i in range(len(tokens) - 1) if tokens[i] == "--set"]
    unknown = sorted(set(keys) - _package_keys() - SWEEP_KEYS)
    assert not unknown, f"{_name(path)}: `{command.strip()}` sets {unknown}, which the run config does not have"


def _slug(heading: str) -> str:
    """A heading's anchor, as MkDocs (Python-Markdown's toc) and GitHub make it for plain headings."""
    text = re.sub(r"[`*_]|\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode()
    return re.sub(r"[-\s]+", "-", re.sub(r"[^\w\s-]", "", text).strip().lower())


def _anchors(path: Path) -> set[str]:
    text = _FENCE.sub("", path.read_text())
    return {_slug(m.group(1)) for m in re.finditer(r"^#{1,6} (.+?)\s*$", text, re.M)}


def _generated() -> set[str]:
    """The pages docs/hooks.py makes (paths in docs/)."""
    spec = importlib.util.spec_from_file_location("docs_hooks", ROOT / "docs" / "hooks.py")
    assert spec is not None and spec.loader is not None
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)
    return hooks.generated_paths()


LINKS = [(path, m.group(1)) for path in PAGES
         for m in _LINK.finditer(re.sub(r"`[^`\n]*`", "", _FENCE.sub("", path.read_text())))
         if not re.match(r"^[a-z][a-z0-9+.-]*:", m.group(1))]


def test_the_documentation_has_relative_links():
    assert any(path.name == "README.md" for path, _ in LINKS) and len(LINKS) >= 50


def test_relative_links_point_at_files_that_exist():
    generated = {ROOT / "docs" / path for path in _generated()}
    broken = []
    for path, target in LINKS:
        file, _, anchor = target.partition("#")
        resolved = (path.parent / file).resolve() if file else path
        if resolved in generated:
            continue
        if not resolved.exists():
            broken.append(f"{_name(path)}: {target} (no such file)")
        elif anchor and resolved.suffix == ".md" and anchor not in _anchors(resolved):
            broken.append(f"{_name(path)}: {target} (no heading with that anchor)")
    assert not broken, "broken links:\n" + "\n".join(broken)


def test_the_site_builds_strictly(tmp_path):
    pytest.importorskip("mkdocs", reason="mkdocs is not installed: pip install -e '.[docs]' (the dev extra has it)")
    from mkdocs.commands.build import build
    from mkdocs.config import load_config

    config = load_config(config_file=str(ROOT / "mkdocs.yml"), site_dir=str(tmp_path / "site"), strict=True)
    build(config)  # raises mkdocs.exceptions.Abort on any warning (strict)
    assert (tmp_path / "site" / "methods" / "fedmcsa" / "index.html").exists()
    assert (tmp_path / "site" / "repo" / "benchmarks" / "results" / "all_methods" / "curves.png").exists()
