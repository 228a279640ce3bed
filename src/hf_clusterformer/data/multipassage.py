"""Multi-passage long-context QA built from SQuAD v1.1 (Quasar-T / SearchQA style).

Each record keeps one SQuAD question and its answers. Its context is the question's gold
paragraph shuffled among distractor paragraphs from *other* articles, each passage prefixed
with the passage token: ``"<p> passage one <p> passage two ..."``. Answer offsets are moved
to the gold passage's place in the joined context.
"""

from __future__ import annotations

import functools
import json
import os
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import datasets

from .squad import approx_token_count, squad_features
from .tokenizer import PASSAGE_TOKEN

__all__ = ["build_multipassage_dataset", "default_squad_path", "load_multipassage_dataset", "read_squad"]

SQUAD_PATH_ENV = "CLUSTERFORMER_SQUAD_PATH"
"""Environment variable that overrides :func:`default_squad_path`."""


def default_squad_path() -> Path:
    """Where the SQuAD v1.1 dev file is expected.

    ``$CLUSTERFORMER_SQUAD_PATH`` if set, else ``../shared/data/squad-v1.1-dev.json.zip``
    relative to the source checkout.
    """
    env = os.environ.get(SQUAD_PATH_ENV)
    if env:
        return Path(env)
    checkout = Path(__file__).resolve().parents[3]
    return checkout.parent / "shared" / "data" / "squad-v1.1-dev.json.zip"


def read_squad(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read a SQuAD JSON file, plain or inside a ``.zip`` holding one ``.json``."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(
            f"SQuAD file not found: {path}; give the SQuAD v1.1 dev file (dev-v1.1.json, plain or zipped) with "
            f"--squad_path (squad_zip_path= in Python) or ${SQUAD_PATH_ENV}"
        )
    if zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as archive:
            names = [n for n in archive.namelist() if n.endswith(".json")]
            if len(names) != 1:
                raise ValueError(f"{path} should hold exactly one .json file, found {names}")
            return json.loads(archive.read(names[0]))
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _range(value: int | tuple[int, int], name: str) -> tuple[int, int]:
    lo, hi = (value, value) if isinstance(value, int) else value
    if not 0 < lo <= hi:
        raise ValueError(f"{name} must be positive with min <= max, got {value}")
    return lo, hi


def build_multipassage_dataset(
    squad_zip_path: str | os.PathLike[str],
    num_examples: int,
    passages: int | tuple[int, int] | None = None,
    seed: int = 0,
    context_tokens: int | tuple[int, int] = (2000, 10000),
    count_tokens: Callable[[str], int] | None = None,
    passage_token: str = PASSAGE_TOKEN,
) -> list[dict[str, Any]]:
    """Build SQuAD-format records whose contexts join a gold paragraph with distractors.

    Args:
        squad_zip_path: SQuAD v1.1 JSON or zip (see :func:`default_squad_path`).
        num_examples: number of records; questions are drawn without replacement.
        passages: passages per context, gold included (an int or an inclusive range). When
            ``None``, distractors are added until the context reaches a length drawn from
            ``context_tokens``.
        seed: the records depend only on the file, the arguments and this seed.
        context_tokens: target context length (int or inclusive range) when ``passages`` is
            ``None``.
        count_tokens: measures a paragraph; defaults to :func:`approx_token_count` (words
            and punctuation, about 0.8 of RoBERTa BPE tokens). Pass e.g.
            ``lambda t: len(tokenizer.tokenize(t))`` for exact lengths.
        passage_token: marker put before every passage.
    """
    squad = read_squad(squad_zip_path)
    count_tokens = count_tokens or approx_token_count
    paragraphs, article_of, questions = _index_squad(squad)
    if not 0 <= num_examples <= len(questions):
        raise ValueError(f"num_examples must be in [0, {len(questions)}], got {num_examples}")
    passage_range = None if passages is None else _range(passages, "passages")
    token_range = _range(context_tokens, "context_tokens")
    article_of_arr = np.array(article_of)

    @functools.cache
    def length(p: int) -> int:
        return count_tokens(paragraphs[p]) + 1  # + passage token

    prefix = passage_token + " "
    order = np.random.default_rng([seed, 0]).permutation(len(questions))[:num_examples]
    records = []
    for i, q in enumerate(order):
        rng = np.random.default_rng([seed, 1, i])
        gold, qa = questions[q]
        others = np.flatnonzero(article_of_arr != article_of[gold])
        others = others[rng.permutation(len(others))]
        if passage_range is not None:
            chosen = _fixed_distractors(rng, others, passage_range)
        else:
            chosen = _distractors_up_to(rng, others, token_range, gold, length)
        position = int(rng.integers(len(chosen) + 1))
        chosen.insert(position, gold)
        context, answers = _join_passages(paragraphs, chosen, position, qa, prefix)
        records.append({"id": qa["id"], "title": squad["data"][article_of[gold]]["title"], "question": qa["question"],
                        "context": context, "answers": answers})
    return records


