"""``python -m flower_pfl <tool> [arguments]``: the package's command-line tools (``flower_pfl.tools``)."""

from __future__ import annotations

import importlib
import sys

TOOLS = {
    "sweep": "run methods × settings × seeds and report them",
    "compare": "tables and learning curves of finished runs",
    "superlink": "status or stop of the local SuperLink that flwr run started",
    "credentials": "TLS certificates and SuperNode keys for a deployment",
    "methods": "the method table: every run-config method and its hyperparameters",
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
    if tool == "methods":
        from flower_pfl.methods.registry import method_table

        print(method_table())
        return 0
    result = importlib.import_module(f"flower_pfl.tools.{tool}").main(rest)
    return int(result or 0)


if __name__ == "__main__":
    sys.exit(main())
