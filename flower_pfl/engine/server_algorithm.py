"""A method's server algorithm: what it sends to whom, how it aggregates, and what state it keeps.

A ``ServerAlgorithm`` says what to send to whom (``train_instructions``, ``evaluation_instructions``),
which client algorithm its instructions name (``client``, ``client_algorithm``), how to check the
extras a client returns with its model (``check_extras``), how to aggregate (``aggregate``) and what
state it keeps (``state_attributes``). Two bases cover most methods (pFedHN, which generates each
client's model, builds on ``ServerAlgorithm`` itself):

- ``PersonalizedAlgorithm`` keeps one model per client in a model store and turns the participants'
  stored models into the models it sends (``personalize``);
- ``GlobalModelAlgorithm`` keeps one global model and combines the returned models into the next one
  (``combine``); it may still send a client a model of its own (``client_model``).

``flower_pfl.engine.method_server.MethodServer`` runs a server algorithm with what every method shares
(sampling, node ranks, reply checks). Pure tensor code: the Flower strategies only translate
Flower's types to and from these.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import torch

from flower_pfl.engine.attention_log import AttentionAccumulator
from flower_pfl.engine.client_algorithm import ClientAlgorithm
from flower_pfl.engine.disk_store import DiskClientModelStore, make_store
from flower_pfl.engine.layout import ParamLayout
from flower_pfl.engine.memory import CHUNK_BYTES, in_blocks
from flower_pfl.engine.reply_checks import Reply, model_change
from flower_pfl.engine.store import ModelStore

ClientId = Hashable
Settings = dict[str, Any]


@dataclass(frozen=True)
class Instruction:
    """What one client gets: the flat model to start from (or evaluate) and config entries."""

    client_id: ClientId
    model: torch.Tensor
    config: Settings


class ServerAlgorithm:
    """Base of every method's server side (see the module docstring)."""

    #: the client algorithm its training instructions ask for (``flower_pfl.engine.client_algorithm``)
    client: ClassVar[type[ClientAlgorithm]] = ClientAlgorithm
    #: what changes as the method runs, by attribute name (each class lists its own; a checkpoint
    #: saves them all, ``setup`` rebuilds everything else from the layout and the parameters)
    state_attributes: ClassVar[tuple[str, ...]] = ()
    #: what the method becomes when clients ignore its client algorithm
    without_client_algorithm: ClassVar[str] = "runs without its client algorithm"
    #: ``aggregate`` makes one global model (``global_model``), which the strategies hand Flower's loop: what a
    #: server-side ``evaluate_fn`` evaluates (without one, the loop holds the initial model for ever)
    has_global_model: ClassVar[bool] = False
    #: the server needs nothing of a single reply but its share of the replies' sample-weighted mean: every
    #: trainer starts from the global model, the next one is made from that mean alone, and no client sends
    #: anything besides its model. What secure aggregation leaves a server, and what Flower's central
    #: differential-privacy wrappers clip and noise (``flower_pfl.engine.composition``, docs/privacy.md)
    aggregate_only: ClassVar[bool] = False
    #: what ``new_client_instructions`` gives a client that never trained, in a sentence (docs/evaluation.md)
    new_client_rule: ClassVar[str] = "what it sends any client that has not trained yet"

    def setup(self, layout: ParamLayout, initial: torch.Tensor, device: torch.device, seed: int = 0) -> None:
        """Create the method's state from the model's layout and starting parameters (once);
        ``seed`` seeds whatever the method initialises at random."""
        self.layout = layout

    def train_instructions(self, server_round: int, sampled: Sequence[ClientId], others: Sequence[ClientId]) -> list[Instruction]:
        """This round's training instructions, given the sampled clients (at least one) and the other connected ones."""
        raise NotImplementedError

    def evaluation_instructions(self, server_round: int, ids: Sequence[ClientId]) -> list[Instruction]:
        """What each of ``ids`` (at least one) evaluates (the model it would use) and how."""
        raise NotImplementedError

    def new_client_instructions(self, server_round: int, ids: Sequence[ClientId]) -> list[Instruction]:
        """What each of ``ids`` (at least one), clients that never train, evaluates (``new_client_rule``), asked
        for all of a round's new clients at once; by default what ``evaluation_instructions`` sends a client that
        has not trained yet."""
        return self.evaluation_instructions(server_round, ids)

    def common_tensors(self) -> frozenset[int]:
        """The tensors (by their place in the layout) that may be the same in several of a round's instructions:
        a message's arrays are then made once for all of them where they are (default: every tensor)."""
        return frozenset(range(len(self.layout.names)))

    def train_config(self, num_participants: int) -> Settings:
        """Client settings sent with a round's training instructions (``num_participants``: the clients sampled)."""
        return {}

    def evaluation_config(self) -> Settings:
        """Client settings sent with every evaluation instruction (e.g. which model a client evaluates)."""
        return {}

    def client_algorithm(self) -> type[ClientAlgorithm]:
        """The client algorithm this method's instructions name (``client``, unless its settings call for
        a simpler one or it hands its clients another method's)."""
        return self.client

    def ignored_algorithm_consequence(self, algorithm: type[ClientAlgorithm]) -> str:
        """What the method becomes when clients ignore ``algorithm``, the client algorithm its instructions name."""
        if issubclass(self.client, algorithm):
            return self.without_client_algorithm
        return f"runs without {algorithm.__name__}, the client algorithm its client settings name"

    def check_extras(self, extras: Mapping[str, Any]) -> Any:
        """Validate what a client returned besides its model; raise ``ValueError`` to reject the reply."""
        return None

    def example_extras(self, generator: torch.Generator) -> dict[str, bytes]:
        """What an honest client of this method returns besides its model, made up (random, valid for
        ``check_extras``): benchmarks and tests fabricate replies with it. None by default."""
        return {}

    def update_norms(self, reply: Reply, sent: torch.Tensor) -> dict[str, tuple[float, float]]:
        """What the reply changed, for ``ReplyBounds``: field -> (norm of the change, norm of its
        reference). The model's change against the model the client was sent; methods whose
        clients return more (SCAFFOLD's Δc_i) add their fields."""
        return model_change(reply, sent)

    def aggregate(self, server_round: int, replies: Sequence[Reply]) -> None:
        """Take in the round's accepted replies (at least one)."""
        raise NotImplementedError

    def global_model(self) -> torch.Tensor | None:
        """The global model, for methods that have one."""
        return None

    def server_state(self) -> dict[str, Any]:
        """What the method learned besides the models, saved with the results (``server_state.safetensors``)."""
        return {}

    def round_metrics(self) -> dict[str, float]:
        """Numbers the method reports with each training round, after ``aggregate`` (in the round's metrics:
        ``metrics.jsonl``'s training rows and the trackers), e.g. CFL's cluster count."""
        return {}

    def checkpoint_written(self) -> None:
        """Called once a checkpoint holding ``get_state`` is durably written."""

    def get_state(self) -> dict[str, Any]:
        """Everything ``state_attributes`` name, for a checkpoint (``flower_pfl.run.tensor_files.pack`` form)."""
        names = [n for klass in reversed(type(self).__mro__) for n in vars(klass).get("state_attributes", ())]
        out: dict[str, Any] = {}
        for name in dict.fromkeys(names):
            value = getattr(self, name)
            out[name] = value.get_state() if hasattr(value, "get_state") else value
        return out

    def set_state(self, state: dict[str, Any]) -> None:
        """Restore what ``get_state`` returned (after ``setup``)."""
        for name, value in state.items():
            current = getattr(self, name, None)
            if current is not None and hasattr(current, "set_state"):
                current.set_state(value)
            else:
                setattr(self, name, value)


