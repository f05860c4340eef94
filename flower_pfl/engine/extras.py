"""The package's optional parts and the extras that install them.

The core (strategies, client algorithms, the engine, the ServerApp and ClientApp on Synthetic data)
needs Flower, PyTorch, NumPy and safetensors. The data sets and the torchvision models, text's
vocabularies, plots and the command-line tools need more, installed as extras: ``pip install
'flower-pfl[data]'`` (``.[data]`` in a clone), ``[text]`` for a text data set's word vocabulary.
``require`` is called before such an import, so that a missing one stops with the extra to install.
"""

from __future__ import annotations

import importlib.util

#: top-level module -> the extra that installs it
EXTRAS: dict[str, str] = {
    "flwr_datasets": "data", "datasets": "data", "torchvision": "data", "PIL": "data", "scipy": "data",
    "tokenizers": "text",
    "matplotlib": "plots",
    "tqdm": "tools", "cryptography": "tools",
    "faiss": "faiss",
    "ray": "simulation",
    "tensorboard": "tensorboard", "mlflow": "mlflow", "wandb": "wandb",
}


class MissingExtra(ModuleNotFoundError):
    """An optional module is not installed; the message names the extra that installs it."""


def require(*modules: str, why: str = "") -> None:
    """Raise ``MissingExtra`` naming the extra to install if any of ``modules`` (top-level names in
    ``EXTRAS``) cannot be imported; ``why``: what needs it, for the message."""
    for module in modules:
        if importlib.util.find_spec(module) is None:
            extra = EXTRAS[module]
            need = f" ({why})" if why else ""
            raise MissingExtra(f"{module} is not installed{need}: pip install 'flower-pfl[{extra}]' "
                               f"(in a clone of the repository: pip install -e '.[{extra}]')", name=module)
