"""FedGen (Zhu, Hong, Zhou 2021): data-free knowledge distillation for heterogeneous federated learning."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from flower_pfl.engine.client_algorithm import Batch, ClientAlgorithm, ClientState, LossFn, batch_seeded_generator, setting
from flower_pfl.engine.feature_generator import FeatureGenerator, GeneratorTrainer, decode_generator, encode_generator, linear_heads
from flower_pfl.engine.functional import Functional, State, sgd
from flower_pfl.engine.layout import ParamLayout
from flower_pfl.engine.model_split import head_module
from flower_pfl.engine.params import AT_LEAST_ONE, NON_NEGATIVE, POSITIVE, Rule, param
from flower_pfl.engine.reply_checks import Reply, norm, received_vector
from flower_pfl.engine.server_algorithm import GlobalModelAlgorithm, Settings
from flower_pfl.engine.wire import encode_vector, fingerprint
from flower_pfl.methods.base import Method
from flower_pfl.methods.moon import needs_batch

#: config keys: the round's α and β (decayed), the generator's batch, its sizes and the generator itself
#: (bytes, ``encode_generator``; absent until the server has trained it)
ALPHA, BETA, BATCH = "fedgen-alpha", "fedgen-beta", "fedgen-batch-size"
NOISE_DIM, HIDDEN, GENERATOR = "fedgen-noise-dim", "fedgen-hidden", "fedgen-generator"
#: reply key: the client's label counts over the round's minibatches (float32 bytes, one per class)
LABEL_COUNTS = "fedgen-label-counts"
#: the smallest α and β the decay reaches (the authors' code)
FLOOR = 1e-4
#: the generator's learning rate is multiplied by this after every round (the authors' code, FL-bench)
GENERATOR_LR_DECAY = 0.98
DECAY = Rule(lambda v: 0 < v <= 1, "a number in (0, 1]")
AT_LEAST_TWO = Rule(lambda v: AT_LEAST_ONE(v) and v >= 2, "an integer >= 2")


def coefficient(initial: float, decay: float, server_round: int) -> float:
    """α or β in round ``t`` (1-based): ``max(10⁻⁴, initial · decay^(t−1))`` (an initial value below
    the floor stays as it is, so 0 turns the term off)."""
    return max(min(FLOOR, initial), initial * decay ** (server_round - 1))


def regularization(head: Callable[[torch.Tensor], torch.Tensor], z: torch.Tensor, target: torch.Tensor,
                   generated: torch.Tensor, drawn: torch.Tensor, alpha: float, beta: float) -> torch.Tensor:
    """FedGen's term of the client's loss on a minibatch of ``B`` examples whose representations are ``z``:
    ``β KL(target ‖ softmax(h(z))) + (B̂/B) α mean CE(h(G(ŷ)), ŷ)``, ``h`` the model's head, ``target`` =
    ``softmax(h(G(y)))`` (detached), ``generated`` = ``G(ŷ)`` for the ``B̂`` labels ``drawn``."""
    latent = F.kl_div(F.log_softmax(head(z), dim=1), target, reduction="batchmean")
    return beta * latent + len(drawn) / len(z) * alpha * F.cross_entropy(head(generated), drawn)


class FedGenClient(ClientAlgorithm):
    """FedGen's client: SGD on the loop's loss plus the generator's regularization (``regularization``);
    the labels of its minibatches are counted and returned (``fedgen-label-counts``). Before the server
    has a generator (round 1), plain local SGD that counts labels.

    Each step's random numbers (``draw``: the noise of ``G(y)``, the labels ``ŷ`` and their noise) come
    from the client's generator, seeded by the round and its first minibatch, so a run repeats. In a
    user's own loop, ``gradient_terms`` adds the regularization's gradient to the loop's."""

    name = "fedgen"
    reply_keys = (LABEL_COUNTS,)
    carried = ("counts",)
    drawn = ("target_noise", "generated_labels", "generated_noise")

    def __init__(self, model: nn.Module, config: Mapping[str, Any], state: ClientState | None = None,
                 loss_fn: LossFn = F.cross_entropy) -> None:
        super().__init__(model, config, state, loss_fn)
        self.model = model
        head = head_module(model)
        device = self.received[0].device
        self.counts = torch.zeros(head.out_features, device=device)
        self.generator: FeatureGenerator | None = None
        #: the generator's values: the step runs one client's generator for a round's clients, so clients
        #: that received other generators train apart (``batched``'s settings)
        self.generator_fingerprint: int | None = None
        self.rng: torch.Generator | None = None
        # the step's draws (``draw``): the noise of G(y), the labels ŷ and their noise (none without a generator)
        self.target_noise = self.generated_noise = torch.zeros(0, device=device)
        self.generated_labels = torch.zeros(0, dtype=torch.long, device=device)
        if GENERATOR in config:
            self.alpha, self.beta = float(setting(config, ALPHA, "FedGen")), float(setting(config, BETA, "FedGen"))
            self.batch_size = int(setting(config, BATCH, "FedGen"))
            if not (self.alpha >= 0 and self.beta >= 0 and self.batch_size >= 1):
                raise ValueError(f"FedGen needs alpha, beta >= 0 and a batch size >= 1, got {self.alpha}, {self.beta}, {self.batch_size}")
            generator = FeatureGenerator(int(setting(config, NOISE_DIM, "FedGen")), head.out_features,
                                         int(setting(config, HIDDEN, "FedGen")), head.in_features)
            self.labels = decode_generator(config[GENERATOR], generator, GENERATOR)
            if not self.labels.any():
                raise ValueError(f"'{GENERATOR}' names no class to generate")
            self.classes = self.labels.nonzero().flatten()
            self.generator = generator.to(head.weight.device)
            self.generator_fingerprint = fingerprint(t for t in generator.state_dict().values() if t.is_floating_point())

    def draw(self, batches: Sequence[Batch]) -> None:
        """The noise of ``G(y)`` for the minibatch's labels, then ``B̂`` labels ``ŷ`` drawn uniformly from the
        generator's classes and their noise (nothing without a generator)."""
        if self.generator is None:
            return
        (x, y), = batches
        if self.rng is None:  # the client's draws: seeded by the round and its first minibatch, so a run repeats
            self.rng = batch_seeded_generator(x, y, self.config)
        device, noise = self.counts.device, self.generator.noise_dim
        self.target_noise = torch.rand(len(y), noise, generator=self.rng).to(device)
        self.generated_labels = self.classes[torch.randint(len(self.classes), (self.batch_size,), generator=self.rng)].to(device)
        self.generated_noise = torch.rand(self.batch_size, noise, generator=self.rng).to(device)

    def _count(self, y: torch.Tensor) -> None:
        self.counts = self.counts + F.one_hot(y, len(self.counts)).sum(0).to(self.counts)

    def _regularization(self, f: Functional, state: State, y: torch.Tensor) -> Callable[[State, torch.Tensor], torch.Tensor] | None:
        """The step's regularization as a function of the model's state and representation ``z`` (``None``
        without a generator): its targets from the head of ``state`` (the step's start) and this step's draws."""
        if self.generator is None:
            return None
        generator, alpha, beta = self.generator, self.alpha, self.beta
        with torch.no_grad():
            target = F.softmax(f.head(state, generator(y, self.target_noise)), dim=1)
            generated = generator(self.generated_labels, self.generated_noise)
        drawn = self.generated_labels
        return lambda s, z: regularization(lambda h: f.head(s, h), z, target, generated, drawn, alpha, beta)

    def step(self, f: Functional, state: State, batches: Sequence[Batch], lr: float) -> tuple[State, torch.Tensor]:
        """One SGD step on ``CE(f(x), y)`` plus the regularization of the representation of ``x``; the
        minibatch's labels counted."""
        (x, y), = batches
        self._count(y)
        term = self._regularization(f, state, y)

        def loss_of(s: State) -> tuple[torch.Tensor, torch.Tensor]:
            if term is None:
                loss = self.loss(f(s, x), y)
                return loss, loss
            logits, z = f.with_features(s, x)
            loss = self.loss(logits, y)
            return loss + term(s, z), loss

        grads, _, _, state, loss = f.grad(loss_of, state, has_aux=True)
        return f.with_params(state, sgd(f.params(state), grads, lr)), loss

    def gradient_terms(self, params: Sequence[torch.Tensor], batch: Batch | None) -> Sequence[torch.Tensor | None]:
        """A user's loop: the regularization's gradient (the step's draws, from a second forward pass of the
        model in its current mode whose running statistics are left as they were); the labels counted."""
        x, y = needs_batch(batch, "FedGen")
        self._count(y)
        self.draw([(x, y)])
        f = Functional(self.model)
        state = f.state()
        term = self._regularization(f, state, y)
        if term is None:
            return []
        grads, *_ = f.grad(lambda s: term(s, f.with_features(s, x)[1]), state)
        return grads

    def end_round(self, model: nn.Module, inputs: Any = None) -> dict[str, bytes]:
        if self.steps < 1:
            raise ValueError("FedGen's label counts need at least one step")
        return {LABEL_COUNTS: encode_vector(self.counts)}


