"""A method's server side, the same abstraction for personalized and global-model methods.

A ``ServerStep`` says what to send to whom (``train_instructions``,
``evaluation_instructions``), how to check the extras a client returns with its model
(``check_extras``), how to aggregate (``aggregate``) and what state it keeps. Two bases
cover the methods here:

- ``PersonalizedStep`` keeps one model per client in a ``ClientModelStore`` and turns the
  participants' stored models into the models it sends (``personalize``);
- ``GlobalModelStep`` keeps one global model and combines the returned models into the
  next one (``combine``); it may still send a client a model of its own (``client_model``).

``MethodServer`` adds what every method shares: the layout, seeded sampling of a round's
participants, and the checks every reply passes before it reaches the method. Pure
tensor code: the Flower strategies (``strategies``, ``strategies.message``) only
translate Flower's types to and from these.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch

from .client_step import ANCHOR, ANCHOR_KEEP, ANCHOR_SET, CLIENT_STEP, LOCAL_STEPS, LR, PROXIMAL_MU, ClientStep
from .diagnostics import AttentionAccumulator
from .layout import ParamLayout
from .methods.registry import client_step_for
from .params import param
from .reply_checks import (
    RawReply,
    Reply,
    ReplyBounds,
    RoundReplies,
    UpdateRejected,
    check_num_examples,
    check_update,
    is_finite_number,
    model_change,
    screen,
)
from .sampling import Sampler
from .store import ClientModelStore, DiskClientModelStore, ModelStore, make_store

ClientId = Hashable
Settings = dict[str, Any]


@dataclass(frozen=True)
class Instruction:
    """What one client gets: the flat model to start from (or evaluate) and config entries."""

    client_id: ClientId
    model: torch.Tensor
    config: Settings


def receipt_expected(config: Mapping[str, Any]) -> type[ClientStep] | None:
    """The client step a training instruction asks for, when only its receipt shows that a client ran
    it (``ClientStep.finish``); ``None`` for plain SGD and for steps whose reply keys show it."""
    step = client_step_for(config)
    return step if step.receipt() is not None and not step.reply_keys else None


class ServerStep:
    """Base of every method's server side (see the module docstring)."""

    #: the server keeps one model per client (evaluated on it) rather than one global model
    personalized: ClassVar[bool]
    #: what changes as the method runs, by attribute name (each class lists its own; a checkpoint
    #: saves them all, ``setup`` rebuilds everything else from the layout and the parameters)
    state_attributes: ClassVar[tuple[str, ...]] = ("attention_weights",)

    def setup(self, layout: ParamLayout, initial: torch.Tensor, device: torch.device, seed: int = 0) -> None:
        """Create the method's state from the model's layout and starting parameters (once);
        ``seed`` seeds whatever the method initialises at random."""
        self.layout = layout
        #: client-level attention weights averaged over rounds (methods that attend fill it)
        self.attention_weights = AttentionAccumulator()

    def train_instructions(self, server_round: int, sampled: Sequence[ClientId], others: Sequence[ClientId]) -> list[Instruction]:
        """This round's training instructions, given the sampled clients and the other connected ones."""
        raise NotImplementedError

    def evaluation_instructions(self, server_round: int, ids: Sequence[ClientId]) -> list[Instruction]:
        """What each of ``ids`` evaluates (the model it would use) and how."""
        raise NotImplementedError

    def check_extras(self, extras: Mapping[str, Any]) -> Any:
        """Validate what a client returned besides its model; raise ``ValueError`` to reject the reply."""
        return None

    #: how the method's ``proximal-mu`` is made from its arguments (for messages about it)
    proximal_mu_text: ClassVar[str] = "proximal-mu"
    #: what the method becomes when clients ignore its client step (``MethodServer.ignored_step_problem``)
    without_client_step: ClassVar[str] = "runs without its client step"

    def ignored_step_consequence(self, step: type[ClientStep]) -> str:
        """What the method becomes when clients ignore ``step``, the client step its instructions ask for."""
        if step is getattr(self, "client", None):
            return self.without_client_step
        return f"runs without {step.__name__}, the client step its client settings ask for"

    def settings_problem(self, settings: Mapping[str, Any]) -> str | None:
        """Why a client cannot train with this round's settings (the user's and the method's
        together), or ``None``. The proximal step ``w -= lr · μ (w − anchor)`` overshoots its anchor
        for ``lr · μ >= 1``, so the model cannot move toward its own data."""
        client = getattr(self, "client", None)
        missing = [k for k in (LR, LOCAL_STEPS) if k not in settings]
        if getattr(client, "needs_plain_sgd", False) and missing:
            return (f"the training config lacks {missing}, which {client.__name__} (this method's client step) reads: "  # type: ignore[union-attr]
                    f"pass them to the strategy (lr=..., local_steps=...) or in train_config / on_fit_config_fn, with the "
                    "values the clients train with; without them every client fails")
        lr, mu = settings.get(LR), settings.get(PROXIMAL_MU)
        if is_finite_number(lr) and is_finite_number(mu) and lr * mu >= 1:
            return (f"lr · proximal-mu = {lr:g} · {mu:g} = {lr * mu:g} >= 1, with proximal-mu = {self.proximal_mu_text}: "
                    "every local step pulls a client's model onto (or past) its anchor, so clients cannot train; "
                    f"lower lr or raise the arguments so that lr · ({self.proximal_mu_text}) < 1")
        return None

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

    def get_state(self) -> dict[str, Any]:
        """Everything ``state_attributes`` name, for a checkpoint (``flower_pfl.checkpoint.pack`` form)."""
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


