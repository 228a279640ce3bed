"""Data for long-context extractive QA: SQuAD-format records, the SQuAD-based multi-passage set and locally trained
tokenizers.

Training reads SQuAD-format json/jsonl files (`hf_clusterformer.qa_training`); the multi-passage set is built here
from the SQuAD v1.1 dev file.
"""

# approx_token_count and the tokenizer's constants: helpers that other modules import from here, out of __all__
from .multipassage import (
    build_multipassage_dataset,
    default_squad_path,
    load_multipassage_dataset,
    read_squad,
)
from .squad import approx_token_count, squad_features  # noqa: F401
from .tokenizer import MODEL_MAX_LENGTH, PASSAGE_TOKEN, SPECIAL_TOKENS, build_tokenizer  # noqa: F401

__all__ = [
    "build_multipassage_dataset",
    "build_tokenizer",
    "default_squad_path",
    "load_multipassage_dataset",
    "read_squad",
    "squad_features",
]
