"""``results/table.md`` from ``results/<setting>.json`` and the explanations in ``explanations.py``."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.reference.explanations import EXPLANATIONS, SETTING_NOTES

LIBS = ("package", "pfllib", "flbench", "ifca-authors")
REFERENCES = LIBS[1:]
HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
ORDER = ["fedavg", "local", "fedrep", "lgfedavg", "fedrod", "fedbabu", "fedbn", "fedfomo", "apple", "fedala", "pfedhn",
         "ifca", "ifca-full-batch", "cfl", "fedproto", "feddyn", "moon", "knnper", "apfl",
         "fedcp", "gpfl", "feddbe", "fedpac", "fedas", "pfedsim", "pfedla", "elastic", "fedcac", "fedphp", "fedlc", "fedgen"]
#: a cell whose library has the method (an entry in ``run.py``'s ``METHODS``) but no recorded run yet
PENDING = "pending"


def pct(r: dict | None, key: str) -> str:
    if r is None:
        return "–"
    if r.get("failed"):
        return "failed"
    v = r.get(key)
    return "–" if v is None else f"{100 * v:.1f}"


def cell(r: dict | None) -> str:
    if r is None:
        return "–"
    if r.get("failed"):
        return "failed"
    text = f"{pct(r, 'final_weighted')} / {pct(r, 'best_weighted')}"
    if r.get("library") != "package" and r.get("final_mean") is not None:  # the launchers' client mean (README.md)
        text += f" (mean {pct(r, 'final_mean')} / {pct(r, 'best_mean')})"
    return text


#: per method and reference: the package's figure that the reference reports (default: the model's accuracy)
COMPARE = {"fedproto": {"pfllib": "prototype-accuracy_weighted"}}


def package_final(pkg: dict, method: str, lib: str) -> float:
    key = COMPARE.get(method, {}).get(lib)
    return pkg[key][-1] if key else pkg["final_weighted"]


def gap(runs: dict, method: str) -> float | None:
    """Largest |difference| of the final accuracies, this package against each reference (points); where
    a reference reports another figure than the model's accuracy (``COMPARE``), the package's same figure."""
    pkg = runs.get("package")
    if not pkg or pkg.get("failed"):
        return None
    diffs = [abs(100 * (package_final(pkg, method, lib) - r["final_weighted"]))
             for lib in REFERENCES if (r := runs.get(lib)) and not r.get("failed")]
    return max(diffs, default=None)


def package_cell(pkg: dict | None) -> str:
    text = cell(pkg)
    if pkg and not pkg.get("failed") and (proto := pkg.get("prototype-accuracy_weighted")):
        text += f" (prototype-accuracy {100 * proto[-1]:.1f} / {100 * max(proto):.1f})"
    return text


def authors_cell(r: dict | None) -> str:
    """The IFCA authors' code: the paper's protocol (each client's cluster chosen on its training data), and in
    brackets the authors' own printed test figure (cluster chosen on the test data)."""
    text = cell(r)
    if r and not r.get("failed") and "authors_test_chosen_final" in r:
        text += f" (authors' figure {pct(r, 'authors_test_chosen_final')} / {pct(r, 'authors_test_chosen_best')})"
    return text


def seeds_note(runs: dict) -> str:
    """The finals of the runs with other seeds (same data), each library's in seed order; the seeds are named
    once when every library has the same ones, else with each library's figures."""
    names = {"package": "this package", "pfllib": "PFLlib", "flbench": "FL-bench", "ifca-authors": "the authors' code"}
    found = []
    for lib in LIBS:
        seeded = sorted((int(k.removeprefix(lib + "-seed")), r) for k, r in runs.items()
                        if k.startswith(lib + "-seed") and not r.get("failed"))
        if seeded:
            found.append((names[lib], [s for s, _ in seeded], ", ".join(f"{100 * r['final_weighted']:.1f}" for _, r in seeded)))
    if not found:
        return ""
    if len({tuple(seeds) for _, seeds, _ in found}) == 1:
        return f"final with seeds {', '.join(map(str, found[0][1]))} (same data): " + "; ".join(f"{n} {f}" for n, _, f in found)
    return "final with other seeds (same data): " + "; ".join(
        f"{n} (seeds {', '.join(map(str, seeds))}) {f}" for n, seeds, f in found)


def write_table(specs: dict[str, set[str]] | None = None) -> str:
    """``specs``: per method, the libraries that have it (``run.py``'s ``METHODS``); their cells without a recorded
    run read *pending* (a method whose package side, or a reference's run, is still to come)."""
    specs = specs or {}

    def expected(method: str, lib: str, text: str) -> str:
        return PENDING if text == "–" and lib in specs.get(method, set()) else text

    lines = ["# This package vs PFLlib vs FL-bench on the same data", "",
             "Test accuracy in %, **sample-weighted** over all clients (correct / test samples pooled: the figure "
             "PFLlib and FL-bench report), *final* = last evaluation, *best* = best evaluation of the run; "
             "`pkg mean` = this package's unweighted mean over clients (the papers' figure), final / best. "
             "In a reference's cell, *mean* = its unweighted mean over clients, final / best, where recorded. "
             "*gap* = largest |final − final| between this package and a reference (points). *pending*: the library has "
             "the method but its run is not recorded yet (a method still to be added to this package). One seed (0) per "
             "library unless noted; each library draws its own client sample and initial model. PFLlib's seed changes "
             "only its client sample (it seeds torch with 0 itself), so its seeds share the initial model, the minibatch "
             "order and every torch draw; rows named *-pfllib-torch-seeds vary those too. "
             "*IFCA authors' code*: Ghosh et al.'s `mnist/train_cluster_mnist.py` (neither PFLlib nor FL-bench has IFCA), "
             "every client's test split with the cluster its training data chose (the paper's protocol, as this package); "
             "in brackets the authors' printed figure (cluster chosen by the loss on the test data). "
             "How to reproduce: `benchmarks/reference/README.md`.", ""]
    for path in sorted(RESULTS.glob("*.json")):
        data = json.loads(path.read_text())
        setting, methods = data["setting"], data.get("methods", {})
        rc = data["run_config"]
        lines += [f"## {setting}", "", SETTING_NOTES.get(setting, ""), "",
                  f"Settings: {data['num_nodes']} clients, {rc['clients-per-round']} per round, {rc['num-rounds']} rounds, "
                  f"{rc['local-steps']} local steps (= 1 epoch of {rc['train-samples-per-client']} samples, batch "
                  f"{rc['batch-size']}), lr {rc['lr']}, model {rc['model']}, evaluation every {rc['eval-every']} rounds.", "",
                  "| method | this package final / best | pkg mean | PFLlib final / best | FL-bench final / best | "
                  "IFCA authors' code final / best | gap | explanation |",
                  "|---|---|---|---|---|---|---|---|"]
        names = [m for m in ORDER if m in methods] + sorted(m for m in methods if m not in ORDER)
        for m in names:
            runs = methods[m]
            pkg = runs.get("package")
            mean = f"{pct(pkg, 'final_mean')} / {pct(pkg, 'best_mean')}" if pkg and not pkg.get("failed") else "–"
            mean = expected(m, "package", mean)
            g = gap(runs, m)
            note = EXPLANATIONS.get((setting, m), "")
            if (s := seeds_note(runs)):
                note = f"{note} ({s})" if note else s
            lines.append(f"| {m} | {expected(m, 'package', package_cell(pkg))} | {mean} | "
                          f"{expected(m, 'pfllib', cell(runs.get('pfllib')))} | {expected(m, 'flbench', cell(runs.get('flbench')))} | "
                          f"{expected(m, 'ifca-authors', authors_cell(runs.get('ifca-authors')))} | "
                          f"{'–' if g is None else f'{g:.1f}'} | {note} |")
        lines.append("")
    text = "\n".join(lines)
    (RESULTS / "table.md").write_text(text)
    return text