@dataclass
class FedGen(Method, GlobalModelAlgorithm):
    """FedGen (Zhu et al. 2021): FedAvg whose server learns a generator of features from the ensemble of
    the clients' heads, and whose clients learn from the generated features.

    Server (Algorithm 1): after each round, ``steps`` Adam steps on the generator ``G_w(ε, y)`` (``ε ~
    U[0, 1)``, one hidden layer with batch normalization, output: a head input) of
    ``Σ_k mean_n w_{y_n,k} CE(g(G_w(ε_n, y_n); θ_k), y_n) + η L_div`` (eq. 4 with the authors' label
    weighting: ``g(·; θ_k)`` client ``k``'s head, ``w_{y,k}`` its share of the participants' examples
    of ``y``; ``L_div = exp(−mean_{i,j} ||ε_i − ε_j||²/d_ε · |G_i − G_j|₁/d)``, the authors' diversity
    loss), ``y`` drawn uniformly from the classes the participants hold; then FedAvg of the models. The
    generator (its classes beside it) goes down with the next round's model.

    Client (eq. 5 with the authors' latent term): local SGD on
    ``CE(f(x), y) + β_t KL(softmax(g(G(y))) ‖ softmax(f(x))) + (B̂/B) α_t mean CE(g(G(ŷ)), ŷ)``, the
    first target detached, ``B̂`` labels ``ŷ`` drawn uniformly from the generator's classes, the
    generator in evaluation mode; ``α_t = max(10⁻⁴, α · decay^(t−1))`` and ``β_t`` alike (round
    ``t``; 0 stays 0); no generator term in round 1. Clients return the labels counted over their minibatches.

    As the authors' code (github.com/zhuangdizhu/FedGen), with its MNIST settings: generator sizes,
    Adam learning rate and weight decay, 50 generator steps per round, learning rate ×0.98 per round,
    α = β = 10, η = 1; its student term (``ensemble_beta``) is 0 there and left out. Against it:
    label counts start at 0, not 1; clients draw ``ŷ`` from the classes the generator learned, not
    from the whole data set's. FL-bench differs (5 generator steps, hidden 32, no weight decay or
    diversity term, clients' own classes, whole-split counts; its server's teacher logits come from
    the global model, not the clients'); PFLlib's client has neither α, β nor the latent term.

    The authors ran α = β = 10 at a learning rate of 0.01. At larger steps they can diverge: on the
    reference check's image setting (a CNN at lr 0.05) they do, here and in FL-bench, and the reply
    bounds then refuse every update; α = β = 1 trains there (``fedgen-alpha``, ``fedgen-beta``).
    """

    name = "fedgen"
    strategy = "FedGen"
    reads_head = True
    client = FedGenClient
    without_client_algorithm = "runs as FedAvg: the clients train without the generator and send no label counts"
    state_attributes = ("generator",)

    alpha: float = param(10.0, key="fedgen-alpha", must=NON_NEGATIVE, doc="initial weight α of the generated features' cross-entropy")
    beta: float = param(10.0, key="fedgen-beta", must=NON_NEGATIVE, doc="initial weight β of the latent (KL) term")
    decay: float = param(0.98, key="fedgen-decay", must=DECAY, doc="α and β are multiplied by this every round (floor 1e-4)")
    noise_dim: int = param(32, key="fedgen-noise-dim", must=AT_LEAST_ONE, doc="size of the generator's noise ε")
    hidden: int = param(256, key="fedgen-hidden", must=AT_LEAST_ONE, doc="width of the generator's hidden layer")
    generator_lr: float = param(3e-4, key="fedgen-generator-lr", must=POSITIVE, doc="Adam learning rate of the generator")
    weight_decay: float = param(0.01, key="fedgen-weight-decay", must=NON_NEGATIVE, doc="Adam weight decay of the generator")
    steps: int = param(50, key="fedgen-generator-steps", must=AT_LEAST_ONE, doc="generator steps per round")
    batch_size: int = param(32, key="fedgen-batch-size", must=AT_LEAST_TWO,
                            doc="generated features per step, on the server and on the clients (B̂)")
    diversity: float = param(1.0, key="fedgen-diversity", must=NON_NEGATIVE, doc="weight η of the generator's diversity loss")

    def setup(self, layout: ParamLayout, initial: torch.Tensor, device: torch.device, seed: int = 0) -> None:
        super().setup(layout, initial, device, seed)
        if len(layout.shapes) < 2 or len(layout.shapes[-2]) != 2 or layout.shapes[-1] != layout.shapes[-2][:1]:
            raise ValueError(f"FedGen needs a model ending in a linear head (a weight matrix, then its bias); shapes {list(layout.shapes)}")
        self.classes, self.dim = layout.shapes[-2]
        self.seed, self.round = seed, 1
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            network = FeatureGenerator(self.noise_dim, self.classes, self.hidden, self.dim)
        self.generator = GeneratorTrainer(network, self.generator_lr, self.weight_decay, GENERATOR_LR_DECAY)

    def begin_round(self, server_round: int) -> None:
        self.round = server_round

    def train_config(self, num_participants: int) -> Settings:
        if not self.generator.trained:
            return {}
        return {ALPHA: coefficient(self.alpha, self.decay, self.round), BETA: coefficient(self.beta, self.decay, self.round),
                BATCH: self.batch_size, NOISE_DIM: self.noise_dim, HIDDEN: self.hidden,
                GENERATOR: encode_generator(self.generator.generator, self.generator.labels)}

    def check_extras(self, extras: Mapping[str, Any]) -> torch.Tensor:
        """The client's label counts: whole, non-negative numbers, at least one example."""
        counts = received_vector(extras, LABEL_COUNTS, self.classes, "FedGen's label counts", FedGenClient.__name__)
        if (counts < 0).any() or not torch.equal(counts, counts.round()) or counts.sum() < 1:
            raise ValueError(f"'{LABEL_COUNTS}' must be whole numbers >= 0 with at least one example")
        return counts

    def example_extras(self, generator: torch.Generator) -> dict[str, bytes]:
        return {LABEL_COUNTS: encode_vector(torch.randint(1, 20, (self.classes,), generator=generator).float())}

    def update_norms(self, reply: Reply, sent: torch.Tensor) -> dict[str, tuple[float, float]]:
        """The model's change, and the label counts against the round's median."""
        return {**super().update_norms(reply, sent), LABEL_COUNTS: (norm(reply.extras), 0.0)}

    def aggregate(self, server_round: int, replies: Sequence[Reply]) -> None:
        """Train the generator on the participants' heads (before averaging), then FedAvg."""
        models = torch.stack([r.model for r in replies]).to(torch.float32)
        weights = models[:, -self.classes * (self.dim + 1):-self.classes].reshape(len(replies), self.classes, self.dim)
        heads = linear_heads(weights, models[:, -self.classes:])
        rng = torch.Generator().manual_seed(self.seed * 1_000_003 + server_round)
        self.generator.train(heads, torch.stack([r.extras for r in replies]), steps=self.steps, batch_size=self.batch_size,
                             diversity=self.diversity, rng=rng)
        super().aggregate(server_round, replies)

    def server_state(self) -> dict[str, Any]:
        """The generator and the classes it generates."""
        return {"generator": dict(self.generator.generator.state_dict()), "labels": self.generator.labels}
