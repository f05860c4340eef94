"""A method's server algorithm with what every method shares, independent of the Flower API: the
model's layout, reproducible sampling of a round's participants (ordered by a stable rank per
node), the checks every reply passes before it reaches the method, and the client-contract
messages, each said once. ``strategies`` and ``strategies.message`` wrap it for Flower."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from flower_pfl.engine.client_algorithm import CLIENT_ALGORITHM, ClientAlgorithm
from flower_pfl.engine.client_contract import (
    ignored_algorithm_message,
    missing_algorithm_message,
    receipt_expected,
    settings_problem,
)
from flower_pfl.engine.client_metrics import is_finite_number
from flower_pfl.engine.layout import ParamLayout
from flower_pfl.engine.memory import CHUNK_BYTES
from flower_pfl.engine.model_facts import ModelFacts
from flower_pfl.engine.new_clients import NewClients
from flower_pfl.engine.reply_checks import (
    RawReply,
    Reply,
    ReplyBounds,
    RoundReplies,
    UpdateRejected,
    WeightBook,
    check_num_examples,
    check_update,
    screen,
)
from flower_pfl.engine.sampling import Sampler
from flower_pfl.engine.server_algorithm import (
    ClientId,
    GlobalModelAlgorithm,
    Instruction,
    PersonalizedAlgorithm,
    ServerAlgorithm,
)
from flower_pfl.engine.store import to_host
from flower_pfl.engine.wire import RoundArrays, T
from flower_pfl.engine.wording import agreeing, counted


class MethodServer:
    """A method's ``ServerAlgorithm`` with the plumbing every method shares, independent of the Flower API.

    ``clients_per_round`` clients train each round (``None``: ``ceil(fraction_train · n)`` of the
    ``n`` connected, at least ``min_train_clients``), drawn by a ``Sampler`` seeded with ``seed``
    after ordering clients by ``node_rank`` (e.g. their partition id): Flower's node ids change from
    run to run, so ranking by something stable makes runs repeatable. A strategy sets the ranks
    (``node_rank``) or lets the server learn them from what clients report under ``rank_key``
    (``learn_rank``); a client keeps the first rank it reports.

    Clients whose rank is in ``unseen`` never train (FL-bench's user split, pFL-Bench's new clients): they are
    never sampled for training, and evaluate what the method gives a client it has never seen
    (``ServerAlgorithm.new_client_instructions``), first taking ``finetune_steps`` local steps on their own
    training data (``FINETUNE_STEPS``; FL-bench's ``finetune_epoch``) where that is more than 0.
    """

    def __init__(self, method: ServerAlgorithm, clients_per_round: int | None = None, *, fraction_train: float = 1.0,
                 min_train_clients: int = 1, seed: int = 0, device: str | torch.device = "cpu",
                 store_dir: str | Path | None = None, bounds: ReplyBounds | None = None,
                 rank_key: str | None = None, unseen: Iterable[int] = (), finetune_steps: int = 0) -> None:
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
        #: what each client's sample count may count for (``WeightBook``), from the run's claims so far
        self.weights = WeightBook(self.bounds.max_weight_ratio)
        self.seed = seed
        self.sampler = Sampler(seed)
        #: the metric under which clients report their rank (None: ranks are only set, never learned)
        self.rank_key = rank_key
        #: the clients that never train, by rank (partition id), and the local steps they take before evaluating
        self.new = NewClients(self.sampler, frozenset(int(r) for r in unseen), finetune_steps)
        self._claims: dict[int, ClientId] = {}  # rank -> the first client that has it
        self._rank_asked: set[ClientId] = set()
        self._duplicate_reported = self._unranked_reported = self._rank_query_unanswered = False
        self.layout: ParamLayout | None = None
        #: the clients sampled in the last round, in the method's row order
        self.last_participants: list[ClientId] = []
        self._sampled: set[ClientId] = set()
        #: the model each of the round's trainers was sent (``ReplyBounds`` measures changes from it)
        self._sent: dict[ClientId, torch.Tensor] = {}
        #: the last round in which each client's accepted reply came from a client algorithm that keeps client state
        #: (a resumed run asks its node for the state of that round; ``client_apps.persisted_state``)
        self.state_rounds: dict[ClientId, int] = {}
        self._keeps_state: set[ClientId] = set()
        #: the client algorithm the round's trainers were asked for, where only its receipt shows it ran
        self._receipt_expected: type[ClientAlgorithm] | None = None
        self._settings_seen = False
        self._missing_algorithm_reported = self._receipt_reported = False
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
        if self.rank_key is None or self._rank_query_unanswered:
            return []
        out = [c for c in available if c not in self.sampler.rank and c not in self._rank_asked]
        self._rank_asked.update(out)
        return out

    def rank_query_unanswered(self) -> None:
        """The app's clients do not answer the question for their rank (the first one asked did not): no
        client is asked again in this run; ranks still come from the replies that carry one."""
        self._rank_query_unanswered = True

    def rank_problem(self, available: Iterable[ClientId], advice: str) -> str | None:
        """Once per run, when a draw from ``available`` meets clients without a rank: what follows and
        ``advice`` on how clients report one; else ``None``."""
        pool = list(available)
        missing = sum(c not in self.sampler.rank for c in pool)
        if not missing or self.rank_key is None or self._unranked_reported:
            return None
        self._unranked_reported = True
        unanswered = " (the app does not answer the question for it, which is not asked again)" if self._rank_query_unanswered else ""
        return (f"{missing} of {counted(len(pool), 'node')} {agreeing(missing, 'has', 'have')} not reported '{self.rank_key}', "
                f"the rank that orders nodes for sampling{unanswered}: until a reply of "
                f"{agreeing(missing, 'its carries it, draws order it', 'theirs carries it, draws order them')} by node id, which changes "
                f"from run to run, so the same seed may sample other clients; {advice}")

    @property
    def initialized(self) -> bool:
        return self.layout is not None

    def initialize(self, arrays: Mapping[str, np.ndarray | torch.Tensor]) -> None:
        """Learn the layout and every client's starting model from the named initial arrays (once); a
        ``ValueError`` when the method cannot run on the model (``Method.check_model``)."""
        if self.layout is None:
            layout = ParamLayout.from_arrays(arrays)
            check_model = getattr(type(self.method), "check_model", None)  # a method of this package says what it needs
            if check_model is not None and (needs := check_model(ModelFacts.of_layout(layout))) is not None:
                unnamed = "" if layout.named else " (the model's tensors have no names: give the strategy its state_dict)"
                raise ValueError(f"{type(self.method).__name__} cannot run on this model: it needs {needs}{unnamed}")
            self.layout = layout
            initial = self.layout.flatten(arrays.values())
            self.method.setup(self.layout, initial, self.device, self.seed)
            if self.store_dir is not None and isinstance(self.method, PersonalizedAlgorithm):  # rows on disk, not in memory
                self.method.store = self.method.new_store(initial, self.device, self.store_dir)
            if self.initial_by_rank is not None:
                if not isinstance(self.method, PersonalizedAlgorithm):
                    raise ValueError(f"{type(self.method).__name__} starts every client from one model: "
                                     "per-client starting models need a method that keeps a model per client")
                self.method.starting_models(self._initial_rows)

    def carry_on(self, arrays: Mapping[str, np.ndarray] | Sequence[np.ndarray]) -> None:
        """Go on from the global model Flower's loop holds (``arrays``: by name, or in the layout's order) where it
        is not the method's own: a central-DP wrapper added its noise to the model the strategy returned, and the
        noised model is the one to send on. Only a method central DP composes with (``aggregate_only``) takes it."""
        if not (self.initialized and self.method.aggregate_only and isinstance(self.method, GlobalModelAlgorithm)):
            return
        layout = self._require()
        held = layout.flatten([arrays[name] for name in layout.names] if isinstance(arrays, Mapping) else arrays)
        if not torch.equal(held, self.method.model):
            self.method.set_global_model(held)

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
        return settings_problem(self.method, settings)

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

    def is_unseen(self, client_id: ClientId) -> bool:
        """Whether ``client_id`` is one of the clients that never train (by its rank)."""
        return self.new.is_new(client_id)


    def plan_training(self, server_round: int, available: Iterable[ClientId]) -> list[Instruction]:
        """Sample the round's participants (never an unseen client) and return the method's training
        instructions; none when no client is available (the method is not asked: a round without participants
        changes nothing)."""
        self._require()
        pool = self.new.trainers(available)
        sampled = self.last_participants = self.sample(pool, self.participants(len(pool)))
        chosen = set(sampled)
        others = [c for c in pool if c not in chosen]
        plan = on_host(self.method.train_instructions(server_round, sampled, others)) if sampled else []
        self._sampled = chosen
        self._sent = {ins.client_id: ins.model for ins in plan}
        algorithm = self.method.client_algorithm()
        self._receipt_expected = receipt_expected(algorithm)
        self._keeps_state = set(self._sent) if algorithm.keeps_state else set()
        return [named(ins, algorithm) for ins in plan]

    def plan_evaluation(self, server_round: int, available: Iterable[ClientId], fraction: float, minimum: int = 1) -> list[Instruction]:
        """Evaluation instructions for all clients (``fraction >= 1``) or ``max(minimum, ceil(fraction · n))`` of them;
        none when no client is available."""
        return list(self.evaluation_plan(server_round, available, fraction, minimum))

    def evaluation_plan(self, server_round: int, available: Iterable[ClientId], fraction: float,
                        minimum: int = 1) -> Iterator[Instruction]:
        """``plan_evaluation``'s instructions one by one, made ``CHUNK_BYTES`` of models at a time: a strategy that
        turns each into a message before it takes the next never holds the models of every client at once."""
        self._require()
        if fraction <= 0:
            return
        pool = self.sampler.order(available)
        k = self.evaluators(len(pool), fraction, minimum)
        ids = pool if k >= len(pool) else self.sampler.sample(pool, k, evaluation=True)
        algorithm = self.method.client_algorithm()
        step = max(1, CHUNK_BYTES // (4 * self._require().dim))
        seen = [c for c in ids if not self.is_unseen(c)]
        for start in range(0, len(seen), step):
            for ins in on_host(self.method.evaluation_instructions(server_round, seen[start:start + step])):
                yield named(ins, algorithm)
        if new := [c for c in ids if self.is_unseen(c)]:  # all at once: what a new client gets is the federation's
            for ins in on_host(self.method.new_client_instructions(server_round, new)):
                yield named(replace(ins, config={**ins.config, **self.new.settings()}), algorithm)

    def check(self, raw: RawReply) -> Reply:
        """One reply checked on its own (model, sample count, extras), or ``UpdateRejected``."""
        vector = check_update(self._require(), raw.arrays, raw.names)
        n = check_num_examples(raw.num_examples)
        try:
            extras = self.method.check_extras(raw.extras)
        except UpdateRejected:  # AlgorithmOutputMissing included
            raise
        except (ValueError, TypeError) as err:
            raise UpdateRejected(str(err)) from err
        receipt = raw.extras.get(CLIENT_ALGORITHM)
        return Reply(raw.client_id, vector, n, raw.metrics, extras, receipt if isinstance(receipt, str) else None)

    def receive(self, raws: Sequence[RawReply], batch: RoundReplies | None = None) -> RoundReplies:
        """The round's training replies checked: each on its own (``check``; it must answer this
        round's instructions, once), then together (``bounds``). Refusals are listed in the result
        (``batch``: one with refusals the Flower layer already made); nothing is stored."""
        batch = batch if batch is not None else RoundReplies()
        screen(raws, self._sent, self.check, self.method.update_norms, self.bounds, batch, self.weights)
        return batch

    def missing_algorithm_problem(self, batch: RoundReplies) -> tuple[str, bool] | None:
        """``(message, fatal)`` the first time replies show that clients do not run the method's
        client algorithm; fatal when no reply of the round had it (the method cannot work without it)."""
        if batch.missing_algorithm is None or self._missing_algorithm_reported:
            return None
        self._missing_algorithm_reported = True
        fatal = not batch.accepted and batch.missing_algorithm_count == batch.rejected
        return missing_algorithm_message(self.method, batch.missing_algorithm, batch.missing_algorithm_count), fatal

    def ignored_algorithm_problem(self, batch: RoundReplies) -> str | None:
        """A warning the first time accepted replies lack the receipt of the client algorithm their
        instruction asked for: their clients trained without it. Not fatal: the method still runs,
        as another method (``ServerAlgorithm.ignored_algorithm_consequence`` says which)."""
        asked = self._receipt_expected
        if self._receipt_reported or asked is None:
            return None
        ignored = [r for r in batch.accepted if r.client_id in self._sent and r.receipt != asked.name]
        if not ignored:
            return None
        self._receipt_reported = True
        return ignored_algorithm_message(self.method, asked, len(ignored), len(batch.accepted))

    def aggregate(self, server_round: int, replies: Sequence[Reply]) -> torch.Tensor | None:
        """Give the accepted replies to the method in the order of the round's instructions (the sampled
        clients, then the others, each in rank order, with ranks learned since the plan): replies arrive
        in any order, and sums over them must not depend on it. Returns the new global model (``None``: none)."""
        if replies:
            ordered = sorted(replies, key=lambda r: (r.client_id not in self._sampled, self.sampler.key(r.client_id)))
            self.method.aggregate(server_round, ordered)
        self.state_rounds.update({r.client_id: server_round for r in replies if r.client_id in self._keeps_state})
        return self.method.global_model()

    def get_state(self) -> dict[str, Any]:
        """The sampler's generators, the last round's participants, the clients' first sample counts and
        the method's state."""
        return {"sampler": self.sampler.state(), "last_participants": list(self.last_participants),
                "weights": self.weights.get_state(), "state_rounds": dict(self.state_rounds), "method": self.method.get_state()}

    def set_state(self, state: dict[str, Any]) -> None:
        """Restore what ``get_state`` returned (after ``initialize``)."""
        self._require()
        self.sampler.set_state(state["sampler"])
        self.last_participants = list(state["last_participants"])
        if "weights" in state:  # checkpoints of earlier versions have none
            self.weights.set_state(state["weights"])
            self.state_rounds = dict(state["state_rounds"])
        self.method.set_state(state["method"])

    @property
    def layout_names(self) -> list[str]:
        return list(self._require().names)

    def round_arrays(self, encode: Callable[[np.ndarray], T]) -> RoundArrays[T]:
        """A round's instruction models made into a message's arrays by ``encode``, each array once
        (``RoundArrays``, with the method's ``common_tensors``)."""
        return RoundArrays(self._require(), self.method.common_tensors(), encode)

    def to_arrays(self, vector: torch.Tensor) -> list[np.ndarray]:
        return self._require().to_numpy_list(vector)

    def to_named_arrays(self, vector: torch.Tensor) -> dict[str, np.ndarray]:
        layout = self._require()
        return dict(zip(layout.names, layout.to_numpy_list(vector)))


def on_host(plan: list[Instruction]) -> list[Instruction]:
    """The instructions with their models on the host (where messages are made from them): the models a
    server on a GPU made, moved in one copy through pinned memory rather than one small copy each."""
    on_device = [i for i, ins in enumerate(plan) if ins.model.device.type != "cpu"]
    if not on_device:
        return plan
    host = to_host(torch.stack([plan[i].model for i in on_device]))
    out = list(plan)
    for row, i in enumerate(on_device):
        out[i] = replace(plan[i], model=host[row])
    return out


def named(instruction: Instruction, algorithm: type[ClientAlgorithm]) -> Instruction:
    """``instruction`` naming the client algorithm its client runs (``CLIENT_ALGORITHM``): ``algorithm``,
    unless the instruction names one (a new client's of another making, CFL's choice by loss)."""
    return replace(instruction, config={CLIENT_ALGORITHM: algorithm.name, **instruction.config})
