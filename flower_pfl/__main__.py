"""``python -m flower_pfl <tool> [arguments]``: the package's command-line tools (``flower_pfl.tools``)."""

from __future__ import annotations

import importlib
import sys

TOOLS = {
    "sweep": "run methods × settings × seeds and report them",
    "compare": "tables and learning curves of finished runs",
    "superlink": "start (and wait for), status or stop of the local SuperLink that flwr run uses",
    "credentials": "TLS certificates and SuperNode keys for a deployment",
    "methods": "the method table: every run-config method and its hyperparameters",
    "data": "the data set table: every run-config dataset, its samples, partitions, files and keys",
    "models": "the model table: every run-config model, its parameters and keys, and the methods that refuse some",
    "check": "check a run config before flwr run starts it",
}


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] not in TOOLS:
        print("usage: python -m flower_pfl <tool> [arguments]\n\ntools:")
        for name, what in TOOLS.items():
            print(f"  {name:12} {what}")
        return 0 if args and args[0] in ("-h", "--help") else 2
    tool, rest = args[0], args[1:]
    if tool in ("methods", "data", "models"):
        from flower_pfl.experiment import tables
        from flower_pfl.methods.registry import method_table

        print({"methods": method_table, "data": tables.data_table,
               "models": lambda: tables.model_table() + "\n\n" + tables.refusals_table()}[tool]())
        return 0
    result = importlib.import_module(f"flower_pfl.tools.{tool}").main(rest)
    return int(result or 0)


if __name__ == "__main__":
    sys.exit(main())