def _index_squad(squad: dict[str, Any]) -> tuple[list[str], list[int], list[tuple[int, dict[str, Any]]]]:
    """SQuAD's paragraphs, each paragraph's article index, and every question as (paragraph index, qa)."""
    paragraphs: list[str] = []
    article_of: list[int] = []
    questions: list[tuple[int, dict[str, Any]]] = []
    for a, article in enumerate(squad["data"]):
        for paragraph in article["paragraphs"]:
            p = len(paragraphs)
            paragraphs.append(paragraph["context"])
            article_of.append(a)
            questions += [(p, qa) for qa in paragraph["qas"]]
    return paragraphs, article_of, questions


def _fixed_distractors(rng: np.random.Generator, others: np.ndarray, passage_range: tuple[int, int]) -> list[int]:
    """The first ``count - 1`` of the shuffled candidate paragraphs ``others``, ``count`` drawn from
    ``passage_range`` (gold included)."""
    count = int(rng.integers(passage_range[0], passage_range[1] + 1))
    if count - 1 > len(others):
        raise ValueError(f"only {len(others)} distractor paragraphs available, asked {count - 1}")
    return [int(p) for p in others[: count - 1]]


def _distractors_up_to(
    rng: np.random.Generator,
    others: np.ndarray,
    token_range: tuple[int, int],
    gold: int,
    length: Callable[[int], int],
) -> list[int]:
    """Shuffled candidate paragraphs ``others``, taken in order until the context (gold included) reaches a length
    drawn from ``token_range``; ``length`` measures a paragraph with its passage token."""
    target = int(rng.integers(token_range[0], token_range[1] + 1))
    total, chosen = length(gold), []
    for p in others:
        if total >= target:
            break
        chosen.append(int(p))
        total += length(int(p))
    return chosen


def _join_passages(
    paragraphs: list[str], chosen: list[int], position: int, qa: dict[str, Any], prefix: str
) -> tuple[str, dict[str, list]]:
    """The context joining the ``chosen`` paragraphs, each after ``prefix``, and the answers of ``qa`` (whose
    paragraph is ``chosen[position]``) with their offsets moved to it."""
    offset = sum(len(prefix) + len(paragraphs[p]) + 1 for p in chosen[:position]) + len(prefix)
    context = " ".join(prefix + paragraphs[p] for p in chosen)
    answers = {
        "text": [a["text"] for a in qa["answers"]],
        "answer_start": [offset + a["answer_start"] for a in qa["answers"]],
    }
    return context, answers


def load_multipassage_dataset(
    squad_zip_path: str | os.PathLike[str] | None = None,
    num_examples: int = 1000,
    **kwargs: Any,
) -> datasets.Dataset:
    """:func:`build_multipassage_dataset` as a ``datasets.Dataset``."""
    import datasets

    path = default_squad_path() if squad_zip_path is None else squad_zip_path
    records = build_multipassage_dataset(path, num_examples, **kwargs)
    return datasets.Dataset.from_list(records, features=squad_features())
