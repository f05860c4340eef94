"""A method's client algorithm, as hooks on one local-training loop.

Every client algorithm is a ``ClientAlgorithm``, found by its ``name``: the server's instructions
name it (``CLIENT_ALGORITHM``), the package's ClientApp runs it in ``train_locally``, and a user's
own PyTorch loop runs the very same object through two hooks (``client_apps.own_loop.algorithm_for``
hands it out)::

    for x, y in batches:
        optimizer.zero_grad()
        loss_fn(model(x), y).backward()
        algorithm.adjust_gradients(model, (x, y))   # the method's change to the gradient
        optimizer.step()                            # plain SGD with the instruction's lr
    extras = algorithm.finish(model, x_train)       # what the server needs back, and the receipt

``train_step`` is one SGD step of that loop; algorithms that train a second model or take a second
minibatch per step (Ditto, APFL, Per-FedAvg) override it, and are then not hooks on a user's loop
(``hookable = False``). ``finish`` adds the algorithm's receipt (its name, under
``CLIENT_ALGORITHM``) to the bytes it returns, so the server notices clients that ignored it.
``evaluation_model`` says which model a client evaluates (Ditto's personal model, pFedMe's θ_i, ...).
State kept between rounds lives in a ``ClientState``: a mapping from a name to a list of tensors
(``context.state`` through an adapter on a SuperNode).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from flower_pfl.engine.functional import Functional, State
from flower_pfl.engine.layout import load_flat_
from flower_pfl.engine.minibatches import MinibatchStream
from flower_pfl.engine.wire import decode_vector, fingerprint

#: settings every training instruction carries (the package's ServerApp sends them from the run config)
LR, LOCAL_STEPS, BATCH_SIZE, SERVER_ROUND = "lr", "local-steps", "batch-size", "server-round"
#: instruction entries of the package's ServerApp: the results folder's name (clients keep their state
#: under it) and, in a resumed run, the round of the checkpoint it continues from
RUN_KEY, RESUMED_AFTER = "run-key", "resumed-after"
#: evaluation-instruction entries of a client that never trains (``flower_pfl.engine.new_clients``): that it is one, and
#: the local steps it takes on its own training data before it evaluates (FL-bench's ``finetune_epoch``)
NEW_CLIENT, FINETUNE_STEPS = "new-client", "finetune-steps"
#: proximal weight μ in ``min f_i(w) + μ/2 ||w − a||²`` (the key of Flower's Message-API FedProx;
#: its legacy FedProx sends ``proximal_mu``, also understood)
PROXIMAL_MU, LEGACY_PROXIMAL_MU = "proximal-mu", "proximal_mu"
#: instruction entry naming the client algorithm the client runs (``ClientAlgorithm.name``), and the
#: reply-extras entry with its receipt (``ClientAlgorithm.receipt``): the client ran the algorithm it was asked for
CLIENT_ALGORITHM = "client-algorithm"
#: a client's state between rounds: name -> tensors (``client_apps.own_loop.RecordState`` wraps ``context.state``)
ClientState = MutableMapping[str, list[torch.Tensor]]
#: what a client algorithm returns for the server: its bytes by reply key, and its receipt (a str)
Extras = dict[str, bytes | str]
LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
Batch = tuple[torch.Tensor, torch.Tensor]


@dataclass(frozen=True)
class LocalResult:
    """Mean training loss (data term only) over the steps taken."""

    loss: float
    steps: int


def trainable(model: nn.Module) -> list[torch.Tensor]:
    return [p for p in model.parameters() if p.requires_grad]


def over_state(model: nn.Module, tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """Per-parameter tensors of ``model`` (one per trainable parameter, in ``trainable`` order) as one float32
    vector over its whole flat model, the server's layout (``state_dict`` order): zeros at its buffers
    (batch normalization's statistics) and frozen parameters."""
    by_tensor = {id(p): t for p, t in zip(trainable(model), tensors)}
    return torch.cat([by_tensor.get(id(v), torch.zeros_like(v, dtype=torch.float32)).flatten().float()
                      for v in model.state_dict(keep_vars=True).values()])


def trainable_part(model: nn.Module, data: bytes) -> list[torch.Tensor]:
    """``encode_vector``'s bytes of a vector over ``model``'s whole flat model (``over_state``'s layout), as
    tensors shaped like its trainable parameters (the buffers' entries left out)."""
    entries = list(model.state_dict(keep_vars=True).values())
    by_tensor = {id(v): part for v, part in zip(entries, decode_vector(data, entries))}
    return [by_tensor[id(p)] for p in trainable(model)]


def like_params(tensors: Sequence[torch.Tensor], params: Sequence[torch.Tensor], what: str) -> list[torch.Tensor]:
    """``tensors`` on the parameters' device and dtype, checked to have the parameters' shapes."""
    if [tuple(t.shape) for t in tensors] != [tuple(p.shape) for p in params]:
        raise ValueError(f"the {what} must have the shapes of the model's parameters")
    return [t.to(device=p.device, dtype=p.dtype) for t, p in zip(tensors, params)]


def stored(state: ClientState | None, key: str) -> list[torch.Tensor] | None:
    """The tensors kept under ``key`` (``None`` if none, or without a state)."""
    return None if state is None else state.get(key)


def keep(state: ClientState | None, key: str, tensors: Iterable[torch.Tensor]) -> None:
    """Keep ``tensors`` under ``key`` (nothing without a state)."""
    if state is not None:
        state[key] = [t.detach().cpu().clone() for t in tensors]


def load_stored(model: nn.Module, state: ClientState | None, key: str) -> bool:
    """Load the flat model kept under ``key`` into ``model`` (in place); ``False`` if none is kept."""
    known = stored(state, key)
    if known is None:
        return False
    load_flat_(model, known[0].to(next(model.parameters()).device))
    return True


def setting(config: Mapping[str, Any], key: str, who: str) -> Any:
    """``config[key]``, or a ``ValueError`` that tells the server what to send."""
    if key not in config:
        raise ValueError(f"{who}'s client needs '{key}' in the training config (send it with the strategy's train config)")
    return config[key]


def batch_seeded_generator(x: torch.Tensor, y: torch.Tensor, config: Mapping[str, Any]) -> torch.Generator:
    """A CPU generator for a client's own draws in a round (noise, generated labels), seeded by its first
    minibatch's data and the round: a run repeats, and the draws are the same on every device (the
    data's bits are; a model's are not)."""
    return torch.Generator().manual_seed(fingerprint([x, y]) * 1_000_003 + int(config.get(SERVER_ROUND, 0)))


def proximal_mu(config: Mapping[str, Any]) -> float:
    """The proximal weight μ of an instruction (0: none)."""
    return float(config.get(PROXIMAL_MU, config.get(LEGACY_PROXIMAL_MU, 0.0)))


def sgd_update(model: nn.Module, lr: float) -> None:
    """``p ← p − lr · p.grad`` for every trainable parameter (what ``torch.optim.SGD`` does)."""
    sgd_step(trainable(model), lr)


def sgd_step(params: Sequence[torch.Tensor], lr: float) -> None:
    """``p ← p − lr · p.grad`` for each of ``params`` that has a gradient, in one fused call."""
    pairs = [(p, p.grad) for p in params if p.grad is not None]
    if pairs:
        with torch.no_grad():
            torch._foreach_add_([p for p, _ in pairs], [g for _, g in pairs], alpha=-lr)


@dataclass(frozen=True)
class TrainData:
    """A client's training split, on the model's device."""

    x: torch.Tensor
    y: torch.Tensor


class ClientAlgorithm:
    """Plain local SGD: no change to the gradient, nothing to send back.

    Subclasses override the hooks they need. Class attributes say what the algorithm is and needs:
    ``name`` (what instructions call it: its method's run-config name, or ``proximal``, ``sgd``, ...),
    ``needs_state``, ``needs_plain_sgd`` (its arithmetic assumes SGD steps of size ``config["lr"]``),
    ``hookable`` (``False``: it trains a second model or takes a second minibatch per step, so only
    ``train_locally`` can run it) and ``reply_keys``.

    A step is written once, on the parameters as tensors (``loss``, ``gradients``, ``gradient_terms``),
    so that it runs on one client's model (``train_step``, a user's loop) or on a round's clients at
    once (``flower_pfl.engine.batched``: the same methods under ``torch.func.vmap``, the per-client
    tensors they read named in ``batched_state``).
    """

    #: the name instructions give it (``CLIENT_ALGORITHM``) and its receipt; every subclass declares its own
    name: ClassVar[str] = "sgd"
    #: the client-state key of the model the client evaluates instead of the received one (its personal
    #: model); the received one until the state holds it
    evaluated_state: ClassVar[str | None] = None
    needs_state: ClassVar[bool] = False
    #: the algorithm keeps something in the client state from round to round (a resumed run's clients
    #: start without it, see docs/checkpoints.md)
    keeps_state: ClassVar[bool] = False
    needs_plain_sgd: ClassVar[bool] = False
    hookable: ClassVar[bool] = True
    #: the reply keys ``end_round`` always returns; a reply without them is refused
    #: (``AlgorithmOutputMissing``), so they, not the receipt, show that the algorithm ran
    reply_keys: ClassVar[tuple[str, ...]] = ()
    #: the attributes holding this client's own tensors (or lists of them) that ``loss``, ``gradients``
    #: and ``gradient_terms`` read; a round's clients are trained at once with these stacked
    batched_state: ClassVar[tuple[str, ...]] = ()
    #: why a round's clients of this algorithm cannot train as one computation (``None``: they can,
    #: unless it overrides ``train_step``)
    unbatched_because: ClassVar[str | None] = None
    #: for an algorithm with its own ``step``: the attributes holding per-client tensors (or lists of them)
    #: that the step reads and replaces, carried from step to step beside the model (a second model's state,
    #: a mixing weight, a running mean); stacked across a round's clients like the model
    carried: ClassVar[tuple[str, ...]] = ()
    #: for an algorithm with its own ``step``: the attributes ``draw`` sets before each step (per-client random
    #: draws, made client by client from the client's own generator and stacked)
    drawn: ClassVar[tuple[str, ...]] = ()
    #: the minibatches one step takes
    minibatches: ClassVar[int] = 1

    def __init__(self, model: nn.Module, config: Mapping[str, Any], state: ClientState | None = None,
                 loss_fn: LossFn = F.cross_entropy) -> None:
        if self.needs_state and state is None:
            raise ValueError(f"{type(self).__name__} keeps client state between rounds: pass context.state")
        self.config, self.state, self.loss_fn = config, state, loss_fn
        self.received = [p.detach().clone() for p in trainable(model)]
        self.steps = 0
        #: the loss ``train_step`` reports for the last step, when the algorithm's own loss is not the model's
        self.step_loss: float | None = None

    @classmethod
    def receipt(cls) -> str | None:
        """What ``finish`` returns under ``CLIENT_ALGORITHM``: the algorithm's name (``None`` for plain
        SGD, which any client runs)."""
        return None if cls is ClientAlgorithm else cls.name

    # --- the hooks a user's loop calls ---------------------------------------------------------
    def adjust_gradients(self, model: nn.Module, batch: Batch | None = None) -> None:
        """Call after ``loss.backward()`` and before ``optimizer.step()``."""
        self._adjust(trainable(model), batch)

    def _adjust(self, params: Sequence[torch.Tensor], batch: Batch | None) -> None:
        """``adjust_gradients`` on the model's trainable parameters ``params``."""
        if changes_gradients(type(self)):
            with torch.no_grad():
                new = self.gradients(params, [p.grad for p in params], batch)
            for p, g in zip(params, new):
                p.grad = g
        self.steps += 1

    # --- one step, on the parameters as tensors (one client's, or one of a batch under vmap) ----
    def loss(self, logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The training loss the step descends (data term; the user's ``loss_fn`` by default)."""
        return self.loss_fn(logits, y)

    def gradients(self, params: Sequence[torch.Tensor], grads: Sequence[torch.Tensor | None],
                  batch: Batch | None) -> list[torch.Tensor | None]:
        """The gradient the SGD step takes, from the loss's (``grads``, step ``self.steps`` of the round):
        ``grads`` plus ``gradient_terms`` by default. ``None`` leaves a parameter where it is."""
        return added(grads, self.gradient_terms(params, batch))

    def gradient_terms(self, params: Sequence[torch.Tensor], batch: Batch | None) -> Sequence[torch.Tensor | None]:
        """What the method adds to each trainable parameter's gradient (none by default)."""
        return []

    def finish(self, model: nn.Module, inputs: torch.Tensor | Iterable[Any] | None = None) -> Extras:
        """Call after the loop: update the client state, return what the server needs back (the
        algorithm's bytes and its receipt; send it all with the reply)."""
        extras: Extras = dict(self.end_round(model, inputs))
        if (receipt := self.receipt()) is not None:
            extras[CLIENT_ALGORITHM] = receipt
        return extras

    def end_round(self, model: nn.Module, inputs: torch.Tensor | Iterable[Any] | None = None) -> dict[str, bytes]:
        """The algorithm's part of ``finish``: update the client state, return the bytes the server needs
        back (none by default)."""
        return {}

    # --- the package's loop --------------------------------------------------------------------
    def begin(self, model: nn.Module, data: TrainData) -> TrainData:
        """Called by ``train_locally`` with the received model and the client's training split before the
        round's steps; returns the data the steps draw from. A step that needs the whole split (its class
        counts, a held-out part, a choice among models) does it here; a user's own loop does not call it."""
        return data

    def step(self, f: Functional, state: State, batches: Sequence[Batch], lr: float) -> tuple[State, torch.Tensor]:
        """One local step as a function of tensors, for an algorithm whose step is more than an SGD step of the
        user's loop (a second model, a second minibatch, a module trained beside the model): the model's new
        state (``Functional``: its ``state_dict``'s tensors) and the loss the step reports. ``batches`` are the
        step's ``minibatches`` fresh minibatches, ``self.steps`` its index; it replaces the ``carried``
        attributes' values (and sets nothing else). Written with ``f`` and ``torch.func``, it runs for one
        client (``train_step``) and, under ``vmap``, for a round's clients at once."""
        raise NotImplementedError(f"{type(self).__name__} has no step of its own")

    def draw(self, batches: Sequence[Batch]) -> None:
        """Before each ``step``, client by client: set the ``drawn`` attributes (random draws) for it."""

    def train_step(self, model: nn.Module, next_batch: Callable[[], Batch], lr: float) -> float:
        """One step of ``train_locally``: exactly a user's loop iteration with plain SGD (or the algorithm's
        own ``step``). Returns the step's training loss (data term only)."""
        if has_own_step(type(self)):
            return self._own_step(model, [next_batch() for _ in range(self.minibatches)], lr)
        x, y = next_batch()
        params = trainable(model)
        for p in params:
            p.grad = None
        loss = self.loss(model(x), y)
        loss.backward()
        if type(self).adjust_gradients is ClientAlgorithm.adjust_gradients:
            self._adjust(params, (x, y))
        else:
            self.adjust_gradients(model, (x, y))
        sgd_step(params, lr)
        return float(loss.detach()) if self.step_loss is None else self.step_loss

    def _own_step(self, model: nn.Module, batches: list[Batch], lr: float) -> float:
        """``step`` on ``model``'s tensors, written back into it."""
        self.draw(batches)
        f = Functional(model)
        with torch.no_grad():
            new, loss = self.step(f, f.state(), batches, lr)
            for target, value in zip(model.state_dict().values(), new):
                target.copy_(value)
        self.steps += 1
        return float(loss)

    # --- evaluation ----------------------------------------------------------------------------
    @classmethod
    def evaluation_model(cls, model: nn.Module, config: Mapping[str, Any], state: ClientState | None, train: TrainData,
                         test: Callable[[nn.Module], Any]) -> tuple[nn.Module, dict[str, float]]:
        """The model the client evaluates (``model`` holds the received one, replaced by the model kept under
        ``evaluated_state`` when the state holds one) and extra metrics."""
        if cls.evaluated_state is not None:
            load_stored(model, state, cls.evaluated_state)
        return model, {}

    # --- checks ----------------------------------------------------------------------------------
    def check_optimizer(self, optimizer: torch.optim.Optimizer) -> None:
        """Refuse an optimizer whose steps are not the plain SGD steps of size ``lr`` the algorithm assumes."""
        name = type(self).__name__
        if type(optimizer) is not torch.optim.SGD:
            raise ValueError(f"{name} assumes plain SGD steps; got {type(optimizer).__name__}")
        for group in optimizer.param_groups:
            if group.get("momentum", 0) or group.get("weight_decay", 0) or group.get("nesterov", False):
                raise ValueError(f"{name} assumes SGD without momentum or weight decay")
            if abs(float(group["lr"]) - self.lr) > 1e-12 * max(1.0, self.lr):
                raise ValueError(f"{name} assumes the step size the server sent (lr = {self.lr}); the optimizer uses {group['lr']}")

    @property
    def lr(self) -> float:
        """The step size the server sent (``config["lr"]``)."""
        lr = float(setting(self.config, LR, type(self).__name__))
        if lr <= 0:
            raise ValueError(f"{type(self).__name__} needs lr > 0, got {lr}")
        return lr


def added(grads: Sequence[torch.Tensor | None], terms: Sequence[torch.Tensor | None]) -> list[torch.Tensor | None]:
    """``grads`` with ``terms`` added, parameter by parameter (``None``: nothing there; fewer terms: none for the rest)."""
    out = list(grads)
    for i, extra in enumerate(terms):
        if extra is not None:
            g = out[i]
            out[i] = extra if g is None else g + extra
    return out


def proximal_terms(mu: float, params: Sequence[torch.Tensor], anchor: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """``μ (w − a)``, the gradient of the proximal term ``μ/2 ||w − a||²`` (FedMCSA eq. 9, FedProx, Ditto)."""
    return [mu * (p - a) for p, a in zip(params, anchor)]


def overrides(cls: type[ClientAlgorithm], hook: str) -> bool:
    """Whether ``cls``'s ``hook`` is its own, not ``ClientAlgorithm``'s (told by the class that defines it, as a
    classmethod is a new bound method at every lookup)."""
    return next(klass for klass in cls.__mro__ if hook in vars(klass)) is not ClientAlgorithm


def has_own_step(cls: type[ClientAlgorithm]) -> bool:
    """Whether ``cls`` has its own ``step`` (a step that is not one of the user's loop)."""
    return overrides(cls, "step")


def changes_gradients(cls: type[ClientAlgorithm]) -> bool:
    """Whether ``cls``'s step changes the loss's gradient (plain SGD's does not: nothing to compute)."""
    return overrides(cls, "gradients") or overrides(cls, "gradient_terms")


class Proximal(ClientAlgorithm):
    """``μ (w − a)`` added to the gradient: the proximal term ``μ/2 ||w − a||²`` toward the anchor
    ``a``, the received model (FedMCSA eq. 9, FedProx, FedAMP; ``choose_anchor`` may pick another)."""

    name = "proximal"
    batched_state = ("anchor",)

    def __init__(self, model: nn.Module, config: Mapping[str, Any], state: ClientState | None = None,
                 loss_fn: LossFn = F.cross_entropy) -> None:
        super().__init__(model, config, state, loss_fn)
        self.mu = proximal_mu(config)
        if self.mu < 0:
            raise ValueError(f"the proximal weight must be >= 0, got {self.mu}")
        self.anchor = self.choose_anchor()

    def choose_anchor(self) -> list[torch.Tensor]:
        """The model the proximal term pulls toward: the received one."""
        return self.received

    def gradient_terms(self, params: Sequence[torch.Tensor], batch: Batch | None) -> Sequence[torch.Tensor | None]:
        return proximal_terms(self.mu, params, self.anchor)


def train_locally(algorithm: ClientAlgorithm, model: nn.Module, data: TrainData, *, steps: int, lr: float, batch_size: int,
                  generator: torch.Generator) -> tuple[LocalResult, Extras]:
    """The one local-training loop: ``steps`` fresh minibatches through ``algorithm.train_step``,
    then ``algorithm.finish``, after ``algorithm.begin``. Returns the mean training loss and what the server needs back."""
    model.train()
    data = algorithm.begin(model, data)
    stream = MinibatchStream(len(data.y), batch_size, generator)

    def next_batch() -> Batch:
        idx = stream.next()
        return data.x[idx], data.y[idx]

    total = sum(algorithm.train_step(model, next_batch, lr) for _ in range(steps))
    extras = algorithm.finish(model, data.x)
    return LocalResult(loss=total / max(steps, 1), steps=steps), extras
