"""Office-Caltech-10 (Gong et al. 2012) under feature shift: clients grouped by domain, FedBN's setting."""

from __future__ import annotations

from dataclasses import dataclass

from flower_pfl.engine.params import comma_list, param, some_of
from flower_pfl.experiment.datasets.base import ClassFolders

#: the four domains: Amazon product photos, Caltech-256, DSLR and webcam photos of office objects
DOMAINS = ("amazon", "caltech", "dslr", "webcam")


@dataclass
class OfficeCaltech10(ClassFolders):
    """Office-Caltech-10 (Gong et al. 2012; FedBN, Li et al. 2021): 2,533 colour photographs of the 10 classes
    Office-31 and Caltech-256 share, from four domains (Amazon 958, Caltech 1,123, DSLR 157, webcam 295), resized
    to 64x64; client i holds domain i mod their number."""

    name = "office-caltech10"
    natural = "domain"
    folder, side, parts, parts_are_domains = "office_caltech_10", 64, DOMAINS, True
    class_names = ("back_pack", "bike", "calculator", "headphones", "keyboard", "laptop_computer", "monitor", "mouse", "mug",
                   "projector")
    files_text = f"FedBN's `{folder}/<domain>/<class>/*.jpg` (its office_caltech_10 archive unpacked; domains {', '.join(DOMAINS)})"

    domains: str = param(",".join(DOMAINS), key="office-caltech10-domains", must=some_of(DOMAINS, "domains"),
                         doc="the domains, comma-separated: client i holds domain i mod their number (amazon, caltech, dslr, webcam)")

    def chosen_parts(self) -> tuple[str, ...]:
        return tuple(comma_list(self.domains))
