"""Legacy-API base class for personalized strategies (``flwr.server.strategy.Strategy``)."""

from __future__ import annotations

from logging import INFO
from typing import Any, Callable, Mapping

import numpy as np
import torch
from flwr.common import (
    EvaluateIns, EvaluateRes, FitIns, FitRes, Parameters, Scalar,
    ndarrays_to_parameters, parameters_to_ndarrays,
)
from flwr.common.logger import log
from flwr.server.client_manager import ClientManager
from flwr.server.client_proxy import ClientProxy
from flwr.server.strategy import Strategy

from flower_pfl.methods import ServerRule
from flower_pfl.methods.base import evaluation_config

from .metrics import personalized_evaluate_metrics_legacy
from .personalized import PersonalizedServer, TrainReplies, UpdateRejected, checked_payload as _payload, log_rejected, make_rule

ConfigFn = Callable[[int], dict[str, Scalar]]


def collect_fit_results(
    results: list[tuple[ClientProxy, FitRes]], failures: list[Any], server_round: int,
    check: Callable[[list[np.ndarray]], torch.Tensor], check_payload: Callable[[Mapping[str, Any]], Any] | None = None,
) -> TrainReplies:
    """Check every ``FitRes``: its arrays pass ``check`` and, if given, its metrics (where a
    client's extra bytes travel) pass ``check_payload``; rejected clients are logged and left out."""
    batch = TrainReplies(failed=len(failures))
    for proxy, res in results:
        try:
            vector = check(parameters_to_ndarrays(res.parameters))
            if check_payload is not None:
                batch.payloads.append(_payload(check_payload, res.metrics))
        except UpdateRejected as err:
            batch.rejected += 1
            log_rejected(proxy.cid, server_round, str(err))
            continue
        batch.ids.append(proxy.cid)
        batch.vectors.append(vector)
        batch.metrics.append((res.num_examples, res.metrics))
    return batch


class PersonalizedStrategy(Strategy):
    """Keeps one model per client (keyed by ``ClientProxy.cid``, the node id) on the server.

    ``configure_fit`` sends every sampled client its own model from the ``rule``
    plus the solver settings (``on_fit_config_fn(round)`` merged with the rule's);
    ``aggregate_fit`` checks and stores what comes back and returns no global
    parameters. ``configure_evaluate`` sends every client its stored model.
    """

    #: the method's rule; subclasses set it, and their keyword arguments not listed here go to it
    rule_class: type | None = None

    def __init__(
        self,
        rule: ServerRule | None = None,
        *,
        initial_parameters: Parameters,
        clients_per_round: int = 10,
        min_available_clients: int = 2,
        fraction_evaluate: float = 1.0,
        on_fit_config_fn: ConfigFn | None = None,
        on_evaluate_config_fn: ConfigFn | None = None,
        seed: int = 0,
        device: str | torch.device = "cpu",
        **rule_kwargs: Any,
    ) -> None:
        super().__init__()
        self.server = PersonalizedServer(make_rule(self.rule_class, rule, rule_kwargs), clients_per_round, seed=seed, device=device)
        arrays = parameters_to_ndarrays(initial_parameters)
        self.server.initialize({str(i): a for i, a in enumerate(arrays)})
        self.initial_parameters = initial_parameters
        self.min_available_clients = min_available_clients
        self.fraction_evaluate = fraction_evaluate
        self.on_fit_config_fn = on_fit_config_fn
        self.on_evaluate_config_fn = on_evaluate_config_fn

    @property
    def rule(self) -> ServerRule:
        return self.server.rule

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.rule}, clients_per_round={self.server.clients_per_round})"

    def initialize_parameters(self, client_manager: ClientManager) -> Parameters | None:
        return self.initial_parameters

    def _clients(self, client_manager: ClientManager) -> dict[str, ClientProxy]:
        client_manager.wait_for(self.min_available_clients)
        return client_manager.all()

    def _parameters(self, vector: torch.Tensor) -> Parameters:
        return ndarrays_to_parameters(self.server.to_arrays(vector))

    def configure_fit(self, server_round: int, parameters: Parameters, client_manager: ClientManager) -> list[tuple[ClientProxy, FitIns]]:
        clients = self._clients(client_manager)
        plan = self.server.plan_training(clients)
        config: dict[str, Scalar] = dict(self.on_fit_config_fn(server_round)) if self.on_fit_config_fn else {}
        log(INFO, "configure_fit: %d clients train, %d of them on a new personalized model",
            len(plan), min(self.server.clients_per_round, len(plan)))
        return [(clients[ins.client_id], FitIns(self._parameters(ins.model), {**config, **ins.config, "server-round": server_round}))
                for ins in plan]

    def aggregate_fit(
        self, server_round: int, results: list[tuple[ClientProxy, FitRes]], failures: list[tuple[ClientProxy, FitRes] | BaseException]
    ) -> tuple[Parameters | None, dict[str, Scalar]]:
        batch = collect_fit_results(results, failures, server_round, self.server.check_update)
        self.server.commit(batch.ids, batch.vectors)
        return None, dict(batch.metrics_dict())

    def configure_evaluate(self, server_round: int, parameters: Parameters, client_manager: ClientManager) -> list[tuple[ClientProxy, EvaluateIns]]:
        if self.fraction_evaluate <= 0:
            return []
        clients = self._clients(client_manager)
        ids = self.server.sample_fraction(clients, self.fraction_evaluate)
        models = self.server.stored_models(ids)
        config: dict[str, Scalar] = dict(self.on_evaluate_config_fn(server_round)) if self.on_evaluate_config_fn else {}
        config.update(evaluation_config(self.rule))
        config["server-round"] = server_round
        return [(clients[cid], EvaluateIns(self._parameters(models[i]), dict(config))) for i, cid in enumerate(ids)]

    def aggregate_evaluate(
        self, server_round: int, results: list[tuple[ClientProxy, EvaluateRes]], failures: list[tuple[ClientProxy, EvaluateRes] | BaseException]
    ) -> tuple[float | None, dict[str, Scalar]]:
        if not results:
            return None, {}
        metrics = personalized_evaluate_metrics_legacy([(res.num_examples, {**res.metrics, "loss": res.loss}) for _, res in results])
        return metrics.get("loss"), metrics

    def evaluate(self, server_round: int, parameters: Parameters) -> tuple[float, dict[str, Scalar]] | None:
        return None
