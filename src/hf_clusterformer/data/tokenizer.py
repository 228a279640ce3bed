"""Byte-level BPE tokenizers trained locally and wrapped as ``RobertaTokenizerFast``."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from typing import TYPE_CHECKING

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

from ..pipeline import PASSAGE_TOKEN  # the token the pipeline reads as a passage start: one home

if TYPE_CHECKING:
    from transformers import RobertaTokenizerFast

__all__ = ["build_tokenizer"]

SPECIAL_TOKENS = ("<s>", "<pad>", "</s>", "<unk>", "<mask>", PASSAGE_TOKEN)
"""Special tokens; their ids are their positions: ``<s>=0, <pad>=1, </s>=2, <unk>=3,
<mask>=4, <p>=5``."""
MODEL_MAX_LENGTH = 1_000_000
"""Large enough that long contexts never trigger length warnings."""


def build_tokenizer(
    texts: Iterable[str],
    vocab_size: int = 2000,
    save_dir: str | os.PathLike[str] | None = None,
    min_frequency: int = 2,
) -> RobertaTokenizerFast:
    """Train a byte-level BPE on ``texts`` and wrap it as a RoBERTa tokenizer.

    Pair inputs encode as ``<s> question </s></s> context </s>`` with character offsets into
    each text. ``<p>`` is an extra special token. With ``save_dir`` the tokenizer is also
    saved there (``save_pretrained`` layout).
    """
    if vocab_size < 256 + len(SPECIAL_TOKENS):
        least = 256 + len(SPECIAL_TOKENS)
        raise ValueError(f"vocab_size must be at least {least}, got {vocab_size}")
    from transformers import RobertaTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(texts, trainer=trainer)
    model = json.loads(bpe.to_str())["model"]
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model["merges"]]
    tokenizer = RobertaTokenizerFast(
        vocab=model["vocab"],
        merges=merges,
        mask_token=AddedToken("<mask>", lstrip=True, rstrip=False, special=True),
        extra_special_tokens=[AddedToken(PASSAGE_TOKEN, lstrip=True, rstrip=False, special=True)],
        model_max_length=MODEL_MAX_LENGTH,
    )
    for i, token in enumerate(SPECIAL_TOKENS):
        if tokenizer.convert_tokens_to_ids(token) != i:
            raise RuntimeError(f"special token {token!r} did not get id {i}")
    if save_dir is not None:
        tokenizer.save_pretrained(save_dir)
    return tokenizer

