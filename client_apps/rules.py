"""Client-side rules for your own training loop.

A method whose client is plain local training (FedACS, FedAvg+MCSA, Local, FedAvg, FedAvgM,
FedAdam) works with any ClientApp that trains the received model and sends it back. The
methods below ask a client for more; ``ClientRule.from_config`` reads which from the
training instruction's config and gives two hooks for an ordinary PyTorch loop::

    rule = ClientRule.from_config(config, model, context.state)
    optimizer = torch.optim.SGD(model.parameters(), lr=config["lr"])
    for x, y in loader:
        optimizer.zero_grad()
        F.cross_entropy(model(x), y).backward()
        rule.adjust_gradients(model, (x, y))
        optimizer.step()
    extras = rule.finish(model, train_inputs)  # bytes the strategy needs back (often none)

Send ``extras`` back as a ``ConfigRecord`` in the reply (Message API) or inside the fit
metrics (legacy API). The IGFL-C, SCAFFOLD, FedAttn and pFedMe rules assume plain SGD steps of the
instruction's ``lr`` (no momentum, weight decay, schedule or clipping); pass the optimizer to
``from_config`` to have that checked. The rules:

- proximal term ``μ/2 ||w − a||²`` (FedMCSA, FedProx, FedAMP, HeurFedAMP; the anchor ``a`` is the
  received model, or the one the client remembered for FedMCSA's clients that were not sampled);
- IGFL-C's individual and group correction (IGFL, paper 002, Algorithm 2): exactly
  ``local-steps`` steps;
- SCAFFOLD's control variates (option II), which returns ``Δc_i``;
- FedAttn's optional bias stabiliser; returns ``Z_i`` and the bias gradient (``finish`` needs
  the client's training inputs);
- pFedMe's personalized model θ_i (``adjust_gradients`` needs the minibatch): the inner
  problem is solved on the batch and the gradient replaced by ``λ (w − θ_i)``.

Ditto, APFL and Per-FedAvg train a second model or take a second minibatch per step; they
are not hooks on one loop: use this package's ClientApp (``client_apps.app``) for them.
Client state lives in ``context.state`` (``ArrayRecord`` entries named below), so it survives
between rounds on a SuperNode and in simulation alike.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Mapping, MutableMapping, Sequence

import torch
import torch.nn.functional as F
from flwr.app import ArrayRecord
from torch import nn

from flower_pfl.methods.apfl import ALPHA_LR as APFL_ALPHA_LR
from flower_pfl.methods.base import ANCHOR, ANCHOR_KEEP, ANCHOR_SET, PROXIMAL_MU
from flower_pfl.methods.ditto import LAMBDA as DITTO_LAMBDA
from flower_pfl.methods.fedattn import BIAS_GRADIENT, BIAS_REG, FEDATTN, GLOBAL_BIASES, REPRESENTATION, last_layer_input
from flower_pfl.methods.igfl import CORRECTION as IGFL_CORRECTION, GLOBAL_DELTA, PARTICIPANTS, corrected_step
from flower_pfl.methods.per_fedavg import ALPHA as PER_FEDAVG_ALPHA
from flower_pfl.methods.pfedme import INNER_STEPS, LAMBDA as PFEDME_LAMBDA, PERSONAL_LR, personalize, personalized_vector
from flower_pfl.methods.scaffold import CONTROL as SCAFFOLD_CONTROL, CONTROL_DELTA, new_control
from flower_pfl.solvers import like_params, trainable
from flower_pfl.wire import decode_vector, encode_vector

#: ``context.state`` keys: the remembered proximal anchor, IGFL's last delta, SCAFFOLD's ``c_i``,
#: Ditto's personal model, pFedMe's θ_i, APFL's personal model and α
ANCHOR_STATE, IGFL_STATE, SCAFFOLD_STATE = "proximal-anchor", "igfl-delta", "scaffold-control"
DITTO_STATE, PFEDME_STATE, APFL_STATE = "ditto-personal", "pfedme-theta", "apfl-personal"
#: the solver settings every training instruction carries (``server_apps`` sends them from the run config)
LR, LOCAL_STEPS = "lr", "local-steps"

State = MutableMapping[str, Any]


def client_method(config: Mapping[str, Any]) -> str:
    """The client rule a training instruction asks for: ``igfl-c``, ``scaffold``, ``ditto``,
    ``pfedme``, ``apfl``, ``per-fedavg``, ``fedattn``, or ``local-sgd`` (with a proximal term when
    ``proximal-mu`` or Flower's legacy ``proximal_mu`` is set)."""
    if config.get(IGFL_CORRECTION):
        return "igfl-c"
    for key, method in ((SCAFFOLD_CONTROL, "scaffold"), (DITTO_LAMBDA, "ditto"), (PFEDME_LAMBDA, "pfedme"),
                        (APFL_ALPHA_LR, "apfl"), (PER_FEDAVG_ALPHA, "per-fedavg")):
        if key in config:
            return method
    return "fedattn" if config.get(FEDATTN) else "local-sgd"


def proximal_mu(config: Mapping[str, Any]) -> float:
    """The proximal weight μ of an instruction (0: none)."""
    return float(config.get(PROXIMAL_MU, config.get("proximal_mu", 0.0)))


def stored(state: State | None, key: str) -> list[torch.Tensor] | None:
    """The tensors kept under ``key`` in the client's state (``None`` if there are none)."""
    record = state.get(key) if state is not None else None
    return [torch.as_tensor(a) for a in record.to_numpy_ndarrays()] if record is not None else None


def keep(state: State | None, key: str, tensors: Iterable[torch.Tensor]) -> None:
    """Keep ``tensors`` under ``key`` in the client's state (nothing without a state)."""
    if state is not None:
        state[key] = ArrayRecord([t.detach().cpu().numpy() for t in tensors])


def proximal_anchor(mode: Any, params: Sequence[torch.Tensor], state: State | None) -> list[torch.Tensor] | None:
    """The anchor of the proximal term (``None``: the received model, ``params`` now).

    ``set``: remember the received model in the state; ``keep``: the one remembered last (the
    received model if there is none, e.g. after a restart; FedMCSA's Algorithm 1, lines 8-14).
    """
    if mode == ANCHOR_SET:
        keep(state, ANCHOR_STATE, params)
    elif mode == ANCHOR_KEEP and (remembered := stored(state, ANCHOR_STATE)) is not None:
        return remembered
    return None


def _setting(config: Mapping[str, Any], key: str, method: str) -> Any:
    if key not in config:
        raise ValueError(f"{method}'s client needs '{key}' in the training config (send it with the strategy's train config)")
    return config[key]


class ClientRule:
    """Plain local training: no gradient change, nothing to send back."""

    #: the rule keeps something in the client's state between rounds (so it needs ``context.state``)
    needs_state = False
    #: the rule's arithmetic assumes plain SGD steps of size ``config["lr"]``
    needs_plain_sgd = False

    def __init__(self, model: nn.Module, config: Mapping[str, Any], state: State | None,
                 loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = F.cross_entropy) -> None:
        if self.needs_state and state is None:
            raise ValueError(f"{type(self).__name__} keeps client state between rounds: pass context.state")
        self.config, self.state, self.loss_fn = config, state, loss_fn
        self.received = [p.detach().clone() for p in trainable(model)]
        self.steps = 0

    @staticmethod
    def from_config(config: Mapping[str, Any], model: nn.Module, state: State | None = None,
                    optimizer: torch.optim.Optimizer | None = None,
                    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = F.cross_entropy) -> ClientRule:
        """The rule a training instruction asks for; call it after loading the received model.

        ``state``: the node's ``context.state``; ``optimizer``: checked to be what the rule assumes
        (plain SGD, no momentum or weight decay, ``lr`` as sent) when given; ``loss_fn(logits, y)``:
        your loss, for rules that evaluate it themselves (pFedMe's inner problem).
        """
        method = client_method(config)
        rules: dict[str, type[ClientRule]] = {"igfl-c": IGFLCorrection, "scaffold": ScaffoldCorrection, "pfedme": PFedMeRule,
                                              "fedattn": FedAttnRule, "local-sgd": Proximal if proximal_mu(config) > 0 else ClientRule}
        if method not in rules:
            raise ValueError(f"{method}'s client trains a second model or takes a second minibatch per step; "
                             "use client_apps.app's ClientApp for it")
        rule = rules[method](model, config, state, loss_fn)
        if optimizer is not None and rule.needs_plain_sgd:
            rule.check_optimizer(optimizer)
        return rule

    def check_optimizer(self, optimizer: torch.optim.Optimizer) -> None:
        """Refuse an optimizer whose steps are not the plain SGD steps of size ``lr`` the rule assumes."""
        name = type(self).__name__
        if type(optimizer) is not torch.optim.SGD:
            raise ValueError(f"{name} assumes plain SGD steps; got {type(optimizer).__name__}")
        for group in optimizer.param_groups:
            if group.get("momentum", 0) or group.get("weight_decay", 0) or group.get("nesterov", False):
                raise ValueError(f"{name} assumes SGD without momentum or weight decay")
            if abs(float(group["lr"]) - self.lr) > 1e-12 * max(1.0, self.lr):
                raise ValueError(f"{name} assumes the step size the server sent (lr = {self.lr}); the optimizer uses {group['lr']}")

    def adjust_gradients(self, model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor] | None = None) -> None:
        """Call after ``loss.backward()`` and before ``optimizer.step()``."""
        self.steps += 1
        with torch.no_grad():
            for p, extra in zip(trainable(model), self._gradient_terms(model, batch)):
                if extra is not None:
                    p.grad = extra if p.grad is None else p.grad + extra

    def _gradient_terms(self, model: nn.Module, batch: Any) -> Sequence[torch.Tensor | None]:
        return []

    def finish(self, model: nn.Module, inputs: torch.Tensor | Iterable[Any] | None = None) -> dict[str, bytes]:
        """Call after the loop; updates the client's state and returns the bytes to send back."""
        return {}

    @property
    def lr(self) -> float:
        """The step size the server sent (``config["lr"]``)."""
        lr = float(_setting(self.config, LR, type(self).__name__))
        if lr <= 0:
            raise ValueError(f"{type(self).__name__} needs lr > 0, got {lr}")
        return lr


