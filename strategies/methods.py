"""Every method of ``flower_pfl.methods`` as a legacy-API strategy: written by ``python strategies/codegen.py``
from the method declarations (do not edit). Each class hands its hyperparameters to its method and its
other arguments to ``LegacyMethodStrategy``; ``help()`` shows them all."""

from __future__ import annotations

from typing import Unpack

from flower_pfl.engine.server_algorithm import ServerAlgorithm
from flower_pfl.methods import (
    apfl,
    apple,
    cfl,
    ditto,
    fedacs,
    fedala,
    fedamp,
    fedattn,
    fedbabu,
    fedbn,
    feddyn,
    fedfomo,
    fedmcsa,
    fedper,
    fedproto,
    fedrep,
    fedrod,
    ifca,
    igfl,
    knnper,
    lgfedavg,
    local,
    moon,
    per_fedavg,
    pfedhn,
    pfedme,
    scaffold,
)
from strategies.legacy import LegacyMethodStrategy, LegacyOptions

__all__ = ["FedACS", "FedAttn", "FedMCSA", "IGFL", "APFL", "APPLE", "CFL", "Ditto", "FedALA", "FedAMP", "FedBABU", "FedBN", "FedDyn", "FedFomo", "FedPer", "FedProto", "FedRep", "FedRoD", "HeurFedAMP", "IFCA", "KNNPer", "LGFedAvg", "Local", "MOON", "PerFedAvg", "PFedHN", "PFedMe", "SCAFFOLD"]


class FedACS(LegacyMethodStrategy):
    method_class = fedacs.FedACS

    def __init__(self, *, all_clients_train: bool = False, p: float = 0.5, **options: Unpack[LegacyOptions]) -> None:
        options.setdefault("clients_per_round", 10)
        super().__init__(fedacs.FedACS(all_clients_train=all_clients_train, p=p), **options)


class FedAttn(LegacyMethodStrategy):
    method_class = fedattn.FedAttn

    def __init__(self, *, k: int = 5, d_k: int = 16, attention_lr: float = 0.01, bias_reg: float = 0.0,
                          warmup_rounds: int = 0, learn_values: bool = True, **options: Unpack[LegacyOptions]) -> None:
        method = fedattn.FedAttn(k=k, d_k=d_k, attention_lr=attention_lr, bias_reg=bias_reg,
                                 warmup_rounds=warmup_rounds, learn_values=learn_values)
        super().__init__(method, **options)


class FedMCSA(LegacyMethodStrategy):
    method_class = fedmcsa.FedMCSA

    def __init__(self, *, all_clients_train: bool = False, sigma: float = 50.0, lam: float = 5.0,
                          grouping: str = 'tensor', client_method: ServerAlgorithm | None = None,
                          **options: Unpack[LegacyOptions]) -> None:
        options.setdefault("clients_per_round", 10)
        method = fedmcsa.FedMCSA(all_clients_train=all_clients_train, sigma=sigma, lam=lam, grouping=grouping,
                                 client_method=client_method)
        super().__init__(method, **options)


class IGFL(LegacyMethodStrategy):
    method_class = igfl.IGFL

    def __init__(self, *, attention: str | None = 'self', client_correction: bool = True,
                          **options: Unpack[LegacyOptions]) -> None:
        super().__init__(igfl.IGFL(attention=attention, client_correction=client_correction), **options)


class APFL(LegacyMethodStrategy):
    method_class = apfl.APFL

    def __init__(self, *, alpha_init: float = 0.5, alpha_lr: float = 0.02, **options: Unpack[LegacyOptions]) -> None:
        super().__init__(apfl.APFL(alpha_init=alpha_init, alpha_lr=alpha_lr), **options)


class APPLE(LegacyMethodStrategy):
    method_class = apple.APPLE

    def __init__(self, *, p_lr: float = 0.001, mu: float = 0.1, schedule_rounds: int = 16, schedule: str = 'cosine',
                          downloads: int = 0, **options: Unpack[LegacyOptions]) -> None:
        options.setdefault("clients_per_round", 10)
        method = apple.APPLE(p_lr=p_lr, mu=mu, schedule_rounds=schedule_rounds, schedule=schedule, downloads=downloads)
        super().__init__(method, **options)


