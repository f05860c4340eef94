"""What a model needs to know of the data it will see: one sample's shape and kind, the classes, and
for token ids the vocabulary."""

from __future__ import annotations

from dataclasses import dataclass

#: what one sample is. ``image``: float ``(channels, height, width)``; ``tokens``: int64 ids ``(length,)``;
#: ``signals``: float ``(channels, time)`` (sensor windows); ``features``: float, any shape
KINDS: tuple[str, ...] = ("image", "tokens", "signals", "features")
#: what each kind is called in messages
KIND_TEXT = {"image": "images (channels, height, width)", "tokens": "token ids (length,)",
             "signals": "signal windows (channels, time)", "features": "feature vectors"}


@dataclass(frozen=True)
class DataInfo:
    """One sample's ``input_shape`` (without the batch dimension) and ``kind`` (``KINDS``), the number of
    classes, and for token ids the ids' range ``[0, vocab_size)`` and the id that pads a sequence
    (``None``: sequences are not padded)."""

    input_shape: tuple[int, ...]
    num_classes: int
    kind: str = "features"
    vocab_size: int = 0
    padding_id: int | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {self.kind!r}")
        if self.num_classes < 1:
            raise ValueError(f"num_classes must be >= 1, got {self.num_classes}")
        if self.kind == "tokens" and self.vocab_size < 1:
            raise ValueError("token ids need a vocabulary size >= 1")
