"""The pages of this documentation that come from the code and the recorded results, made when the
site is built (an mkdocs hook, named in ``mkdocs.yml``); nothing here is written twice by hand.

- ``methods/<name>.md``: one page per method, from the registry (``flower_pfl.methods.registry``):
  the method's module and class docstrings (the paper's equations), its hyperparameters with their
  run-config keys, types, defaults and allowed values (``flower_pfl.engine.params.param_specs``),
  its client algorithm (``flower_pfl.engine.client_algorithm``: what a client must do, and what the method
  becomes when a client does not), and its rows of the recorded benchmark tables
  (``benchmarks/results/all_methods/table.md``, ``benchmarks/reference/results/table.md``) with
  links to the benchmark pages whose front matter names it (``methods: [...]``). The pages are
  added to the nav's "Methods" section, grouped as the registry groups them, and the method table
  (``registry.method_table``) is appended to ``methods/index.md``.
- ``api/*.md``: the API reference (mkdocstrings) of ``strategies``, ``strategies.message``, every
  module of ``flower_pfl.methods`` and the modules a strategy or method author uses, added to the
  nav's "API reference" section.
- ``benchmarks/reference.md``: ``benchmarks/reference/README.md`` followed by its results table.
- The data set table (``data.md``), the model table and the methods that refuse some models
  (``models.md``), from their registries (``flower_pfl.experiment.tables``); every method against
  Flower's privacy mechanisms (``privacy.md``), from the methods' declarations.
- Links from a page to a file of the repository outside ``docs/`` (the benchmark figures) are
  written as on GitHub (``../../benchmarks/results/all_methods/curves.png``); the file is copied
  into the site under ``repo/`` and the link pointed at the copy.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import posixpath
import re
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

#: the copies of repository files outside docs/ live under this folder of the site
COPIES = "repo"
#: Markdown files outside docs/ that a page of the site stands for
MARKDOWN_PAGES = {
    "README.md": "index.md",
    "benchmarks/reference/README.md": "benchmarks/reference.md",
    "benchmarks/reference/results/table.md": "benchmarks/reference.md#results",
    "benchmarks/results/all_methods/table.md": "benchmarks/all-methods.md",
}
ALL_METHODS_TABLE = "benchmarks/results/all_methods/table.md"
REFERENCE_TABLE = "benchmarks/reference/results/table.md"
REFERENCE_README = "benchmarks/reference/README.md"
GROUP_TITLES = {"paper": "Papers", "baseline": "Baselines", "flower": "Flower's strategies"}

#: the generated pages: src_uri -> Markdown (made in on_config)
_pages: dict[str, str] = {}
#: Markdown appended to hand-written pages: src_uri -> Markdown
_appended: dict[str, str] = {}
#: Markdown that replaces ``<!-- generated: NAME -->`` in a hand-written page: NAME -> Markdown
_generated: dict[str, str] = {}
_PLACEHOLDER = re.compile(r"<!-- generated: ([\w-]+) -->")

_LINK = re.compile(r"(\]\()([^)\s]+)(\))")
_FENCE = re.compile(r"^(```|~~~).*?^\1[ \t]*$", re.M | re.S)


# --- Markdown from docstrings and tables ---------------------------------------------------------

#: characters that only equations hold (Greek letters, operators, super- and subscript digits)
_MATH_CHARS = re.compile(r"[\u0370-\u03ff\u2100-\u214f\u2190-\u22ff\u00b2\u00b3\u00b7\u00b9\u2070-\u209f\u2016\u2212]")
#: what only code holds: snake_case, hyphenated keys, attribute access, quotes, keyword arguments
_CODE = re.compile(r"[a-z]{2,}_[a-z]{2,}|[A-Za-z]-[A-Za-z]|\w\.\w|(?<![A-Za-z])'|\"|\w=\w|^[A-Za-z]{2,}\w*\(|\b(True|False|None)\b")
#: functions TeX knows by name
_TEX_FUNCTIONS = {"cos", "sin", "exp", "log", "max", "min", "arg", "det", "sup", "inf"}


def is_math(text: str) -> bool:
    """Whether a docstring's ````...```` span is an equation (``w_i = Σ_j ξ_ij w_j``) rather than code
    (``fedmcsa-lambda``, ``all_clients_train``): it holds a Greek letter, an operator or a one-letter
    subscript, and nothing only code holds."""
    equation = (_MATH_CHARS.search(text) or re.search(r"\b[A-Za-z]_(\{|[A-Za-z0-9]{1,3}\b)|[A-Za-z)]\^", text)
                or re.fullmatch(r"[A-Za-z]'*", text))
    return bool(equation) and not _CODE.search(text)


def tex(text: str) -> str:
    """An equation as the docstrings write it (Unicode, ``softmax_k``, ``||w||``) as TeX for MathJax:
    words in upright type, norms and absolute values with their TeX bars."""
    def word(m: re.Match[str]) -> str:
        w = m.group(0)
        return f"\\{w}" if w in _TEX_FUNCTIONS else f"\\mathrm{{{w}}}"

    out = text.replace("||", "‖").replace("|", "\\vert ").replace("%", "\\%").replace("#", "\\#").replace("&", "\\&")
    out = re.sub(r"(?<![\\A-Za-z])[A-Za-z]{3,}", word, out)  # two letters stay indices (s_ij) or symbols
    out = re.sub(r"_([A-Za-z]{2})(?![A-Za-z{])", r"_{\1}", out)
    return re.sub(r"_(\\mathrm\{\w+\}|\\\w+)", r"_{\1}", out)


def docstring_md(doc: str) -> str:
    """A docstring as Markdown: an equation as math (``$...$``, rendered by MathJax), other ``code`` as
    `code`, a blank line before a list."""
    def span(m: re.Match[str]) -> str:
        text = m.group(1)
        return f"${tex(text)}$" if is_math(text) else f"`{text}`"

    text = re.sub(r"``(.+?)``", span, inspect.cleandoc(doc), flags=re.S)
    out: list[str] = []
    for line in text.split("\n"):
        if line.startswith("- ") and out and out[-1].strip() and not out[-1].startswith(("- ", "  ")):
            out.append("")
        out.append(line)
    return "\n".join(out)


def cell(text: Any) -> str:
    """``text`` on one line for a table cell: pipes escaped, except in code spans, where they are text."""
    parts = re.split(r"(`[^`]*`)", " ".join(str(text).split()))
    return "".join(part if part.startswith("`") else part.replace("|", "\\|") for part in parts)


def value_text(value: Any) -> str:
    """A default as it is written in the run config (TOML)."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, str):
        return f'"{value}"'
    return repr(value)


