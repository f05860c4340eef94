"""Models of token sequences: fastText, TextCNN, an LSTM and a transformer encoder, each on an embedding
of the data's vocabulary (PFLlib's text models, with padding masked)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from flower_pfl.engine.params import AT_LEAST_ONE, param
from flower_pfl.experiment.data.info import DataInfo
from flower_pfl.experiment.models.base import ModelFamily, ModelSettings, scaled, shape_error

#: TextCNN's kernel sizes and channels per kernel (Kim 2014)
KERNELS, CHANNELS = (3, 4, 5), 100


def not_padding(x: torch.Tensor, padding_id: int | None) -> torch.Tensor:
    """Which tokens of ``x`` are real, as floats ``(n, length)`` (all of them without padding)."""
    return torch.ones_like(x, dtype=torch.float32) if padding_id is None else (x != padding_id).float()


class FastText(nn.Module):
    """fastText (Joulin et al. 2017) as PFLlib has it: the mean of the real tokens' embeddings, a linear
    hidden layer (no activation: the model stays linear in the mean embedding) and the head ``fc``."""

    head_name = "fc"

    def __init__(self, data: DataInfo, embed: int, hidden: int) -> None:
        super().__init__()
        self.padding_id = data.padding_id
        self.embedding = nn.Embedding(data.vocab_size, embed, padding_idx=data.padding_id)
        self.fc1 = nn.Linear(embed, hidden)
        self.fc = nn.Linear(hidden, data.num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        real = not_padding(x, self.padding_id)
        mean = (self.embedding(x) * real[..., None]).sum(1) / real.sum(1, keepdim=True).clamp(min=1)
        return self.fc(self.fc1(mean))


class TextCNN(nn.Module):
    """TextCNN (Kim 2014): one-dimensional convolutions of kernel sizes 3, 4, 5 over the embedded sequence
    (``CHANNELS`` each), ReLU, the maximum over time, dropout and the head ``fc``."""

    head_name = "fc"

    def __init__(self, data: DataInfo, embed: int, channels: int, dropout: float) -> None:
        super().__init__()
        self.embedding = nn.Embedding(data.vocab_size, embed, padding_idx=data.padding_id)
        self.convs = nn.ModuleList(nn.Conv1d(embed, channels, k) for k in KERNELS)
        self.dropout = nn.Dropout(dropout)
        self.fc = nn.Linear(channels * len(KERNELS), data.num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        e = self.embedding(x).transpose(1, 2)
        pooled = [F.relu(conv(e)).amax(2) for conv in self.convs]
        return self.fc(self.dropout(torch.cat(pooled, 1)))


class LSTMClassifier(nn.Module):
    """An embedding, a stacked LSTM (dropout between its layers) and the head ``fc`` on its output at the
    last real token (sequences padded at the end)."""

    head_name = "fc"

    def __init__(self, data: DataInfo, embed: int, hidden: int, layers: int, dropout: float) -> None:
        super().__init__()
        self.padding_id = data.padding_id
        self.embedding = nn.Embedding(data.vocab_size, embed, padding_idx=data.padding_id)
        self.lstm = nn.LSTM(embed, hidden, layers, batch_first=True, dropout=dropout if layers > 1 else 0.0)
        self.fc = nn.Linear(hidden, data.num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.lstm(self.embedding(x))
        last = (not_padding(x, self.padding_id).sum(1).long() - 1).clamp(min=0)
        return self.fc(out[torch.arange(len(x), device=x.device), last])


def sinusoids(length: int, dim: int, device: torch.device) -> torch.Tensor:
    """The sinusoidal position encodings (Vaswani et al. 2017) of positions ``0..length-1``, ``(length, dim)``."""
    position = torch.arange(length, device=device, dtype=torch.float32)[:, None]
    frequency = torch.exp(torch.arange(0, dim, 2, device=device, dtype=torch.float32) * (-math.log(10000.0) / dim))
    out = torch.zeros(length, dim, device=device)
    out[:, 0::2] = torch.sin(position * frequency)
    out[:, 1::2] = torch.cos(position * frequency)[:, : dim // 2]
    return out


class TransformerClassifier(nn.Module):
    """A transformer encoder (Vaswani et al. 2017) over the embedding (scaled by √d) plus sinusoidal
    positions, padding masked, then the mean over the real tokens and the head ``fc``. The positions are
    computed, not stored: the model keeps no buffers."""

    head_name = "fc"

    def __init__(self, data: DataInfo, dim: int, heads: int, layers: int, dropout: float) -> None:
        super().__init__()
        self.padding_id, self.dim = data.padding_id, dim
        self.embedding = nn.Embedding(data.vocab_size, dim, padding_idx=data.padding_id)
        layer = nn.TransformerEncoderLayer(dim, heads, 4 * dim, dropout, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.fc = nn.Linear(dim, data.num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        real = not_padding(x, self.padding_id)
        real[:, 0] = 1.0  # a sequence of padding alone still attends to its first position
        h = self.embedding(x) * math.sqrt(self.dim) + sinusoids(x.shape[1], self.dim, x.device)
        h = self.encoder(h, src_key_padding_mask=real == 0)
        return self.fc((h * real[..., None]).sum(1) / real.sum(1, keepdim=True))


@dataclass
class TextModels(ModelFamily):
    """Models of token sequences (PFLlib's text models): fastText, TextCNN, an LSTM and a transformer, each
    on an embedding of the data's vocabulary, padding masked."""

    models = {
        "fasttext": "fastText (Joulin et al. 2017): mean embedding, a linear hidden layer, the head",
        "textcnn": "TextCNN (Kim 2014): convolutions of widths 3, 4, 5 (100 channels each), max over time, dropout, the head",
        "lstm": "an LSTM of `text-layers` layers, its output at the last real token, the head",
        "transformer": "a transformer encoder of `text-layers` layers and `text-heads` heads, sinusoidal positions, "
                       "mean over the real tokens, the head",
    }
    takes = ("tokens",)

    embed_dim: int = param(64, key="text-embed-dim", must=AT_LEAST_ONE,
                           doc="embedding size of the text models (the transformer's width; PFLlib's feature_dim: 512)")
    hidden: int = param(64, key="text-hidden", must=AT_LEAST_ONE, doc="fastText's hidden layer and the LSTM's state size")
    layers: int = param(2, key="text-layers", must=AT_LEAST_ONE, doc="the LSTM's and the transformer's layers")
    heads: int = param(4, key="text-heads", must=AT_LEAST_ONE,
                       doc="the transformer's attention heads (they divide text-embed-dim times model-width)")

    def build(self, name: str, data: DataInfo, settings: ModelSettings) -> nn.Module:
        if data.kind != "tokens" or len(data.input_shape) != 1:
            raise shape_error(name, data, "token ids (length,)")
        embed, hidden = scaled(self.embed_dim, settings.width), scaled(self.hidden, settings.width)
        if name == "fasttext":
            return FastText(data, embed, hidden)
        if name == "textcnn":
            if data.input_shape[0] < max(KERNELS):
                raise shape_error(name, data, f"sequences of at least {max(KERNELS)} tokens")
            return TextCNN(data, embed, scaled(CHANNELS, settings.width), settings.dropout)
        if name == "lstm":
            return LSTMClassifier(data, embed, hidden, self.layers, settings.dropout)
        if embed % self.heads:
            raise ValueError(f"model 'transformer': text-heads = {self.heads} must divide its width "
                             f"(text-embed-dim x model-width = {embed})")
        return TransformerClassifier(data, embed, self.heads, self.layers, settings.dropout)
