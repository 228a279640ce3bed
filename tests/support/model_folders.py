"""Module-scoped fixtures of the tests that write, convert and refuse model folders: a work folder per test module
(holding ``context.txt``), the tiny tokenizer, tiny RoBERTa checkpoints, their conversion and a saved Cluster-Former
model. A test module's own fixture of the same name replaces one of these."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import CONTEXT, converted_encoder, hub_qa_model, sentence_tokenizer, tiny_roberta


@pytest.fixture(scope="module")
def work(tmp_path_factory, request) -> Path:
    """A folder of this test module's, with the long context in ``context.txt``."""
    path = tmp_path_factory.mktemp(request.module.__name__.removeprefix("test_"))
    (path / "context.txt").write_text(CONTEXT, encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def tokenizer():
    return sentence_tokenizer()


@pytest.fixture(scope="module")
def roberta(work, tokenizer) -> Path:
    """A plain tiny RoBERTa encoder (no QA head) with its tokenizer."""
    return tiny_roberta(work / "roberta", tokenizer)


@pytest.fixture(scope="module")
def roberta_qa(work, tokenizer) -> Path:
    """A plain tiny RoBERTa QA checkpoint with its tokenizer."""
    from transformers import RobertaForQuestionAnswering

    return tiny_roberta(work / "roberta-qa", tokenizer, RobertaForQuestionAnswering)


@pytest.fixture(scope="module")
def converted(work, roberta) -> Path:
    """``clusterformer convert`` of the plain encoder: its QA head is new (allowed, for fine-tuning)."""
    return converted_encoder(roberta, work / "converted")


@pytest.fixture(scope="module")
def hub_model(work, tokenizer) -> Path:
    """A Cluster-Former QA model (random, no untrained record) written by `save_for_hub`."""
    return hub_qa_model(tokenizer, work / "hub-model")