def untitled(paragraph: str, title: str) -> str:
    """``paragraph`` without a leading ``"<title>: "`` (the page's title already says it), capitalised."""
    text = paragraph.removeprefix(f"{title}: ") if paragraph.startswith(f"{title}: ") else paragraph
    return text[:1].upper() + text[1:]


def first_paragraph(doc: str | None) -> str:
    return " ".join(inspect.cleandoc(doc or "").split("\n\n")[0].split())


def read_tables(path: Path) -> list[dict[str, Any]]:
    """The Markdown tables of a results file: each with the section heading above it, the lines of
    text between that heading and the table, its header row and its rows (cells split)."""
    tables: list[dict[str, Any]] = []
    section, text, current = "", [], None
    for line in path.read_text().splitlines():
        if line.startswith("|"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if current is None:
                current = {"section": section, "text": list(text), "header": line, "cells": cells, "rows": []}
                tables.append(current)
            elif not set(line.replace("|", "").strip()) <= set("-: "):
                current["rows"].append((line, cells))
            continue
        current = None
        if line.startswith("#"):
            section, text = line.lstrip("#").strip(), []
        elif line.strip():
            text.append(line.strip())
    return tables


def rows_for(tables: list[dict[str, Any]], column: str, labels: Iterable[str], prefix: bool = False) -> list[tuple[dict[str, Any], list[str]]]:
    """Per table, the rows whose ``column`` names one of ``labels`` (or, with ``prefix``, a variant
    of one: ``knnper-knn-only`` for ``knnper``)."""
    labels = tuple(labels)
    out = []
    for table in tables:
        lowered = [c.lower() for c in table["cells"]]
        if column not in lowered:
            continue
        i = lowered.index(column)
        rows = [line for line, cells in table["rows"] if len(cells) > i and
                (cells[i] in labels or (prefix and cells[i].startswith(tuple(f"{label}-" for label in labels))))]
        if rows:
            out.append((table, rows))
    return out


def table_md(table: dict[str, Any], rows: list[str]) -> str:
    width = len(table["cells"])
    return "\n".join([table["header"], "|" + "---|" * width, *rows])


# --- the method pages ------------------------------------------------------------------------------

def _method_modules() -> list[Any]:
    package = importlib.import_module("flower_pfl.methods")
    return [importlib.import_module(f"flower_pfl.methods.{info.name}") for info in pkgutil.iter_modules(package.__path__)]


def method_pages() -> list[dict[str, Any]]:
    """The method pages in the registry's order, one per declaration (a method class, or one of Flower's
    methods) with the entries it runs: path, title, nav title, group, module, declaration, entries."""
    from flower_pfl.methods import registry

    declared_in = {id(obj): module for module in _method_modules() for obj in vars(module).values()}
    pages: dict[int, dict[str, Any]] = {}
    for e in registry.entries():
        decl = e.declaration
        if id(decl) not in pages:
            title = decl.summary().split(":")[0]
            pages[id(decl)] = {"path": f"methods/{decl.name}.md", "title": title, "nav": title.split(" (")[0],
                               "group": decl.group, "module": declared_in[id(decl)], "declaration": decl, "entries": []}
        pages[id(decl)]["entries"].append(e)
    return list(pages.values())


def params_table(specs: list[Any], annotation: Any = None) -> str:
    rows = ["| run-config key | argument | type | default | allowed | what it sets |", "|---|---|---|---|---|---|"]
    for s in specs:
        kind = annotation(s.name) if annotation is not None else s.type.__name__
        doc = s.doc + "".join(f" (earlier name `{old}`, still read with a warning)" for old in s.old_keys)
        key = f"`{s.key}`" if s.key else "none (constructor only)"
        allowed = s.must.text if s.must is not None else "any"
        rows.append(f"| {key} | `{s.name}` | {cell(f'`{kind}`')} | {cell(f'`{value_text(s.default)}`')} | {cell(allowed)} | {cell(doc)} |")
    return "\n".join(rows)


def entries_table(entries: list[Any]) -> str:
    rows = ["| run config | strategy classes | fixes | run-config keys it reads |", "|---|---|---|---|"]
    for e in entries:
        config = f'`method = "{e.method}"`' + (f', `aggregation = "{e.aggregation}"`' if e.aggregation != "default" else "")
        classes = f"`strategies.{e.strategy}`, `strategies.message.{e.strategy}`"
        fixed = ", ".join([*(f"`{k} = {v!r}`" for k, v in e.fixed.items()),
                           *(f"`{k}` from `{key}`" for k, key in e.keys.items()),
                           *(f"`{k}` = {m.__name__} from its keys" for k, m in e.uses.items())]) or "nothing"
        keys = ", ".join(f"`{k}`" for k in e.run_config_keys()) or "none"
        rows.append(f"| {config} | {classes} | {cell(fixed)} | {keys} |")
    return "\n".join(rows)


def _ignored_text(method: Any, algorithm: Any) -> str:
    """What ``method`` (a server algorithm) becomes when a plain client ignores ``algorithm``."""
    if algorithm.reply_keys:
        keys = ", ".join(f"`{k}`" for k in algorithm.reply_keys)
        return f"its replies lack {keys}: every update is refused and the run ends with `ClientAlgorithmNotRun` saying why"
    return f"{type(method).__name__} {method.ignored_algorithm_consequence(algorithm)}; the strategy warns once, naming the fix"


def contract_md(decl: Any, entries: list[Any]) -> str:
    """What a client of ``decl`` (a ``Method`` class) must do, from its client algorithm's declaration."""
    from flower_pfl.engine.client_algorithm import ClientAlgorithm

    algorithm = decl.client
    lines = ["## Client contract", ""]
    if algorithm is ClientAlgorithm:
        lines += ["Plain local SGD on the received model (the instructions name `client-algorithm` = `sgd`): a client owes "
                  "it what it owes Flower's FedAvg (the trained model and `num-examples`), and any ClientApp that trains the "
                  "received model runs it; nothing to ignore."]
    else:
        lines += [f"- **Client algorithm**: `{algorithm.__name__}` (`{algorithm.__module__}`), which the instructions name "
                  f"`client-algorithm` = `{algorithm.name}`: {docstring_md(first_paragraph(algorithm.__doc__))}"]
        if algorithm.receipt() is not None and not algorithm.reply_keys:
            lines += [f"- **Receipt**: the reply carries `client-algorithm` = `{algorithm.name}` (what `algorithm.finish(...)` "
                      "returns), which shows the client ran it."]
        if algorithm.reply_keys:
            lines += [f"- **Sent back** besides the model: {', '.join(f'`{k}`' for k in algorithm.reply_keys)}."]
        if algorithm.hookable:
            lines += ["- **In your own training loop**: `client_apps.own_loop.algorithm_for(config, model, context.state)` "
                      "hands out the algorithm; call `algorithm.adjust_gradients(model, (x, y))` before each "
                      "`optimizer.step()` and send what `algorithm.finish(model, x_train)` returns with the reply."]
        else:
            lines += ["- **Only the package's ClientApp** (`client_apps.app`) runs it: it trains a second model or takes a "
                      "second minibatch per step, which is not a hook on one loop."]
        if algorithm.needs_plain_sgd:
            lines += ["- Its arithmetic assumes **plain SGD steps** of the instruction's `lr` (no momentum, weight decay, "
                      "schedule or clipping); `algorithm_for` checks the optimizer you pass."]
        if algorithm.needs_state or algorithm.keeps_state:
            lines += ["- It keeps **state between rounds** in `context.state` (written to the node's disk for resumed "
                      "runs, see [Checkpoints and resume](../checkpoints.md))."]
        lines += [f"- **If a plain client ignores it**: {_ignored_text(decl(), algorithm)}."]
    others = [(e, made) for e in entries if (made := entry_method(e).client_algorithm()) is not algorithm]
    if others:
        lines += ["- Other run-config values name another client algorithm: " + ", ".join(
            f"`{e.label}` names `{made.name}` (`{made.__name__}`)" for e, made in others) + "."]
    lines += ["", "The whole contract, for every method: [the client contract, method by method](../client-contract.md)."]
    return "\n".join(lines)


def unbatched_md() -> str:
    """The client algorithms whose clients train one by one in process, and why (``flower_pfl.engine.batched``)."""
    from flower_pfl.engine.batched import unbatched
    from flower_pfl.experiment.models import build_model
    from flower_pfl.methods import registry

    model = build_model("dnn", (60,), 10)
    users: dict[Any, list[str]] = {}
    for e in registry.entries():
        if not e.builtin:
            users.setdefault(entry_method(e).client_algorithm(), []).append(e.label)
    rows = ["| client algorithm | run-config values | why one by one |", "|---|---|---|"]
    for algorithm, labels in users.items():
        if (why := unbatched(algorithm, model)) is not None:
            rows.append(f"| `{algorithm.__name__}` | {', '.join(f'`{label}`' for label in labels)} | {cell(why)} |")
    return "\n".join(rows) if len(rows) > 2 else "(none: every registry entry's client algorithm trains as one computation)"


def entry_method(e: Any) -> Any:
    """The server algorithm a registry entry builds with the run config's defaults."""
    from flower_pfl.experiment.config import ExperimentConfig

    return e.declaration(**e.arguments(ExperimentConfig().to_run_config()))


def contract_table_md() -> str:
    """Every run-config method's client algorithm, as its instructions name it, and what a plain client
    that ignores it changes (``docs/client-contract.md``)."""
    from flower_pfl.methods import registry

    rows = ["| run config | client algorithm (`client-algorithm`) | in your own loop | sent back besides the model | "
            "if a plain client ignores it |", "|---|---|---|---|---|"]
    for e in registry.entries():
        config = f"`{e.method}`" + (f" + `{e.aggregation}`" if e.aggregation != "default" else "")
        if e.builtin:
            named = "`proximal` (by Flower's own key `proximal-mu`)" if e.method in ("fedprox", "fedmcsa") else "`sgd` (plain)"
            rows.append(f"| {config} | {named} | any loop | nothing | nothing to ignore (Flower's own strategy) |")
            continue
        method = entry_method(e)
        algorithm = method.client_algorithm()
        if algorithm.receipt() is None:
            rows.append(f"| {config} | `sgd` (plain) | any loop | nothing | nothing to ignore |")
            continue
        loop = "`algorithm_for` hooks" if algorithm.hookable else "the package's ClientApp only"
        sent = ", ".join(f"`{k}`" for k in algorithm.reply_keys) or "the receipt"
        rows.append(f"| {config} | `{algorithm.name}` (`{algorithm.__name__}`) | {loop} | {sent} | {cell(_ignored_text(method, algorithm))} |")
    return "\n".join(rows)


def privacy_table_md() -> str:
    """Every run-config method against Flower's privacy mechanisms, from its declaration (``has_global_model``,
    ``aggregate_only``) and the reasons the strategies give when they refuse one (``docs/privacy.md``)."""
    from flower_pfl.engine.composition import individual_needs
    from flower_pfl.methods import registry

    rows = ["| run config | strategy | global model (`evaluate_fn`) | central DP wrappers, SecAgg+ | local DP (`LocalDpMod`) | "
            "why refused |", "|---|---|---|---|---|---|"]
    for e in registry.entries():
        config = f"`{e.method}`" + (f" + `{e.aggregation}`" if e.aggregation != "default" else "")
        if e.builtin:
            rows.append(f"| {config} | `{e.strategy}` (Flower's) | yes | yes (Flower's own strategy) | yes | |")
            continue
        decl, sent = e.declaration, entry_method(e).client_algorithm().reply_keys
        local = "yes" + (f"; not {', '.join(f'`{k}`' for k in sent)}" if sent else "")
        why = "" if decl.aggregate_only else cell(individual_needs(decl))
        rows.append(f"| {config} | `{e.strategy}` | {'yes' if decl.has_global_model else 'no'} | "
                    f"{'yes' if decl.aggregate_only else 'refused'} | {local} | {why} |")
    return "\n".join(rows)


#: a client that never trains under Flower's own strategies: the global model they send every client
FLOWER_NEW_CLIENT = "the global model (Flower's strategy sends it to every client)"


def new_clients_table_md() -> str:
    """What every run-config method gives a client that never trains (``ServerAlgorithm.new_client_rule``;
    ``docs/evaluation.md``)."""
    from flower_pfl.methods import registry

    rows = ["| run config | a client that never trains evaluates |", "|---|---|"]
    for e in registry.entries():
        config = f"`{e.method}`" + (f" + `{e.aggregation}`" if e.aggregation != "default" else "")
        rows.append(f"| {config} | {FLOWER_NEW_CLIENT if e.builtin else cell(e.declaration.new_client_rule)} |")
    return "\n".join(rows)


def benchmarks_md(labels: list[str], benchmark_pages: dict[str, dict[str, Any]]) -> str:
    lines = ["## Benchmarks", ""]
    every = rows_for(read_tables(ROOT / ALL_METHODS_TABLE), "method", labels)
    if every:
        lines += [f"[Every method](../benchmarks/all-methods.md) on one setting (Synthetic(0.5, 0.5), DNN, 100 rounds, "
                  f"3 seeds; `{ALL_METHODS_TABLE}`), in %:", ""]
        lines += [table_md(t, rows) + "\n" for t, rows in every]
    reference = rows_for(read_tables(ROOT / REFERENCE_TABLE), "method", labels, prefix=True)
    if reference:
        lines += [f"The [reference check](../benchmarks/reference.md) against PFLlib and FL-bench on the same client "
                  f"splits (`{REFERENCE_TABLE}`), sample-weighted accuracy in %:", ""]
        for t, rows in reference:
            settings = " ".join(line for line in t["text"] if line.startswith("Settings:"))
            lines += [f"Setting `{t['section']}`. {settings}", "", table_md(t, rows), ""]
    papers = [(path, page) for path, page in benchmark_pages.items() if set(page["methods"]) & set(labels)]
    if papers:
        links = ", ".join(f"[{page['title']}](../{path})" for path, page in papers)
        lines += [f"Also in: {links}.", ""]
    if len(lines) == 2:
        lines += ["No recorded benchmark runs it yet.", ""]
    return "\n".join(lines).rstrip() + "\n"


def method_page_md(page: dict[str, Any], benchmark_pages: dict[str, dict[str, Any]]) -> str:
    from flower_pfl.engine.params import annotation_text, param_specs
    from flower_pfl.engine.server_algorithm import GlobalModelAlgorithm, PersonalizedAlgorithm
    from flower_pfl.methods.base import FlowerMethod

    module, decl, entries = page["module"], page["declaration"], page["entries"]
    source = "/".join(module.__name__.split(".")) + ".py"
    out = [f"# {page['title']}", ""]
    if isinstance(decl, FlowerMethod):
        out += [docstring_md(decl.summary()), "",
                f"Flower's own class, re-exported: `strategies.{decl.strategy}` is `flwr.server.strategy.{decl.strategy}` "
                f"and `strategies.message.{decl.strategy}` is `flwr.serverapp.strategy.{decl.strategy}`. The run config maps "
                f"to its constructor in `{source}`.", ""]
        out += ["## Run-config values", "", entries_table(entries), ""]
        out += ["## Hyperparameters", "", params_table(list(decl.params)) if decl.params else "None besides Flower's own.", ""]
        out += ["## Client contract", "", "Flower's: see [the client contract, method by method](../client-contract.md) "
                "(FedProx's client applies `proximal-mu` itself; the package's ClientApp does).", ""]
        out += [benchmarks_md([e.label for e in entries], benchmark_pages)]
        return "\n".join(out)
    server = ("one model per client, kept on the server (`PersonalizedAlgorithm`)" if issubclass(decl, PersonalizedAlgorithm)
              else "one global model (`GlobalModelAlgorithm`)" if issubclass(decl, GlobalModelAlgorithm)
              else "a model made for each client it sends to (`ServerAlgorithm`)")
    per_round = (f"{decl.default_clients_per_round} when a strategy is built without `clients_per_round`"
                 if decl.default_clients_per_round else "Flower's `fraction_train` (all nodes) when a strategy is built without `clients_per_round`")
    summary, _, details = docstring_md(inspect.getdoc(decl) or "").partition("\n\n")
    out += [untitled(summary, page["title"]), "",
            f"- **Strategy classes**: `strategies.{decl.strategy}` (legacy API), `strategies.message.{decl.strategy}` (Message API)",
            f"- **Server**: {server}",
            f"- **Participants per round**: {per_round}",
            f"- **A client that never trains** ([evaluation](../evaluation.md#clients-that-never-train)): evaluates "
            f"{decl.new_client_rule}",
            f"- **Models**: {models_md([e.label for e in entries])}",
            f"- **Source**: `{source}`, class `{decl.__name__}`", ""]
    module_doc = docstring_md(module.__doc__ or "")
    first, _, rest = module_doc.partition("\n\n")
    what = [part for part in (first if not first.startswith(page["title"]) else "", rest, details) if part.strip()]
    if what:
        out += ["## What it does", "", *[f"{part}\n" for part in what]]
    out += ["## Run-config values", "", entries_table(entries), ""]
    out += ["## Hyperparameters", "", "Each is a keyword argument of both strategy classes and, where it has one, a run-config key "
            "([Configuring a run](../configuration.md)).", "",
            params_table(param_specs(decl), lambda name: annotation_text(decl, name)), ""]
    out += [contract_md(decl, entries), ""]
    out += [benchmarks_md([e.label for e in entries], benchmark_pages)]
    return "\n".join(out)


def models_md(labels: list[str]) -> str:
    """Which of the package's models a method's entries run on: all, or all but those they refuse and why."""
    from flower_pfl.experiment.tables import refusals

    refused = {model: needs for label in labels for model, needs in refusals().get(label, {}).items()}
    if not refused:
        return "every model of [Models](../models.md), and models of your own"
    names = ", ".join(f"`{m}`" for m in refused)
    return (f"every model of [Models](../models.md) but {names}, which it refuses before a run starts: it needs "
            f"{'; '.join(dict.fromkeys(refused.values()))}")


def methods_index_md(pages: list[dict[str, Any]]) -> str:
    """Appended to methods/index.md (under its last heading): the registry's method table, each row
    linked to its page."""
    from flower_pfl.methods import registry

    page_of = {id(e): p["path"] for p in pages for e in p["entries"]}
    table = registry.method_table().split("\n")
    rows = [f"| page {table[0]}", f"|---{table[1]}"]
    for e, row in zip(registry.entries(), table[2:], strict=True):
        path = page_of[id(e)]
        rows.append(f"| [{e.label}]({posixpath.basename(path)}) {row}")
    return "\n".join(["", *rows, ""])


def methods_overview_md(pages: list[dict[str, Any]]) -> str:
    """One row per method page: what the method does (its summary) and the client algorithm its
    instructions name (``docs/methods/index.md``)."""
    rows = ["| method | what it does | client algorithm |", "|---|---|---|"]
    for page in pages:
        decl = page["declaration"]
        if page["entries"][0].builtin:
            summary, names = untitled(decl.summary(), page["title"]), ["proximal" if decl.strategy == "FedProx" else "sgd"]
        else:
            summary = untitled(first_paragraph(inspect.getdoc(decl)), page["title"])
            names = list(dict.fromkeys(entry_method(e).client_algorithm().name for e in page["entries"]))
        link = f"[{page['nav']}]({posixpath.basename(page['path'])})"
        rows.append(f"| {link} | {cell(docstring_md(summary))} | {', '.join(f'`{n}`' for n in names)} |")
    return "\n".join(rows)


# --- the reference check's page ---------------------------------------------------------------------

def _demote(text: str, levels: int) -> str:
    return re.sub(r"^(#+) ", lambda m: "#" * (len(m.group(1)) + levels) + " ", text, flags=re.M)


def _relink(text: str, source: str, page: str) -> str:
    """Relative links of ``source`` (a repository path) rewritten for ``page`` (a path in docs/)."""
    def fix(m: re.Match[str]) -> str:
        target = m.group(2)
        if re.match(r"^[a-z]+:|^#|^/", target):
            return m.group(0)
        path, _, anchor = target.partition("#")
        repo_path = posixpath.normpath(posixpath.join(posixpath.dirname(source), path))
        new = posixpath.relpath(repo_path, posixpath.dirname("docs/" + page))
        return m.group(1) + new + ("#" + anchor if anchor else "") + m.group(3)
    return _LINK.sub(fix, text)


def reference_md() -> str:
    readme = (ROOT / REFERENCE_README).read_text()
    table = (ROOT / REFERENCE_TABLE).read_text()
    title, _, readme_body = readme.partition("\n")
    table_title, _, table_body = table.partition("\n")
    page = "benchmarks/reference.md"
    return "\n".join([
        title, "",
        f"This page is `{REFERENCE_README}` followed by its results, `{REFERENCE_TABLE}` (written by "
        "`python benchmarks/reference/run.py --table`), both read when the site is built. The every-method "
        "benchmark these runs were measured beside is [Every method](all-methods.md).", "",
        _relink(readme_body.strip(), REFERENCE_README, page), "",
        "## Results", "", f"### {table_title.lstrip('# ').strip()}", "",
        _demote(_relink(table_body.strip(), REFERENCE_TABLE, page), 1), ""])


# --- the API reference ---------------------------------------------------------------------------------

def api_pages() -> list[tuple[str, str, str, str]]:
    """``(src_uri, nav title, Markdown, one line on the module)`` of every API page."""
    pages = [
        ("api/strategies.md", "strategies", "strategies", "The legacy-API strategies (`flwr.server.strategy.Strategy`)."),
        ("api/strategies-message.md", "strategies.message", "strategies.message",
         "The Message-API strategies (`flwr.serverapp.strategy.Strategy`)."),
        ("api/own-loop.md", "client_apps.own_loop", "client_apps.own_loop",
         "A method's client algorithm in your own training loop (`algorithm_for`)."),
    ]
    for module in sorted(_method_modules(), key=lambda m: m.__name__):
        name = module.__name__
        pages.append((f"api/methods/{name.rsplit('.', 1)[1]}.md", name.rsplit(".", 1)[1], name, first_paragraph(module.__doc__)))
    for name in ("flower_pfl.engine.params", "flower_pfl.engine.server_algorithm", "flower_pfl.engine.client_algorithm",
                 "flower_pfl.engine.store", "flower_pfl.engine.disk_store", "flower_pfl.engine.wire", "flower_pfl.experiment.config", "flower_pfl.run.results"):
        module = importlib.import_module(name)
        pages.append((f"api/{name.split('.', 1)[1].replace('.', '-')}.md", name, name, first_paragraph(module.__doc__)))
    out = []
    for path, nav, module_name, summary in pages:
        options = "\n    options:\n      show_root_heading: false"
        if module_name.startswith("strategies"):
            # the per-method classes get their docstrings (numpy style) and signatures when they are made:
            # read them at run time
            options += "\n      force_inspection: true\n      show_bases: false\n      docstring_style: numpy"
        out.append((path, nav, f"# `{module_name}`\n\n::: {module_name}{options}\n", f"`{module_name}`: {docstring_md(summary)}"))
    return out


def api_index_md(api: list[tuple[str, str, str, str]]) -> str:
    lines = ["# API reference", "",
             "The public modules, from their docstrings. Every strategy class of `strategies` and `strategies.message` "
             "takes its method's hyperparameters (see [Methods](../methods/index.md)) and the options of the generic "
             "strategy (`LegacyMethodStrategy`, `MethodStrategy`).", ""]
    for path, _, _, summary in api:
        name, _, text = summary.partition(": ")
        lines.append(f"- [{name}]({posixpath.relpath(path, 'api')}): {text}")
    return "\n".join(lines) + "\n"


# --- links to repository files outside docs/ ---------------------------------------------------------------

def _outside_docs(page: str, target: str) -> str | None:
    """The repository path a relative link of ``page`` points at when it lies outside docs/."""
    if re.match(r"^[a-z][a-z0-9+.-]*:|^#|^/", target):
        return None
    path = target.split("#", 1)[0]
    repo_path = posixpath.normpath(posixpath.join("docs", posixpath.dirname(page), path))
    if repo_path.startswith(("docs/", "../")) or repo_path == "docs":
        return None
    return repo_path


def _links(markdown: str) -> Iterable[re.Match[str]]:
    fences = [m.span() for m in _FENCE.finditer(markdown)]
    for m in _LINK.finditer(markdown):
        if not any(a <= m.start() < b for a, b in fences):
            yield m


def _rewrite(page: str, markdown: str) -> str:
    def fix(m: re.Match[str]) -> str:
        repo_path = _outside_docs(page, m.group(2))
        if repo_path is None or not (ROOT / repo_path).exists():
            return m.group(0)
        anchor = m.group(2).partition("#")[2]
        if repo_path.endswith(".md"):
            if repo_path not in MARKDOWN_PAGES:
                return m.group(0)  # left for mkdocs to report
            target, _, own = MARKDOWN_PAGES[repo_path].partition("#")
            anchor = anchor or own
        else:
            target = f"{COPIES}/{repo_path}"
        new = posixpath.relpath(target, posixpath.dirname(page) or ".")
        return m.group(1) + new + ("#" + anchor if anchor else "") + m.group(3)

    fences = [m.span() for m in _FENCE.finditer(markdown)]
    return _LINK.sub(lambda m: m.group(0) if any(a <= m.start() < b for a, b in fences) else fix(m), markdown)


def generated_paths() -> set[str]:
    """The pages this hook makes (paths in docs/): relative links to them are valid on the site."""
    return ({page["path"] for page in method_pages()} | {path for path, *_ in api_pages()}
            | {"api/index.md", "benchmarks/reference.md"})


# --- the hooks ---------------------------------------------------------------------------------------------

def _benchmark_pages(docs_dir: Path) -> dict[str, dict[str, Any]]:
    """Benchmark pages whose front matter names methods (``methods: [...]``, registry labels)."""
    from mkdocs.exceptions import PluginError
    from mkdocs.utils.meta import get_data

    from flower_pfl.methods import registry

    labels = {e.label for e in registry.entries()}
    out = {}
    for path in sorted((docs_dir / "benchmarks").glob("*.md")):
        body, meta = get_data(path.read_text())
        methods = meta.get("methods") or []
        unknown = sorted(set(methods) - labels)
        if unknown:
            raise PluginError(f"{path.relative_to(ROOT)}: front matter names methods the registry lacks: {unknown}")
        title = next((line[2:].strip() for line in body.splitlines() if line.startswith("# ")), path.stem)
        title = title.removeprefix("Benchmark: ")
        out[f"benchmarks/{path.name}"] = {"title": title[:1].upper() + title[1:], "methods": methods}
    return out


def _nav_section(nav: list[Any], title: str) -> list[Any]:
    from mkdocs.exceptions import PluginError

    for item in nav:
        if isinstance(item, dict) and title in item:
            return item[title]
    raise PluginError(f"mkdocs.yml's nav has no section {title!r}")


def on_config(config: Any) -> Any:
    _pages.clear()
    _appended.clear()
    docs_dir = Path(config.docs_dir)
    benchmarks = _benchmark_pages(docs_dir)
    pages = method_pages()
    section = _nav_section(config.nav, "Methods")
    for group, title in GROUP_TITLES.items():
        items = [{page["nav"]: page["path"]} for page in pages if page["group"] == group]
        if items:
            section.append({title: items})
    for page in pages:
        _pages[page["path"]] = method_page_md(page, benchmarks)
    _appended["methods/index.md"] = methods_index_md(pages)
    _generated.clear()
    from flower_pfl.experiment import tables

    _generated.update({"methods-overview": methods_overview_md(pages), "client-contract": contract_table_md(),
                       "unbatched": unbatched_md(), "data-table": tables.data_table(), "model-table": tables.model_table(),
                       "model-refusals": tables.refusals_table(), "privacy-table": privacy_table_md(),
                       "new-clients": new_clients_table_md()})
    api = api_pages()
    api_section = _nav_section(config.nav, "API reference")
    methods_api: list[dict[str, str]] = []  # one nav group, where the first method module comes
    for path, nav, text, _ in api:
        _pages[path] = text
        if not path.startswith("api/methods/"):
            api_section.append({nav: path})
        elif not methods_api:
            api_section.append({"flower_pfl.methods": methods_api})
        if path.startswith("api/methods/"):
            methods_api.append({nav: path})
    _pages["api/index.md"] = api_index_md(api)
    _pages["benchmarks/reference.md"] = reference_md()
    return config


def on_files(files: Any, config: Any) -> Any:
    from mkdocs.exceptions import PluginError
    from mkdocs.structure.files import File

    for path, text in _pages.items():
        if files.get_file_from_path(path) is not None:
            raise PluginError(f"docs/{path} is made by docs/hooks.py: remove the file")
        files.append(File.generated(config, path, content=text))
    texts = dict(_pages)
    for f in files.documentation_pages():
        if f.src_uri not in texts and f.abs_src_path is not None:
            texts[f.src_uri] = Path(f.abs_src_path).read_text()
    copied = set()
    for page, text in texts.items():
        for m in _links(text):
            repo_path = _outside_docs(page, m.group(2))
            if repo_path and not repo_path.endswith(".md") and (ROOT / repo_path).is_file() and repo_path not in copied:
                copied.add(repo_path)
                files.append(File.generated(config, f"{COPIES}/{repo_path}", abs_src_path=str(ROOT / repo_path)))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    from mkdocs.exceptions import PluginError

    src = page.file.src_uri
    for name in _PLACEHOLDER.findall(markdown):
        if name not in _generated:
            raise PluginError(f"docs/{src}: no generated Markdown named {name!r} (docs/hooks.py makes {sorted(_generated)})")
    markdown = _PLACEHOLDER.sub(lambda m: _generated[m.group(1)], markdown)
    if src in _appended:
        markdown = markdown.rstrip("\n") + "\n" + _appended[src]
    return _rewrite(src, markdown)