def all_clients_train_param() -> Any:
    return param(False, key="all-clients-train",
                 doc="every client trains every round; the unsampled ones continue from their own model (FedMCSA's Algorithm 1)")


@dataclass
class PersonalizedStep(ServerStep):
    """One model per client, kept on the server. Subclasses define ``personalize`` and the settings
    their clients get (``train_config``, ``evaluation_config``).

    With ``all_clients_train`` every connected client trains every round: the sampled ones on
    the model ``personalize`` made for them, the others on their own stored model, anchored to
    the model they last received (FedMCSA's Algorithm 1, lines 7-19).
    """

    personalized: ClassVar[bool] = True

    def setup(self, layout: ParamLayout, initial: torch.Tensor, device: torch.device, seed: int = 0) -> None:
        super().setup(layout, initial, device, seed)
        self.store: ModelStore = ClientModelStore(initial, device=device)

    def get_state(self) -> dict[str, Any]:
        """The method's state and every client's model (ids in the store's order). A disk store is
        flushed and named instead: its folder holds the rows, as of the last round."""
        ids = self.store.ids()
        if isinstance(self.store, DiskClientModelStore):
            self.store.flush()
            return {**super().get_state(), "store": {"ids": ids, "folder": str(self.store.folder)}}
        return {**super().get_state(), "store": {"ids": ids, "rows": self.store.get(ids)}}

    def set_state(self, state: dict[str, Any]) -> None:
        state = dict(state)
        store = state.pop("store")
        super().set_state(state)
        if "folder" in store:  # the disk store reopened its folder when it was made
            missing = set(store["ids"]) - set(self.store.ids())
            if missing:
                raise ValueError(f"the disk store in {store['folder']} lacks {len(missing)} clients of the checkpoint")
        elif store["ids"]:
            self.store.put(list(store["ids"]), store["rows"])

    def personalize(self, models: torch.Tensor, layout: ParamLayout) -> tuple[torch.Tensor, Mapping[str, torch.Tensor] | None]:
        """The ``(m, d)`` models to send from the participants' ``(m, d)`` stored ones, and the
        ``(m, m)`` weights by component (``None`` if the method has none)."""
        raise NotImplementedError

    def train_config(self) -> Settings:
        """Client settings sent with every training instruction."""
        return {}

    def evaluation_config(self) -> Settings:
        """Client settings sent with every evaluation instruction."""
        return {}

    def train_instructions(self, server_round: int, sampled: Sequence[ClientId], others: Sequence[ClientId]) -> list[Instruction]:
        settings = self.train_config()
        models, weights = self.personalize(self.store.get(sampled), self.layout)
        if weights is not None:
            self.attention_weights.add(sampled, weights)
        if not getattr(self, "all_clients_train", False):
            return [Instruction(cid, models[i], settings) for i, cid in enumerate(sampled)]
        own = self.store.get(others)
        return ([Instruction(cid, models[i], {**settings, ANCHOR: ANCHOR_SET}) for i, cid in enumerate(sampled)]
                + [Instruction(cid, own[j], {**settings, ANCHOR: ANCHOR_KEEP}) for j, cid in enumerate(others)])

    def models_for_evaluation(self, ids: Sequence[ClientId]) -> torch.Tensor:
        """The ``(m, d)`` models ``ids`` evaluate, the models they would use (their stored ones)."""
        return self.store.get(ids)

    def evaluation_instructions(self, server_round: int, ids: Sequence[ClientId]) -> list[Instruction]:
        models, settings = self.models_for_evaluation(ids), self.evaluation_config()
        return [Instruction(cid, models[i], settings) for i, cid in enumerate(ids)]

    def aggregate(self, server_round: int, replies: Sequence[Reply]) -> None:
        self.store.put([r.client_id for r in replies], [r.model for r in replies])


