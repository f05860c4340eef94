"""FEMNIST (LEAF, Caldas et al. 2018): EMNIST by writer, from the hub."""

from __future__ import annotations

from dataclasses import dataclass

from flower_pfl.experiment.data.hub import Hub
from flower_pfl.experiment.data.info import DataInfo
from flower_pfl.experiment.datasets.base import DataSet


@dataclass
class FEMNIST(DataSet):
    """FEMNIST (LEAF, Caldas et al. 2018): grey 28x28 characters of 62 classes by some 3,600 writers; naturally
    one writer per client."""

    name = "femnist"
    kind = "image"
    natural = "writer"
    hub = Hub("flwrlabs/femnist", x="image", y="character", group="writer_id", splits=("train",))
    has_files = False
    files_text = "the hub's files (`flwrlabs/femnist`)"

    def info(self) -> DataInfo:
        return DataInfo((1, 28, 28), 62, self.kind)
