"""LEAF's next-character model for Shakespeare (Caldas et al. 2018)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from flower_pfl.experiment.data.info import DataInfo
from flower_pfl.experiment.models.base import ModelFamily, ModelSettings, scaled, shape_error

#: LEAF's sizes: an 8-dimensional character embedding, two LSTM layers of 256 units
EMBED, HIDDEN, LAYERS = 8, 256, 2


class CharLSTM(nn.Module):
    """An embedding of the characters, a two-layer LSTM and the head ``fc`` on its last step's output."""

    head_name = "fc"

    def __init__(self, vocab_size: int, num_classes: int, width: float = 1.0) -> None:
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, scaled(EMBED, width))
        self.lstm = nn.LSTM(scaled(EMBED, width), scaled(HIDDEN, width), LAYERS, batch_first=True)
        self.fc = nn.Linear(scaled(HIDDEN, width), num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.lstm(self.embedding(x))
        return self.fc(out[:, -1])


@dataclass
class CharLSTMs(ModelFamily):
    """LEAF's Shakespeare model (Caldas et al. 2018): characters embedded in 8 dimensions, two LSTM layers
    of 256 units, the head on the last step."""

    models = {"char-lstm": "LEAF's next-character model: an 8-dimensional embedding, two 256-unit LSTM layers, the head "
                           "on the last step"}
    takes = ("tokens",)

    def build(self, name: str, data: DataInfo, settings: ModelSettings) -> nn.Module:
        if data.kind != "tokens" or len(data.input_shape) != 1:
            raise shape_error(name, data, "character ids (length,)")
        return CharLSTM(data.vocab_size, data.num_classes, settings.width)