class CFL(LegacyMethodStrategy):
    method_class = cfl.CFL

    def __init__(self, *, eps1: float = 0.2, eps2: float = 0.3, gamma_max: float = 0.0,
                          **options: Unpack[LegacyOptions]) -> None:
        options.setdefault("clients_per_round", 10)
        super().__init__(cfl.CFL(eps1=eps1, eps2=eps2, gamma_max=gamma_max), **options)


class Ditto(LegacyMethodStrategy):
    method_class = ditto.Ditto

    def __init__(self, *, lam: float = 1.0, **options: Unpack[LegacyOptions]) -> None:
        super().__init__(ditto.Ditto(lam=lam), **options)


class FedALA(LegacyMethodStrategy):
    method_class = fedala.FedALA

    def __init__(self, *, eta: float = 1.0, rand_percent: float = 80.0, layers: int = 1,
                          **options: Unpack[LegacyOptions]) -> None:
        options.setdefault("clients_per_round", 10)
        super().__init__(fedala.FedALA(eta=eta, rand_percent=rand_percent, layers=layers), **options)


class FedAMP(LegacyMethodStrategy):
    method_class = fedamp.FedAMP

    def __init__(self, *, all_clients_train: bool = False, alpha_k: float = 0.05, sigma: float = 1.0, lam: float = 1.0,
                          **options: Unpack[LegacyOptions]) -> None:
        options.setdefault("clients_per_round", 10)
        method = fedamp.FedAMP(all_clients_train=all_clients_train, alpha_k=alpha_k, sigma=sigma, lam=lam)
        super().__init__(method, **options)


class FedBABU(LegacyMethodStrategy):
    method_class = fedbabu.FedBABU

    def __init__(self, *, head_layers: int = 1, finetune_steps: int = 20, finetune_lr: float = 0.02,
                          finetune_batch_size: int = 20, finetune_part: str = 'head',
                          **options: Unpack[LegacyOptions]) -> None:
        options.setdefault("clients_per_round", 10)
        method = fedbabu.FedBABU(head_layers=head_layers, finetune_steps=finetune_steps, finetune_lr=finetune_lr,
                                 finetune_batch_size=finetune_batch_size, finetune_part=finetune_part)
        super().__init__(method, **options)


class FedBN(LegacyMethodStrategy):
    method_class = fedbn.FedBN

    def __init__(self, *, weighted: bool = False, **options: Unpack[LegacyOptions]) -> None:
        options.setdefault("clients_per_round", 10)
        super().__init__(fedbn.FedBN(weighted=weighted), **options)


class FedDyn(LegacyMethodStrategy):
    method_class = feddyn.FedDyn

    def __init__(self, *, alpha: float = 0.01, **options: Unpack[LegacyOptions]) -> None:
        super().__init__(feddyn.FedDyn(alpha=alpha), **options)


class FedFomo(LegacyMethodStrategy):
    method_class = fedfomo.FedFomo

    def __init__(self, *, models: int = 5, epsilon: float = 0.3, epsilon_decay: float = 0.05, val_fraction: float = 0.2,
                          **options: Unpack[LegacyOptions]) -> None:
        options.setdefault("clients_per_round", 10)
        method = fedfomo.FedFomo(models=models, epsilon=epsilon, epsilon_decay=epsilon_decay, val_fraction=val_fraction)
        super().__init__(method, **options)


class FedPer(LegacyMethodStrategy):
    method_class = fedper.FedPer

    def __init__(self, *, head_layers: int = 1, **options: Unpack[LegacyOptions]) -> None:
        options.setdefault("clients_per_round", 10)
        super().__init__(fedper.FedPer(head_layers=head_layers), **options)


class FedProto(LegacyMethodStrategy):
    method_class = fedproto.FedProto

    def __init__(self, *, lam: float = 1.0, **options: Unpack[LegacyOptions]) -> None:
        options.setdefault("clients_per_round", 10)
        super().__init__(fedproto.FedProto(lam=lam), **options)


class FedRep(LegacyMethodStrategy):
    method_class = fedrep.FedRep

    def __init__(self, *, head_layers: int = 1, body_steps: int = 1, **options: Unpack[LegacyOptions]) -> None:
        options.setdefault("clients_per_round", 10)
        super().__init__(fedrep.FedRep(head_layers=head_layers, body_steps=body_steps), **options)


