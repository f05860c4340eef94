"""Every method of ``flower_pfl.methods`` as a Message-API strategy: written by ``python strategies/codegen.py``
from the method declarations (do not edit). Each class hands its hyperparameters to its method and its
other arguments to ``MethodStrategy``; ``help()`` shows them all."""

from __future__ import annotations

from typing import Unpack

from flower_pfl.engine.server_step import ServerStep
from flower_pfl.methods import apfl, ditto, fedacs, fedamp, fedattn, fedmcsa, fedper, igfl, local, per_fedavg, pfedme, scaffold
from strategies.message.method_strategy import MessageOptions, MethodStrategy

__all__ = ["FedACS", "FedAttn", "FedMCSA", "IGFL", "APFL", "Ditto", "FedAMP", "FedPer", "HeurFedAMP", "Local", "PerFedAvg", "PFedMe", "SCAFFOLD"]


class FedACS(MethodStrategy):
    method_class = fedacs.FedACS

    def __init__(self, *, all_clients_train: bool = False, p: float = 0.5, **options: Unpack[MessageOptions]) -> None:
        options.setdefault("clients_per_round", 10)
        super().__init__(fedacs.FedACS(all_clients_train=all_clients_train, p=p), **options)


class FedAttn(MethodStrategy):
    method_class = fedattn.FedAttn

    def __init__(self, *, k: int = 5, d_k: int = 16, attention_lr: float = 0.01, bias_reg: float = 0.0,
                          warmup_rounds: int = 0, learn_values: bool = True, **options: Unpack[MessageOptions]) -> None:
        method = fedattn.FedAttn(k=k, d_k=d_k, attention_lr=attention_lr, bias_reg=bias_reg,
                                 warmup_rounds=warmup_rounds, learn_values=learn_values)
        super().__init__(method, **options)


class FedMCSA(MethodStrategy):
    method_class = fedmcsa.FedMCSA

    def __init__(self, *, all_clients_train: bool = False, sigma: float = 50.0, lam: float = 5.0,
                          grouping: str = 'tensor', client_method: ServerStep | None = None,
                          **options: Unpack[MessageOptions]) -> None:
        options.setdefault("clients_per_round", 10)
        method = fedmcsa.FedMCSA(all_clients_train=all_clients_train, sigma=sigma, lam=lam, grouping=grouping,
                                 client_method=client_method)
        super().__init__(method, **options)


class IGFL(MethodStrategy):
    method_class = igfl.IGFL

    def __init__(self, *, attention: str | None = 'self', client_correction: bool = True,
                          **options: Unpack[MessageOptions]) -> None:
        super().__init__(igfl.IGFL(attention=attention, client_correction=client_correction), **options)


class APFL(MethodStrategy):
    method_class = apfl.APFL

    def __init__(self, *, alpha_init: float = 0.5, alpha_lr: float = 0.02, **options: Unpack[MessageOptions]) -> None:
        super().__init__(apfl.APFL(alpha_init=alpha_init, alpha_lr=alpha_lr), **options)


class Ditto(MethodStrategy):
    method_class = ditto.Ditto

    def __init__(self, *, lam: float = 1.0, **options: Unpack[MessageOptions]) -> None:
        super().__init__(ditto.Ditto(lam=lam), **options)


class FedAMP(MethodStrategy):
    method_class = fedamp.FedAMP

    def __init__(self, *, all_clients_train: bool = False, alpha_k: float = 0.05, sigma: float = 1.0, lam: float = 1.0,
                          **options: Unpack[MessageOptions]) -> None:
        options.setdefault("clients_per_round", 10)
        method = fedamp.FedAMP(all_clients_train=all_clients_train, alpha_k=alpha_k, sigma=sigma, lam=lam)
        super().__init__(method, **options)


class FedPer(MethodStrategy):
    method_class = fedper.FedPer

    def __init__(self, *, head_layers: int = 1, **options: Unpack[MessageOptions]) -> None:
        options.setdefault("clients_per_round", 10)
        super().__init__(fedper.FedPer(head_layers=head_layers), **options)


class HeurFedAMP(MethodStrategy):
    method_class = fedamp.HeurFedAMP

    def __init__(self, *, all_clients_train: bool = False, alpha_k: float = 0.05, sigma: float = 10.0, lam: float = 1.0,
                          self_weight: float = 0.3, **options: Unpack[MessageOptions]) -> None:
        options.setdefault("clients_per_round", 10)
        method = fedamp.HeurFedAMP(all_clients_train=all_clients_train, alpha_k=alpha_k, sigma=sigma, lam=lam,
                                   self_weight=self_weight)
        super().__init__(method, **options)


class Local(MethodStrategy):
    method_class = local.Local

    def __init__(self, *, all_clients_train: bool = False, **options: Unpack[MessageOptions]) -> None:
        options.setdefault("clients_per_round", 10)
        super().__init__(local.Local(all_clients_train=all_clients_train), **options)


class PerFedAvg(MethodStrategy):
    method_class = per_fedavg.PerFedAvg

    def __init__(self, *, alpha: float = 0.01, **options: Unpack[MessageOptions]) -> None:
        super().__init__(per_fedavg.PerFedAvg(alpha=alpha), **options)


class PFedMe(MethodStrategy):
    method_class = pfedme.PFedMe

    def __init__(self, *, beta: float = 1.0, lam: float = 15.0, personal_lr: float = 0.01, inner_steps: int = 5,
                          **options: Unpack[MessageOptions]) -> None:
        super().__init__(pfedme.PFedMe(beta=beta, lam=lam, personal_lr=personal_lr, inner_steps=inner_steps), **options)


class SCAFFOLD(MethodStrategy):
    method_class = scaffold.SCAFFOLD

    def __init__(self, *, server_learning_rate: float = 1.0, **options: Unpack[MessageOptions]) -> None:
        super().__init__(scaffold.SCAFFOLD(server_learning_rate=server_learning_rate), **options)

