"""Datasets and tokenizers for long-context extractive QA."""

from .longrange import (
    PERSON_NAMES,
    PLACE_NAMES,
    approx_token_count,
    generate_longrange_dataset,
    load_longrange_dataset,
    longrange_corpus,
    squad_features,
)
from .multipassage import (
    build_multipassage_dataset,
    default_squad_path,
    load_multipassage_dataset,
    read_squad,
)
from .tokenizer import (
    MODEL_MAX_LENGTH,
    PASSAGE_TOKEN,
    SPECIAL_TOKENS,
    build_longrange_tokenizer,
    build_tokenizer,
)

__all__ = [
    "MODEL_MAX_LENGTH",
    "PASSAGE_TOKEN",
    "PERSON_NAMES",
    "PLACE_NAMES",
    "SPECIAL_TOKENS",
    "approx_token_count",
    "build_longrange_tokenizer",
    "build_multipassage_dataset",
    "build_tokenizer",
    "default_squad_path",
    "generate_longrange_dataset",
    "load_longrange_dataset",
    "load_multipassage_dataset",
    "longrange_corpus",
    "read_squad",
    "squad_features",
]