class FedRoD(LegacyMethodStrategy):
    method_class = fedrod.FedRoD

    def __init__(self, *, balanced: bool = True, **options: Unpack[LegacyOptions]) -> None:
        options.setdefault("clients_per_round", 10)
        super().__init__(fedrod.FedRoD(balanced=balanced), **options)


class HeurFedAMP(LegacyMethodStrategy):
    method_class = fedamp.HeurFedAMP

    def __init__(self, *, all_clients_train: bool = False, alpha_k: float = 0.05, sigma: float = 10.0, lam: float = 1.0,
                          self_weight: float = 0.3, **options: Unpack[LegacyOptions]) -> None:
        options.setdefault("clients_per_round", 10)
        method = fedamp.HeurFedAMP(all_clients_train=all_clients_train, alpha_k=alpha_k, sigma=sigma, lam=lam,
                                   self_weight=self_weight)
        super().__init__(method, **options)


class IFCA(LegacyMethodStrategy):
    method_class = ifca.IFCA

    def __init__(self, *, num_clusters: int = 2, weighted: bool = False, **options: Unpack[LegacyOptions]) -> None:
        options.setdefault("clients_per_round", 10)
        super().__init__(ifca.IFCA(num_clusters=num_clusters, weighted=weighted), **options)


class KNNPer(LegacyMethodStrategy):
    method_class = knnper.KNNPer

    def __init__(self, *, k: int = 10, lam: float = 0.5, scale: float = 1.0, **options: Unpack[LegacyOptions]) -> None:
        options.setdefault("clients_per_round", 10)
        super().__init__(knnper.KNNPer(k=k, lam=lam, scale=scale), **options)


class LGFedAvg(LegacyMethodStrategy):
    method_class = lgfedavg.LGFedAvg

    def __init__(self, *, head_layers: int = 1, **options: Unpack[LegacyOptions]) -> None:
        options.setdefault("clients_per_round", 10)
        super().__init__(lgfedavg.LGFedAvg(head_layers=head_layers), **options)


class Local(LegacyMethodStrategy):
    method_class = local.Local

    def __init__(self, *, all_clients_train: bool = False, **options: Unpack[LegacyOptions]) -> None:
        options.setdefault("clients_per_round", 10)
        super().__init__(local.Local(all_clients_train=all_clients_train), **options)


class MOON(LegacyMethodStrategy):
    method_class = moon.MOON

    def __init__(self, *, mu: float = 1.0, tau: float = 0.5, **options: Unpack[LegacyOptions]) -> None:
        super().__init__(moon.MOON(mu=mu, tau=tau), **options)


class PerFedAvg(LegacyMethodStrategy):
    method_class = per_fedavg.PerFedAvg

    def __init__(self, *, alpha: float = 0.01, **options: Unpack[LegacyOptions]) -> None:
        super().__init__(per_fedavg.PerFedAvg(alpha=alpha), **options)


class PFedHN(LegacyMethodStrategy):
    method_class = pfedhn.PFedHN

    def __init__(self, *, embed_dim: int = 16, hidden: int = 100, hidden_layers: int = 3, hn_lr: float = 0.01,
                          embed_lr: float = 0.01, momentum: float = 0.9, weight_decay: float = 0.001,
                          clip: float = 50.0, **options: Unpack[LegacyOptions]) -> None:
        options.setdefault("clients_per_round", 10)
        method = pfedhn.PFedHN(embed_dim=embed_dim, hidden=hidden, hidden_layers=hidden_layers, hn_lr=hn_lr,
                               embed_lr=embed_lr, momentum=momentum, weight_decay=weight_decay, clip=clip)
        super().__init__(method, **options)


class PFedMe(LegacyMethodStrategy):
    method_class = pfedme.PFedMe

    def __init__(self, *, beta: float = 1.0, lam: float = 15.0, personal_lr: float = 0.01, inner_steps: int = 5,
                          **options: Unpack[LegacyOptions]) -> None:
        super().__init__(pfedme.PFedMe(beta=beta, lam=lam, personal_lr=personal_lr, inner_steps=inner_steps), **options)


class SCAFFOLD(LegacyMethodStrategy):
    method_class = scaffold.SCAFFOLD

    def __init__(self, *, server_learning_rate: float = 1.0, **options: Unpack[LegacyOptions]) -> None:
        super().__init__(scaffold.SCAFFOLD(server_learning_rate=server_learning_rate), **options)