class Proximal(ClientRule):
    """``μ (w − a)`` added to the gradient: the proximal term ``μ/2 ||w − a||²`` (FedMCSA eq. 9, FedProx)."""

    def __init__(self, model: nn.Module, config: Mapping[str, Any], state: State | None, loss_fn: Any = F.cross_entropy) -> None:
        super().__init__(model, config, state, loss_fn)
        self.mu = proximal_mu(config)
        if config.get(ANCHOR) in (ANCHOR_SET, ANCHOR_KEEP) and state is None:
            raise ValueError("this proximal rule remembers its anchor between rounds: pass context.state")
        anchor = proximal_anchor(config.get(ANCHOR), self.received, state)
        self.anchor = like_params(anchor, self.received, "anchor") if anchor is not None else self.received

    def _gradient_terms(self, model: nn.Module, batch: Any) -> Sequence[torch.Tensor | None]:
        return [self.mu * (p - a) for p, a in zip(trainable(model), self.anchor)]


class IGFLCorrection(ClientRule):
    """IGFL-C (Algorithm 2): the gradient is replaced by the one whose SGD step is ``Δ_I + Δ_G``."""

    needs_state = needs_plain_sgd = True

    def __init__(self, model: nn.Module, config: Mapping[str, Any], state: State | None, loss_fn: Any = F.cross_entropy) -> None:
        super().__init__(model, config, state, loss_fn)
        prev = stored(state, IGFL_STATE)
        self.previous = [torch.zeros_like(r) for r in self.received] if prev is None else like_params(prev, self.received, "last delta")
        self.global_delta = like_params(decode_vector(_setting(config, GLOBAL_DELTA, "IGFL-C"), self.received), self.received,
                                        "global delta")
        self.participants = int(_setting(config, PARTICIPANTS, "IGFL-C"))
        self.total_steps = int(_setting(config, LOCAL_STEPS, "IGFL-C"))

    def adjust_gradients(self, model: nn.Module, batch: Any = None) -> None:
        self.steps += 1
        lr = self.lr
        with torch.no_grad():
            for p, dp, dg in zip(trainable(model), self.previous, self.global_delta):
                grad = p.grad if p.grad is not None else torch.zeros_like(p)
                p.grad = -corrected_step(grad, dp, dg, lr=lr, steps=self.total_steps, num_participants=self.participants) / lr

    def finish(self, model: nn.Module, inputs: Any = None) -> dict[str, bytes]:
        if self.steps != self.total_steps:
            raise ValueError(f"IGFL-C's correction assumes local-steps = {self.total_steps} steps; {self.steps} were taken")
        keep(self.state, IGFL_STATE, [p.detach() - r for p, r in zip(trainable(model), self.received)])
        return {}


