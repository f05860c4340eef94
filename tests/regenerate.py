"""Writes what is derived from the method declarations, and says what changed: ``pyproject.toml``'s
method keys (Flower reads the run config's keys and defaults from there;
``flower_pfl.methods.registry.run_config_block``) and every registry entry's recorded short run
(``tests/methods/recorded.json``, ``tests/methods/runs.py``). Run it after adding or changing a
method (``docs/adding-a-method.md``)::

    python -m tests.regenerate

Tests fail, naming this command, while either is stale.
"""

from __future__ import annotations

from pathlib import Path

from flower_pfl.methods.registry import with_run_config_block
from tests.methods.runs import record

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"


def main() -> None:
    text = PYPROJECT.read_text()
    derived = with_run_config_block(text)
    PYPROJECT.write_text(derived)
    print("pyproject.toml:", "unchanged" if derived == text else "method keys rewritten")
    record()


if __name__ == "__main__":
    main()
