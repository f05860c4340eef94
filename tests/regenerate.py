"""Writes what is derived from the declarations, and says what changed: ``pyproject.toml``'s method,
data set and model keys (Flower reads the run config's keys and defaults from there;
``flower_pfl.experiment.declared``) and every registry entry's recorded short run
(``tests/methods/recorded.json``, ``tests/methods/runs.py``). Run it after adding or changing a
method, a data set or a model family (``docs/adding-a-method.md``, ``docs/adding-a-data-set.md``,
``docs/adding-a-model.md``)::

    python -m tests.regenerate

Tests fail, naming this command, while either is stale.
"""

from __future__ import annotations

from pathlib import Path

from flower_pfl.experiment.declared import with_declared_blocks
from tests.methods.runs import record

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"


def main() -> None:
    text = PYPROJECT.read_text()
    derived = with_declared_blocks(text)
    PYPROJECT.write_text(derived)
    print("pyproject.toml:", "unchanged" if derived == text else "declared keys rewritten")
    record()


if __name__ == "__main__":
    main()
