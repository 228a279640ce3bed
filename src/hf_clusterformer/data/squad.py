"""SQuAD-format records ``{"id", "title", "question", "context", "answers": {"text", "answer_start"}}``: their
``datasets`` features, and the approximate token count that sizes contexts before a tokenizer exists."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import datasets

__all__ = ["squad_features"]

_APPROX_TOKEN_RE = re.compile(r"\w+|[^\w\s]+")


def approx_token_count(text: str) -> int:
    """Count words and punctuation runs: a lower bound on byte-level BPE tokens."""
    return len(_APPROX_TOKEN_RE.findall(text))


def squad_features() -> datasets.Features:
    """``datasets.Features`` of SQuAD-format records."""
    import datasets

    return datasets.Features(
        {
            "id": datasets.Value("string"),
            "title": datasets.Value("string"),
            "question": datasets.Value("string"),
            "context": datasets.Value("string"),
            "answers": {
                "text": datasets.List(datasets.Value("string")),
                "answer_start": datasets.List(datasets.Value("int32")),
            },
        }
    )