class ScaffoldCorrection(ClientRule):
    """SCAFFOLD, option II: gradient ``g + c − c_i``; ``finish`` updates ``c_i`` and returns ``Δc_i``."""

    needs_state = needs_plain_sgd = True

    def __init__(self, model: nn.Module, config: Mapping[str, Any], state: State | None, loss_fn: Any = F.cross_entropy) -> None:
        super().__init__(model, config, state, loss_fn)
        c = decode_vector(_setting(config, SCAFFOLD_CONTROL, "SCAFFOLD"), self.received)
        self.c_global = like_params(c, self.received, "global control variate")
        ci = stored(state, SCAFFOLD_STATE)
        self.c_local = [torch.zeros_like(r) for r in self.received] if ci is None else like_params(ci, self.received, "control variate")

    def _gradient_terms(self, model: nn.Module, batch: Any) -> Sequence[torch.Tensor | None]:
        return [cg - cl for cg, cl in zip(self.c_global, self.c_local)]

    def finish(self, model: nn.Module, inputs: Any = None) -> dict[str, bytes]:
        if self.steps < 1:
            raise ValueError("SCAFFOLD's control variate needs at least one step")
        new = new_control(self.c_local, self.c_global, self.received, trainable(model), steps=self.steps, lr=self.lr)
        keep(self.state, SCAFFOLD_STATE, new)
        return {CONTROL_DELTA: encode_vector(torch.cat([(n - o).flatten() for n, o in zip(new, self.c_local)]))}