def weighted_mean(models: torch.Tensor, num_examples: Sequence[int]) -> torch.Tensor:
    """FedAvg: the ``(m, d)`` models' mean weighted by their clients' sample counts."""
    weights = torch.tensor([float(n) for n in num_examples], device=models.device, dtype=models.dtype)
    return (weights / weights.sum()) @ models


@dataclass
class GlobalModelStep(ServerStep):
    """One global model; every participant starts from it (or from ``client_model``'s model for
    it) and ``combine`` makes the next one from the returned models. FedAvg by default."""

    personalized: ClassVar[bool] = False
    state_attributes: ClassVar[tuple[str, ...]] = ("model", "num_clients")

    def setup(self, layout: ParamLayout, initial: torch.Tensor, device: torch.device, seed: int = 0) -> None:
        super().setup(layout, initial, device, seed)
        self.model = initial.detach().to(torch.float32).cpu().clone()
        #: connected clients at the start of the round (SCAFFOLD's N)
        self.num_clients = 0

    def begin_round(self, server_round: int) -> None:
        """Called before the round's training instructions are made."""

    def train_config(self, num_participants: int) -> Settings:
        """Config entries for this round's participants."""
        return {}

    def evaluation_config(self) -> Settings:
        """Config entries for evaluation (e.g. how a client builds its personalized model)."""
        return {}

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

    def aggregate(self, server_round: int, replies: Sequence[Reply]) -> None:
        self.model = self.combine(replies)

    def global_model(self) -> torch.Tensor | None:
        return self.model


