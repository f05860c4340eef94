"""The package's ServerApp and ClientApp reading image files a benchmark wrote (random pixels in a data
set's layout, ``benchmarks.client_speed.write_cifar100``) under ``flwr run``.

torchvision checks CIFAR's files against their md5 sums, which written files cannot match;
``benchmarks.client_speed.written_cifar`` lifts that check in the benchmark's own process only, and the
processes of a ``flwr run`` (the ServerApp's, the Ray actors hosting the ClientApp) import this module
instead: the same check, that the files exist, in each of them. Its ClientApp's handlers are its own,
calling the package's: Ray hands the ClientApp to its actors by reference to the module of its functions,
so the package's ClientApp re-exported would never import this module there. Everything else is the
package's code.
``benchmarks/flwr_floor.py`` copies this file into an app folder (``benchmarks.speed.module_app``).
"""

from __future__ import annotations

import os

from flwr.app import Context, Message
from flwr.clientapp import ClientApp

from client_apps import app as package
from server_apps.app import app as serverapp


def exists(path: str, md5: str | None = None) -> bool:
    return os.path.isfile(path)


try:
    from torchvision.datasets import cifar
except ImportError:  # no torchvision: the package names the missing extra itself
    pass
else:
    cifar.check_integrity = exists

# module-level handlers: Ray pickles the ClientApp by reference to the module its functions live in, so
# each actor imports this module (and lifts the check) before the package's handler runs
clientapp = ClientApp()


@clientapp.train()
def train(msg: Message, context: Context) -> Message:
    return package.train(msg, context)


@clientapp.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    return package.evaluate(msg, context)


@clientapp.query()
def query(msg: Message, context: Context) -> Message:
    return package.query(msg, context)


__all__ = ["clientapp", "serverapp"]
