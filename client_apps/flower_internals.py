"""Every name this project takes from Flower outside Flower's public API, in one place.

Flower's public API here: ``flwr.app``, ``flwr.serverapp`` and ``flwr.clientapp``, ``flwr.server``,
``flwr.client``, ``flwr.common`` (their top levels, and ``flwr.common.logger``), ``flwr.simulation``, the
strategy interfaces (``flwr.server.strategy``, ``flwr.serverapp.strategy``, ``flwr.server.client_proxy``,
``flwr.server.client_manager``, ``flwr.server.criterion``), the legacy workflows (``flwr.server.workflow``)
and the client mods (``flwr.client.mod``, ``flwr.clientapp.mod``). Anything else may move in any release: the
package (the ClientApp, the ServerApp; the strategies need none), its benchmarks and its tests import
it from here, and ``tests/test_flower_internals.py``
imports each name below on the installed Flower and fails naming the symbol and the Flower version
that lacks it (a new release is checked by running that test).
"""

from typing import Any

from flwr.client.message_handler.message_handler import handle_legacy_message_from_msgtype
from flwr.common.config import parse_config_args
from flwr.common.constant import HEARTBEAT_PATIENCE
from flwr.server import compat as server_compat
from flwr.server import server as server_loop
from flwr.server.compat import start_grid
from flwr.serverapp.strategy.strategy_utils import aggregate_arrayrecords, aggregate_metricrecords
from flwr.supercore.task_identity import TaskIdentity

__all__ = [
    "HEARTBEAT_PATIENCE", "TaskIdentity", "in_memory_grid", "aggregate_arrayrecords", "aggregate_metricrecords",
    "handle_legacy_message_from_msgtype", "unavailable_reply", "parse_config_args", "server_compat",
    "ray_backend", "server_loop", "start_grid",
]


def in_memory_grid() -> type[Any]:
    """The grid class of ``flwr run``'s simulations (``InMemoryGrid``), imported when asked for (about 1 s)."""
    from flwr.superlink.grid.inmemory_grid import InMemoryGrid

    return InMemoryGrid


def ray_backend() -> type[Any]:
    """Flower's Ray backend class (``RayBackend``), imported only when asked for: it imports Ray."""
    from flwr.server.superlink.fleet.vce.backend.raybackend import RayBackend

    return RayBackend


def unavailable_reply(*args: Any, **kwargs: Any) -> Any:
    """The error reply a SuperLink makes for a node it cannot reach (``create_message_error_unavailable_res_message``;
    imported when called: its module loads the SuperLink's state store)."""
    from flwr.server.superlink.linkstate.utils import create_message_error_unavailable_res_message

    return create_message_error_unavailable_res_message(*args, **kwargs)