class MethodServer:
    """A method's ``ServerStep`` with the plumbing every method shares, independent of the Flower API.

    ``clients_per_round`` clients train each round (``None``: ``ceil(fraction_train · n)`` of the
    ``n`` connected, at least ``min_train_clients``), drawn by a ``Sampler`` seeded with ``seed``
    after ordering clients by ``node_rank`` (e.g. their partition id): Flower's node ids change from
    run to run, so ranking by something stable makes runs repeatable. A strategy sets the ranks
    (``node_rank``) or lets the server learn them from what clients report under ``rank_key``
    (``learn_rank``); a client keeps the first rank it reports.
    """

    def __init__(self, method: ServerStep, clients_per_round: int | None = None, *, fraction_train: float = 1.0,
                 min_train_clients: int = 1, seed: int = 0, device: str | torch.device = "cpu",
                 store_dir: str | Path | None = None, bounds: ReplyBounds | None = None,
                 rank_key: str | None = None) -> None:
        if clients_per_round is not None and clients_per_round < 1:
            raise ValueError(f"clients_per_round must be >= 1, got {clients_per_round}")
        if not 0 < fraction_train <= 1:
            raise ValueError(f"fraction_train must be in (0, 1], got {fraction_train}")
        self.method = method
        self.clients_per_round = clients_per_round
        self.fraction_train, self.min_train_clients = fraction_train, min_train_clients
        self.device = torch.device(device)
        self.store_dir = store_dir
        self.bounds = bounds or ReplyBounds()
        self.seed = seed
        self.sampler = Sampler(seed)
        #: the metric under which clients report their rank (None: ranks are only set, never learned)
        self.rank_key = rank_key
        self._claims: dict[int, ClientId] = {}  # rank -> the first client that has it
        self._rank_asked: set[ClientId] = set()
        self._duplicate_reported = self._unranked_reported = False
        self.layout: ParamLayout | None = None
        #: the clients sampled in the last round, in the method's row order
        self.last_participants: list[ClientId] = []
        self._sampled: set[ClientId] = set()
        #: the model each of the round's trainers was sent (``ReplyBounds`` measures changes from it)
        self._sent: dict[ClientId, torch.Tensor] = {}
        #: the client step each of the round's trainers was asked for, where only its receipt shows it ran
        self._step_asked: dict[ClientId, type[ClientStep]] = {}
        self._settings_seen = False
        self._rule_reported = self._receipt_reported = False
        #: each client's own starting model by its rank, as named arrays (``None``: all start from the
        #: initial model); set before ``initialize``, for methods that keep a model per client
        self.initial_by_rank: Callable[[int], Mapping[str, np.ndarray]] | None = None

    @property
    def node_rank(self) -> dict[ClientId, int]:
        """A stable rank per client for sampling (e.g. its partition id; see ``Sampler``)."""
        return self.sampler.rank

    @node_rank.setter
    def node_rank(self, rank: dict[ClientId, int]) -> None:
        self.sampler.rank = dict(rank)
        self._claims = {}
        for cid, r in sorted(rank.items(), key=lambda item: self.sampler.key(item[0])):
            self._claims.setdefault(r, cid)

    def learn_rank(self, client_id: ClientId, value: Any) -> str | None:
        """Take ``value`` (a finite, integer-valued number) as ``client_id``'s rank unless it has one.
        Returns a message the first time two clients claim the same rank (they are then ordered by
        client id among themselves), else ``None``."""
        if client_id in self.sampler.rank or not (is_finite_number(value) and float(value).is_integer()):
            return None
        rank = int(value)
        self.sampler.rank[client_id] = rank
        first = self._claims.setdefault(rank, client_id)
        if first == client_id or self._duplicate_reported:
            return None
        self._duplicate_reported = True
        return (f"nodes {first} and {client_id} both report {self.rank_key} = {rank}: they are ordered by node id "
                "among themselves, which changes from run to run (further nodes sharing a rank are not reported)")

    def unasked(self, available: Iterable[ClientId]) -> list[ClientId]:
        """The clients of ``available`` without a rank that were not asked for one yet, now marked asked
        (a strategy asks each client at most once per run); none when ranks are not learned."""
        if self.rank_key is None:
            return []
        out = [c for c in available if c not in self.sampler.rank and c not in self._rank_asked]
        self._rank_asked.update(out)
        return out

    def rank_problem(self, available: Iterable[ClientId], advice: str) -> str | None:
        """Once per run, when a draw from ``available`` meets clients without a rank: what follows and
        ``advice`` on how clients report one; else ``None``."""
        pool = list(available)
        missing = sum(c not in self.sampler.rank for c in pool)
        if not missing or self.rank_key is None or self._unranked_reported:
            return None
        self._unranked_reported = True
        return (f"{missing} of {len(pool)} nodes did not report '{self.rank_key}', the rank that orders nodes for "
                "sampling: those nodes are ordered by node id, which changes from run to run: the same seed then "
                f"samples other clients; {advice}")

    @property
    def initialized(self) -> bool:
        return self.layout is not None

    def initialize(self, arrays: Mapping[str, np.ndarray | torch.Tensor]) -> None:
        """Learn the layout and every client's starting model from the named initial arrays (once)."""
        if self.layout is None:
            self.layout = ParamLayout.from_arrays(arrays)
            initial = self.layout.flatten(arrays.values())
            self.method.setup(self.layout, initial, self.device, self.seed)
            if self.store_dir is not None and isinstance(self.method, PersonalizedStep):  # rows on disk, not in memory
                self.method.store = make_store(initial, self.device, self.store_dir)
            if self.initial_by_rank is not None:
                if not isinstance(self.method, PersonalizedStep):
                    raise ValueError(f"{type(self.method).__name__} starts every client from one model: "
                                     "per-client starting models need a method that keeps a model per client")
                self.method.store.initial_rows = self._initial_rows

    def _initial_rows(self, ids: Sequence[ClientId]) -> torch.Tensor:
        """The ``(m, d)`` starting models of ``ids``, from their ranks (``initial_by_rank``)."""
        unranked = [cid for cid in ids if cid not in self.sampler.rank]
        if unranked:
            raise RuntimeError(f"clients {unranked[:3]} have no rank (partition id): per-client starting models are "
                               "keyed by it")
        layout, make = self._require(), self.initial_by_rank
        named = [make(self.sampler.rank[cid]) for cid in ids]  # type: ignore[misc]
        return torch.stack([layout.flatten(arrays[name] for name in layout.names) for arrays in named])

    def _require(self) -> ParamLayout:
        if self.layout is None:
            raise RuntimeError("initialize() must be called with the initial model first")
        return self.layout

    def settings_problem(self, settings: Mapping[str, Any]) -> str | None:
        """The method's ``settings_problem`` for the first training settings it sees (later: ``None``,
        so a strategy says it once)."""
        if self._settings_seen:
            return None
        self._settings_seen = True
        return self.method.settings_problem(settings)

    def sample(self, available: Iterable[ClientId], k: int) -> list[ClientId]:
        """``k`` distinct clients for training, uniformly, reproducibly."""
        return self.sampler.sample(available, k)

    def participants(self, num_available: int) -> int:
        """How many of ``num_available`` clients a training round samples."""
        if self.clients_per_round is not None:
            return self.clients_per_round
        return max(self.min_train_clients, math.ceil(self.fraction_train * num_available))

    @staticmethod
    def evaluators(num_available: int, fraction: float, minimum: int = 1) -> int:
        """How many of ``num_available`` clients evaluate: all (``fraction >= 1``) or ``max(minimum, ceil(fraction · n))``."""
        return num_available if fraction >= 1.0 else max(minimum, math.ceil(fraction * num_available))

    def plan_training(self, server_round: int, available: Iterable[ClientId]) -> list[Instruction]:
        """Sample the round's participants and return the method's training instructions."""
        self._require()
        pool = self.sampler.order(available)
        sampled = self.last_participants = self.sample(pool, self.participants(len(pool)))
        chosen = set(sampled)
        plan = self.method.train_instructions(server_round, sampled, [c for c in pool if c not in chosen])
        self._sampled = chosen
        self._sent = {ins.client_id: ins.model for ins in plan}
        self._step_asked = {ins.client_id: step for ins in plan if (step := receipt_expected(ins.config)) is not None}
        return plan

    def plan_evaluation(self, server_round: int, available: Iterable[ClientId], fraction: float, minimum: int = 1) -> list[Instruction]:
        """Evaluation instructions for all clients (``fraction >= 1``) or ``max(minimum, ceil(fraction · n))`` of them."""
        self._require()
        if fraction <= 0:
            return []
        pool = self.sampler.order(available)
        k = self.evaluators(len(pool), fraction, minimum)
        ids = pool if k >= len(pool) else self.sampler.sample(pool, k, evaluation=True)
        return self.method.evaluation_instructions(server_round, ids)

    def check(self, raw: RawReply) -> Reply:
        """One reply checked on its own (model, sample count, extras), or ``UpdateRejected``."""
        vector = check_update(self._require(), raw.arrays, raw.names)
        n = check_num_examples(raw.num_examples)
        try:
            extras = self.method.check_extras(raw.extras)
        except UpdateRejected:  # MissingClientRule included
            raise
        except (ValueError, TypeError) as err:
            raise UpdateRejected(str(err)) from err
        receipt = raw.extras.get(CLIENT_STEP)
        return Reply(raw.client_id, vector, n, raw.metrics, extras, receipt if isinstance(receipt, str) else None)

    def receive(self, raws: Sequence[RawReply], batch: RoundReplies | None = None) -> RoundReplies:
        """The round's training replies checked: each on its own (``check``; it must answer this
        round's instructions, once), then together (``bounds``). Refusals are listed in the result
        (``batch``: one with refusals the Flower layer already made); nothing is stored."""
        batch = batch if batch is not None else RoundReplies()
        screen(raws, self._sent, self.check, self.method.update_norms, self.bounds, batch)
        return batch

    def client_rule_problem(self, batch: RoundReplies) -> tuple[str, bool] | None:
        """``(message, fatal)`` the first time replies show that clients do not run the method's
        client step; fatal when no reply of the round had it (the method cannot work without it)."""
        if batch.missing_rule is None or self._rule_reported:
            return None
        self._rule_reported = True
        fatal = not batch.accepted and batch.missing_rule_count == batch.rejected
        name = type(self.method).__name__
        return (f"{batch.missing_rule_count} clients' replies lack what {name}'s client step {batch.missing_rule} returns: "
                f"their ClientApp does not run it. {name} cannot work without it; train with "
                f"client_apps.rules.ClientRule.from_config(config) (or the package's ClientApp), see the README's "
                f"'Using a strategy in your own Flower app'", fatal)

    def ignored_step_problem(self, batch: RoundReplies) -> str | None:
        """A warning the first time accepted replies lack the receipt of the client step their
        instruction asked for: their clients trained without it. Not fatal: the method still runs,
        as another method (``ServerStep.ignored_step_consequence`` says which)."""
        if self._receipt_reported:
            return None
        ignored = [r for r in batch.accepted if r.client_id in self._step_asked and r.client_step != self._step_asked[r.client_id].receipt()]
        if not ignored:
            return None
        self._receipt_reported = True
        step = self._step_asked[ignored[0].client_id]
        name, key = type(self.method).__name__, step.receipt()
        fix = ("train with client_apps.rules.ClientRule.from_config(config) and send what its finish() returns with the "
               "reply (or use the package's ClientApp)" if step.hookable else
               f"use the package's ClientApp (client_apps.app): {step.__name__} is not a hook on a user's loop")
        return (f"{len(ignored)} of {len(batch.accepted)} clients' replies lack the receipt '{CLIENT_STEP}' = '{key}': their "
                f"ClientApp ignored the training config's '{key}', which asks for {name}'s client step {step.__name__}. "
                f"{name} then {self.method.ignored_step_consequence(step)}. To run it, {fix}; see the README's "
                "'Using a strategy in your own Flower app'")

    def aggregate(self, server_round: int, replies: Sequence[Reply]) -> torch.Tensor | None:
        """Give the accepted replies to the method in the order of the round's instructions (the sampled
        clients, then the others, each in rank order, with ranks learned since the plan): replies arrive
        in any order, and sums over them must not depend on it. Returns the new global model (``None``: none)."""
        if replies:
            ordered = sorted(replies, key=lambda r: (r.client_id not in self._sampled, self.sampler.key(r.client_id)))
            self.method.aggregate(server_round, ordered)
        return self.method.global_model()

    def get_state(self) -> dict[str, Any]:
        """The sampler's generators, the last round's participants and the method's state."""
        return {"sampler": self.sampler.state(), "last_participants": list(self.last_participants),
                "method": self.method.get_state()}

    def set_state(self, state: dict[str, Any]) -> None:
        """Restore what ``get_state`` returned (after ``initialize``)."""
        self._require()
        self.sampler.set_state(state["sampler"])
        self.last_participants = list(state["last_participants"])
        self.method.set_state(state["method"])

    def to_arrays(self, vector: torch.Tensor) -> list[np.ndarray]:
        return self._require().to_numpy_list(vector)

    def to_named_arrays(self, vector: torch.Tensor) -> dict[str, np.ndarray]:
        layout = self._require()
        return dict(zip(layout.names, layout.to_numpy_list(vector)))