@dataclass
class PersonalizedAlgorithm(ServerAlgorithm):
    """One model per client, kept on the server. Subclasses define ``personalize`` and the settings
    their clients get (``train_config``, ``evaluation_config``).

    The store keeps of each client only the columns ``own_columns`` names (all by default): a method whose
    clients share the other columns (FedPer's base layers) keeps them once (``shared_values``), and its
    store grows with what it keeps per client (``stored`` and ``keep`` read and write whole models)."""

    state_attributes: ClassVar[tuple[str, ...]] = ("attention_weights",)
    new_client_rule: ClassVar[str] = "the mean of the participating clients' stored models"

    def setup(self, layout: ParamLayout, initial: torch.Tensor, device: torch.device, seed: int = 0) -> None:
        super().setup(layout, initial, device, seed)
        #: the columns of the flat model each client keeps (``None``: all of them)
        self.own = self.own_columns(layout)
        self.store: ModelStore = self.new_store(initial, device)
        #: the starting model, whole (the store's ``initial`` holds only the clients' own columns)
        self.initial = self.store.initial if self.own is None else initial.to(device=self.store.device, dtype=torch.float32)
        #: client-level attention weights averaged over rounds (``personalize``'s weights, where it has any)
        self.attention_weights = AttentionAccumulator()

    def common_tensors(self) -> frozenset[int]:
        """The tensors with no column a client keeps as its own (none where clients keep whole models)."""
        if self.own is None:
            return frozenset()
        own = torch.zeros(self.layout.dim, dtype=torch.bool)
        own[self._own_index(own.device)] = True
        return frozenset(i for i, columns in enumerate(self.layout.tensor_slices()) if not own[columns].any())

    def own_columns(self, layout: ParamLayout) -> slice | torch.Tensor | None:
        """The columns of the flat model a client keeps as its own (a slice or an index tensor); ``None``:
        all (the default). The others are ``shared_values``' for every client."""
        return None

    def shared_values(self) -> torch.Tensor:
        """A flat model whose columns outside ``own_columns`` are what every client has there (default: the
        starting model's)."""
        return self.initial

    def new_store(self, initial: torch.Tensor, device: torch.device, folder: str | Path | None = None) -> ModelStore:
        """The store of the clients' own columns of ``initial`` (in memory, or on disk in ``folder``)."""
        return make_store(self._own_of(initial), device, folder)

    def _own_index(self, device: torch.device) -> slice | torch.Tensor:
        """``own`` (not ``None``) as an index for tensors on ``device``."""
        own = self.own
        assert own is not None
        return own.to(device) if isinstance(own, torch.Tensor) else own

    def _own_of(self, models: torch.Tensor) -> torch.Tensor:
        """The own columns of a flat model or of ``(m, d)`` models."""
        return models if self.own is None else models[..., self._own_index(models.device)]

    def stored(self, ids: Sequence[ClientId]) -> torch.Tensor:
        """The ``(m, d)`` stored models of ``ids`` (unseen clients: their starting models)."""
        rows = self.store.get(ids)
        if self.own is None:
            return rows
        models = self.shared_values().to(rows.device).expand(len(ids), -1).clone()
        models[:, self._own_index(rows.device)] = rows
        return models

    def keep(self, ids: Sequence[ClientId], models: torch.Tensor | Sequence[torch.Tensor]) -> None:
        """Store the models of ``ids`` (a ``(m, d)`` matrix or ``m`` flat models): their own columns."""
        self.store.put(ids, self._own_of(models) if isinstance(models, torch.Tensor) else [self._own_of(m) for m in models])

    def starting_models(self, make: Callable[[list[Hashable]], torch.Tensor]) -> None:
        """Clients seen for the first time start from ``make(ids)``'s ``(m, d)`` models (their own columns)."""
        self.store.initial_rows = make if self.own is None else lambda ids: self._own_of(make(ids))

    def get_state(self) -> dict[str, Any]:
        """The method's state and every client's own columns (ids in the store's order; ``Blocks`` of them when they
        take more than ``CHUNK_BYTES``, which a checkpoint writes a chunk at a time). A disk store is
        snapshot instead (its folder keeps the rows, and what changes them is logged, see
        ``DiskClientModelStore.snapshot``): the state names the folder and the snapshot."""
        ids = self.store.ids()
        if isinstance(self.store, DiskClientModelStore):
            snapshot = self.store.snapshot()
            return {**super().get_state(), "store": {"ids": ids, "folder": str(self.store.folder), "snapshot": snapshot}}
        rows = in_blocks(lambda part: self.store.get(ids[part]), len(ids), self.store.dim)  # a large store a chunk at a time
        return {**super().get_state(), "store": {"ids": ids, "rows": rows}}

    def set_state(self, state: dict[str, Any]) -> None:
        state = dict(state)
        store = state.pop("store")
        super().set_state(state)
        if "folder" in store:  # the disk store reopened its folder when it was made: back to the snapshot
            if not isinstance(self.store, DiskClientModelStore):
                raise ValueError(f"the checkpoint's models are in the disk store {store['folder']}: resume with store = 'disk'")
            self.store.rollback(int(store["snapshot"]), list(store["ids"]))
        elif store["ids"]:
            rows = store["rows"]
            if rows.shape[1] == self.store.dim:
                self.store.put(list(store["ids"]), rows)
            else:  # whole models, as checkpoints of earlier versions hold them
                self.keep(list(store["ids"]), rows)

    def checkpoint_written(self) -> None:
        """A checkpoint holding ``get_state`` is on disk: a disk store drops what only older ones needed."""
        if isinstance(self.store, DiskClientModelStore):
            self.store.release()

    def personalize(self, models: torch.Tensor, layout: ParamLayout) -> tuple[torch.Tensor, Mapping[str, torch.Tensor] | None]:
        """The ``(m, d)`` models to send from the participants' ``(m, d)`` stored ones, and the
        ``(m, m)`` weights by component (``None`` if the method has none)."""
        raise NotImplementedError

    def train_instructions(self, server_round: int, sampled: Sequence[ClientId], others: Sequence[ClientId]) -> list[Instruction]:
        """The sampled clients' models from ``personalize``, with the method's client settings."""
        settings = self.train_config(len(sampled))
        models, weights = self.personalize(self.stored(sampled), self.layout)
        if weights is not None:
            self.attention_weights.add(sampled, weights)
        return [Instruction(cid, models[i], settings) for i, cid in enumerate(sampled)]

    def models_for_evaluation(self, ids: Sequence[ClientId]) -> torch.Tensor:
        """The ``(m, d)`` models ``ids`` evaluate, the models they would use (their stored ones)."""
        return self.stored(ids)

    def evaluation_instructions(self, server_round: int, ids: Sequence[ClientId]) -> list[Instruction]:
        models, settings = self.models_for_evaluation(ids), self.evaluation_config()
        return [Instruction(cid, models[i], settings) for i, cid in enumerate(ids)]

    def new_client_instructions(self, server_round: int, ids: Sequence[ClientId]) -> list[Instruction]:
        """Every new client evaluates ``mean_stored``, with the method's evaluation settings."""
        model, settings = self.mean_stored(), self.evaluation_config()
        return [Instruction(cid, model, settings) for cid in ids]

    def mean_stored(self) -> torch.Tensor:
        """The mean of the stored models of the clients in the store, a chunk at a time: the participating clients
        that trained or evaluated (one not yet sampled holds its starting model; a client that never trains is
        never stored), or the starting model before any is stored."""
        ids = self.store.ids()
        if not ids:
            return self.initial.clone()
        total = torch.zeros(self.store.dim, dtype=torch.float64, device=self.store.device)
        step = max(1, CHUNK_BYTES // (4 * self.store.dim))
        for start in range(0, len(ids), step):
            total += self.store.get(ids[start:start + step]).to(torch.float64).sum(0)
        own = (total / len(ids)).to(torch.float32)
        if self.own is None:
            return own
        model = self.shared_values().to(own.device).clone()
        model[self._own_index(own.device)] = own
        return model

    def aggregate(self, server_round: int, replies: Sequence[Reply]) -> None:
        self.keep([r.client_id for r in replies], [r.model for r in replies])


def weighted_mean(models: torch.Tensor, num_examples: Sequence[float]) -> torch.Tensor:
    """FedAvg: the ``(m, d)`` models' mean weighted by their clients' sample counts (or other weights)."""
    weights = torch.tensor([float(n) for n in num_examples], device=models.device, dtype=models.dtype)
    return (weights / weights.sum()) @ models


@dataclass
class GlobalModelAlgorithm(ServerAlgorithm):
    """One global model; every participant starts from it (or from ``client_model``'s model for
    it) and ``combine`` makes the next one from the returned models. FedAvg by default."""

    state_attributes: ClassVar[tuple[str, ...]] = ("model", "num_clients")
    has_global_model: ClassVar[bool] = True
    new_client_rule: ClassVar[str] = "the global model, evaluated as its client algorithm evaluates it with no state of its own"

    def setup(self, layout: ParamLayout, initial: torch.Tensor, device: torch.device, seed: int = 0) -> None:
        super().setup(layout, initial, device, seed)
        self.model = initial.detach().to(torch.float32).cpu().clone()
        #: connected clients at the start of the round (SCAFFOLD's N)
        self.num_clients = 0

    def begin_round(self, server_round: int) -> None:
        """Called before the round's training instructions are made."""

    def client_model(self, client_id: ClientId, training: bool) -> torch.Tensor | None:
        """The flat model client ``client_id`` trains (``training``) or evaluates when it is not the
        global model (``None``: the global model)."""
        return None

    def combine(self, replies: Sequence[Reply]) -> torch.Tensor:
        """The next global model from the round's accepted replies."""
        return weighted_mean(torch.stack([r.model for r in replies]), [r.num_examples for r in replies])

    def client_models(self, ids: Sequence[ClientId], training: bool) -> list[torch.Tensor | None]:
        """``client_model`` of each of ``ids`` (a method may make them together, e.g. in one batch)."""
        return [self.client_model(cid, training) for cid in ids]

    def _instructions(self, ids: Sequence[ClientId], settings: Settings, training: bool) -> list[Instruction]:
        own = self.client_models(ids, training)
        return [Instruction(cid, self.model if model is None else model, settings) for cid, model in zip(ids, own)]

    def train_instructions(self, server_round: int, sampled: Sequence[ClientId], others: Sequence[ClientId]) -> list[Instruction]:
        self.num_clients = len(sampled) + len(others)
        self.begin_round(server_round)
        return self._instructions(sampled, self.train_config(len(sampled)), training=True)

    def evaluation_instructions(self, server_round: int, ids: Sequence[ClientId]) -> list[Instruction]:
        return self._instructions(ids, self.evaluation_config(), training=False)

    def new_client_instructions(self, server_round: int, ids: Sequence[ClientId]) -> list[Instruction]:
        """The global model, with the method's evaluation settings (never a ``client_model`` of its own)."""
        settings = self.evaluation_config()
        return [Instruction(cid, self.model, settings) for cid in ids]

    def aggregate(self, server_round: int, replies: Sequence[Reply]) -> None:
        self.model = self.combine(replies)

    def global_model(self) -> torch.Tensor | None:
        return self.model

    def set_global_model(self, model: torch.Tensor) -> None:
        """Go on from ``model``: the global model Flower's loop holds when it is not the one ``aggregate`` made
        (a central-DP wrapper added its noise to it)."""
        self.model = model.detach().to(torch.float32).cpu().clone()
