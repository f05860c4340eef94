"""Text as token ids: a word-level vocabulary fitted on the clients' training text with Hugging Face's
``tokenizers`` (lowercased, split into words and punctuation), and LEAF's character vocabulary."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from flower_pfl.engine.extras import require

#: the word vocabulary's special tokens: padding is id 0, an unknown word id 1
PAD, UNK = "[PAD]", "[UNK]"
PAD_ID = 0

#: LEAF's 80 characters (its ``ALL_LETTERS``): a character's id is its place here; any other character's is 80
LEAF_LETTERS = "\n !\"&'(),-.0123456789:;>?ABCDEFGHIJKLMNOPQRSTUVWXYZ[]abcdefghijklmnopqrstuvwxyz}"
UNKNOWN_LETTER = len(LEAF_LETTERS)


def word_vocabulary(texts: Iterable[str], size: int) -> Any:
    """A ``tokenizers.Tokenizer`` of the ``size`` most frequent words of ``texts`` (specials included):
    BERT's normalizer (lowercase, control characters removed), words and punctuation split apart (as
    torchtext's ``basic_english``), unknown words to ``UNK``."""
    require("tokenizers", why="a text data set's vocabulary")
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.WordLevel(unk_token=UNK))
    tokenizer.normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True, strip_accents=None, lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.train_from_iterator(texts, trainers.WordLevelTrainer(vocab_size=size, special_tokens=[PAD, UNK], show_progress=False))
    return tokenizer


def encode_words(tokenizer: Any, texts: Sequence[str], length: int) -> np.ndarray:
    """``texts`` as int64 ids ``(n, length)``: cut after ``length`` words, padded at the end with ``PAD_ID``."""
    tokenizer.enable_truncation(max_length=length)
    tokenizer.enable_padding(length=length, pad_id=PAD_ID, pad_token=PAD)
    if not len(texts):
        return np.zeros((0, length), dtype=np.int64)
    return np.asarray([e.ids for e in tokenizer.encode_batch(list(texts))], dtype=np.int64)


_LETTER_IDS = {c: i for i, c in enumerate(LEAF_LETTERS)}


def encode_letters(texts: Sequence[str]) -> np.ndarray:
    """Strings of one length as int64 ids of LEAF's letters ``(n, length)``; another character is ``UNKNOWN_LETTER``."""
    return np.asarray([[_LETTER_IDS.get(c, UNKNOWN_LETTER) for c in t] for t in texts], dtype=np.int64).reshape(len(texts), -1)