class FedAttnRule(ClientRule):
    """FedAttn's client (Algorithm 1, localSolver): optional stabiliser ``ρ (b − b_G)`` on the biases;
    ``finish(model, inputs)`` returns ``Z_i`` and the mean bias gradient ``(M̃_i − M_i) / (η T)``."""

    needs_plain_sgd = True

    def __init__(self, model: nn.Module, config: Mapping[str, Any], state: State | None, loss_fn: Any = F.cross_entropy) -> None:
        super().__init__(model, config, state, loss_fn)
        self.is_bias = [n.endswith("bias") for n, p in model.named_parameters() if p.requires_grad]
        self.reg = float(config.get(BIAS_REG, 0.0))
        biases = [r for r, b in zip(self.received, self.is_bias) if b]
        self.global_biases = decode_vector(_setting(config, GLOBAL_BIASES, "FedAttn"), biases) if self.reg > 0 else biases

    def _gradient_terms(self, model: nn.Module, batch: Any) -> Sequence[torch.Tensor | None]:
        if self.reg <= 0:
            return []
        anchors = iter(self.global_biases)
        return [self.reg * (p - next(anchors).to(device=p.device, dtype=p.dtype)) if b else None
                for p, b in zip(trainable(model), self.is_bias)]

    def finish(self, model: nn.Module, inputs: torch.Tensor | Iterable[Any] | None = None) -> dict[str, bytes]:
        if inputs is None:
            raise ValueError("FedAttn's client reports a representation of its training inputs: pass them to finish()")
        if self.steps < 1:
            raise ValueError("FedAttn's bias gradient needs at least one step")
        x = inputs if isinstance(inputs, torch.Tensor) else torch.cat([b[0] if isinstance(b, (tuple, list)) else b for b in inputs])
        device = self.received[0].device
        gradient = torch.cat([(r - p.detach()).flatten() for r, p, b in zip(self.received, trainable(model), self.is_bias) if b])
        return {REPRESENTATION: encode_vector(last_layer_input(model, x.to(device))),
                BIAS_GRADIENT: encode_vector(gradient / (self.lr * self.steps))}


class PFedMeRule(ClientRule):
    """pFedMe (Algorithm 1): per step, θ_i from ``K`` steps on the minibatch's ``f(θ) + λ/2 ||θ − w||²``,
    then the gradient of ``w`` is ``λ (w − θ_i)`` (your own gradient is discarded). ``finish`` keeps θ_i
    in the state (``pfedme-theta``)."""

    needs_plain_sgd = True

    def __init__(self, model: nn.Module, config: Mapping[str, Any], state: State | None, loss_fn: Any = F.cross_entropy) -> None:
        super().__init__(model, config, state, loss_fn)
        self.lam = float(_setting(config, PFEDME_LAMBDA, "pFedMe"))
        self.personal_lr = float(_setting(config, PERSONAL_LR, "pFedMe"))
        self.inner_steps = int(_setting(config, INNER_STEPS, "pFedMe"))
        self.theta = [r.clone() for r in self.received]

    def adjust_gradients(self, model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor] | None = None) -> None:
        if batch is None:
            raise ValueError("pFedMe solves its inner problem on the minibatch: pass (x, y) to adjust_gradients")
        x, y = batch
        self.theta, _ = personalize(model, self.theta, lambda out: self.loss_fn(out, y), x, lam=self.lam,
                                    personal_lr=self.personal_lr, inner_steps=self.inner_steps)
        self.steps += 1
        with torch.no_grad():
            for p, t in zip(trainable(model), self.theta):
                p.grad = self.lam * (p - t)

    def finish(self, model: nn.Module, inputs: Any = None) -> dict[str, bytes]:
        keep(self.state, PFEDME_STATE, [personalized_vector(model, self.theta)])
        return {}
