"""Extractive-QA preprocessing and postprocessing for whole-context models.

Unlike the usual doc-stride recipe, each example becomes exactly one feature: the question and
the whole context, truncated to ``max_length`` (``truncation="only_second"``); the model does
its own windowing. Answers become token start/end positions through offset mappings.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from .pipeline import MAX_ANSWER_TOKENS, can_bound_answer, rank_spans, trim_answer

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

__all__ = ["postprocess_predictions", "prepare_train_features", "prepare_validation_features"]

logger = logging.getLogger(__name__)


def _columns(examples: Mapping[str, Any], columns: Sequence[str]) -> list[list[Any]]:
    missing = [c for c in columns if c not in examples]
    if missing:
        raise ValueError(f"examples lack column(s) {missing}; found {sorted(examples.keys())}")
    values = [examples[c] for c in columns]
    if isinstance(values[0], str):
        raise ValueError("expected a batch (columns of lists); use datasets.map(..., batched=True)")
    return [list(v) for v in values]


def _encode(
    tokenizer: PreTrainedTokenizerBase,
    questions: list[str],
    contexts: list[str],
    max_length: int,
    pad_to_max_length: bool,
) -> Any:
    return tokenizer(
        [q.lstrip() for q in questions],
        contexts,
        truncation="only_second",
        max_length=max_length,
        return_offsets_mapping=True,
        padding="max_length" if pad_to_max_length else False,
    )


def _context_span(sequence_ids: Sequence[int | None]) -> tuple[int, int]:
    """First and last token index of the context (sequence 1); (-1, -2) if none is left."""
    indices = [i for i, s in enumerate(sequence_ids) if s == 1]
    return (indices[0], indices[-1]) if indices else (-1, -2)


def misplaced_answers(contexts: Sequence[str], answers: Sequence[Any], answer_column: str = "answers") -> list[int]:
    """Indices of the examples whose answer texts are not at their ``answer_start`` offsets.

    Raises:
        ValueError: an answer is not a dict with equally long ``text`` and ``answer_start`` lists.
    """
    mismatched: list[int] = []
    for i, (context, answer) in enumerate(zip(contexts, answers)):
        if not isinstance(answer, Mapping) or not {"text", "answer_start"} <= answer.keys():
            raise ValueError(
                f"{answer_column!r} of example {i} must be a dict with 'text' and 'answer_start', "
                f"got {answer!r}"
            )
        if not all(isinstance(answer[key], (list, tuple)) for key in ("text", "answer_start")):
            raise ValueError(f"{answer_column!r} of example {i} must hold lists, got {dict(answer)!r}; write "
                             "answers as {'text': ['answer'], 'answer_start': [offset]} (one entry per answer).")
        if len(answer["text"]) != len(answer["answer_start"]):
            raise ValueError(f"example {i}: 'text' and 'answer_start' differ in length")
        if any(
            context[s : s + len(t)] != t for t, s in zip(answer["text"], answer["answer_start"])
        ):
            mismatched.append(i)
    return mismatched


def _answer_label(encoded: Any, i: int, answer: Mapping[str, list]) -> tuple[int, int, bool]:
    """Token positions (start, end) of example i's first answer and whether truncation cut it off.

    An example without answers, or with an empty or whitespace-only answer, is labelled (0, 0) (``<s>``), as is
    one whose answer lies past the kept context (then flagged truncated). The start is the first context token
    ending after the answer's first character, the end the last one starting before its end.
    """
    if not answer["text"]:
        return 0, 0, False
    start_char = answer["answer_start"][0]
    end_char = start_char + len(answer["text"][0])
    first, last = _context_span(encoded.sequence_ids(i))
    offsets = np.asarray(encoded["offset_mapping"][i][first : last + 1]).reshape(-1, 2)
    if last < first or offsets[-1, 1] < end_char:
        return 0, 0, True
    start_token = first + int(np.searchsorted(offsets[:, 1], start_char, side="right"))
    end_token = first + int(np.searchsorted(offsets[:, 0], end_char, side="left")) - 1
    if end_token < start_token:  # empty or whitespace-only answer
        return 0, 0, False
    return start_token, end_token, False


def _report_truncation(
    n_truncated: int,
    n_examples: int,
    unanswerable: int,
    max_length: int,
    drop_truncated: bool,
    stats: dict[str, int] | None,
) -> None:
    """Log the examples whose answer truncation cut off, and add the batch's counts to ``stats``."""
    if n_truncated:
        logger.warning(
            "%d of %d examples lost their answer to truncation at max_length=%d (%s)",
            n_truncated, n_examples, max_length,
            "dropped" if drop_truncated else "labelled at position 0",
        )
    if stats is not None:
        for key, value in (
            ("examples", n_examples),
            ("truncated", n_truncated),
            ("dropped", n_truncated if drop_truncated else 0),
            ("unanswerable", unanswerable),
        ):
            stats[key] = stats.get(key, 0) + value


def prepare_train_features(
    examples: Mapping[str, Any],
    tokenizer: PreTrainedTokenizerBase,
    max_length: int,
    *,
    question_column: str = "question",
    context_column: str = "context",
    answer_column: str = "answers",
    pad_to_max_length: bool = False,
    drop_truncated: bool = False,
    stats: dict[str, int] | None = None,
) -> dict[str, list]:
    """Tokenize a batch of SQuAD-format examples into one training feature each.

    For ``datasets.Dataset.map(..., batched=True, remove_columns=...)``. Returns
    ``input_ids``, ``attention_mask``, ``start_positions``, ``end_positions`` and
    ``answer_truncated``. The first answer is the label. Examples whose answer was cut off by
    truncation, and examples without answers, are labelled at position 0 (``<s>``);
    truncated ones are flagged in ``answer_truncated`` and logged, or removed when
    ``drop_truncated`` is set. ``stats``, if given, accumulates the counts ``examples``,
    ``truncated``, ``dropped`` and ``unanswerable`` (not updated when ``map`` loads from its
    cache).

    Raises:
        ValueError: a column is missing, ``answers`` is malformed, or answer texts do not
            appear at their ``answer_start``.
    """
    questions, contexts, answers = _columns(
        examples, [question_column, context_column, answer_column]
    )
    mismatched = misplaced_answers(contexts, answers, answer_column)
    if mismatched:
        raise ValueError(
            f"{len(mismatched)} of {len(contexts)} examples have an answer text not found at its "
            f"answer_start (batch positions {mismatched[:10]})"
        )

    encoded = _encode(tokenizer, questions, contexts, max_length, pad_to_max_length)
    labels = [_answer_label(encoded, i, answer) for i, answer in enumerate(answers)]
    starts, ends, truncated = (list(column) for column in zip(*labels)) if labels else ([], [], [])
    unanswerable = sum(not answer["text"] for answer in answers)
    _report_truncation(sum(truncated), len(answers), unanswerable, max_length, drop_truncated, stats)

    features = {
        "input_ids": encoded["input_ids"],
        "attention_mask": encoded["attention_mask"],
        "start_positions": starts,
        "end_positions": ends,
        "answer_truncated": truncated,
    }
    if drop_truncated and any(truncated):
        keep = [i for i, t in enumerate(truncated) if not t]
        features = {k: [v[i] for i in keep] for k, v in features.items()}
    return features


def prepare_validation_features(
    examples: Mapping[str, Any],
    tokenizer: PreTrainedTokenizerBase,
    max_length: int,
    *,
    question_column: str = "question",
    context_column: str = "context",
    id_column: str = "id",
    pad_to_max_length: bool = False,
) -> dict[str, list]:
    """Tokenize a batch into one evaluation feature per example.

    Returns ``input_ids``, ``attention_mask``, ``offset_mapping`` (``None`` for tokens
    outside the context) and ``example_id``, as :func:`postprocess_predictions` expects.
    """
    questions, contexts, ids = _columns(examples, [question_column, context_column, id_column])
    encoded = _encode(tokenizer, questions, contexts, max_length, pad_to_max_length)
    offset_mapping = []
    for i, offsets in enumerate(encoded["offset_mapping"]):
        sequence_ids = encoded.sequence_ids(i)
        offset_mapping.append(
            [tuple(o) if s == 1 else None for o, s in zip(offsets, sequence_ids)]
        )
    return {
        "input_ids": encoded["input_ids"],
        "attention_mask": encoded["attention_mask"],
        "offset_mapping": offset_mapping,
        "example_id": [str(x) for x in ids],
    }


def _get_columns(data: Any, columns: Sequence[str]) -> list[list[Any]]:
    """Columns of a ``datasets.Dataset``, a mapping of lists or a list of dicts."""
    if isinstance(data, Sequence) and (not data or isinstance(data[0], Mapping)):
        return [[row[c] for row in data] for c in columns]
    names = data.column_names if hasattr(data, "column_names") else list(data)
    missing = [c for c in columns if c not in names]
    if missing:
        raise ValueError(f"missing column(s) {missing}; found {sorted(names)}")
    if hasattr(data, "select_columns"):  # datasets.Dataset: read whole columns at once
        data = data.select_columns(list(columns)).with_format(None)[:]
    return [list(data[c]) for c in columns]


def postprocess_predictions(
    examples: Any,
    features: Any,
    start_logits: Any,
    end_logits: Any,
    max_answer_length: int = MAX_ANSWER_TOKENS,
    *,
    id_column: str = "id",
    context_column: str = "context",
    return_details: bool = False,
    answerable_logits: Any = None,
) -> dict[str, Any]:
    """Turn start/end logits into answer texts, keyed by example id.

    ``features`` carry ``example_id`` and ``offset_mapping`` as made by `prepare_validation_features`;
    ``start_logits``/``end_logits`` hold one row per feature as numpy arrays or CPU tensors (padding beyond a
    feature's length is ignored). Spans lie inside the context, are bounded and ranked as the pipeline's
    (`hf_clusterformer.pipeline.rank_spans`: a softmax over every span of at most ``max_answer_length`` tokens); the
    most probable span over all features of an example wins. Examples without context tokens get ``""``. With
    ``return_details`` the values are dicts ``{"text", "start", "end", "score"}`` (character offsets into the context).
    ``answerable_logits`` (one ``[no answer, answer]`` row per feature, the answerability head's) let the empty answer
    win, as the pipeline's ``handle_impossible_answer`` does (SQuAD 2.0).
    """
    if len(start_logits) != len(end_logits):
        raise ValueError(f"{len(start_logits)} start logit rows but {len(end_logits)} end logit rows")
    ids, contexts = _get_columns(examples, [id_column, context_column])
    feature_ids, offset_mappings = _get_columns(features, ["example_id", "offset_mapping"])
    if len(feature_ids) != len(start_logits):
        raise ValueError(f"{len(feature_ids)} features but {len(start_logits)} logit rows")
    context_of = dict(zip(map(str, ids), contexts))
    best: dict[str, dict[str, Any]] = {}
    answerable = [None] * len(start_logits) if answerable_logits is None else answerable_logits
    for feature_id, offsets, starts, ends, has_answer in zip(map(str, feature_ids), offset_mappings, start_logits,
                                                             end_logits, answerable):
        if feature_id not in context_of:
            raise ValueError(f"feature refers to unknown example id {feature_id!r}")
        n = min(len(offsets), len(starts), len(ends))
        context = context_of[feature_id]
        candidate = torch.tensor([o is not None and can_bound_answer(context[o[0]:o[1]]) for o in offsets[:n]],
                                 dtype=torch.bool)  # as the pipeline: no answer starts or ends with white space
        if not candidate.any():
            continue
        # the pipeline's span search: a softmax over every context span of at most max_answer_length tokens
        ((score, start, end),) = rank_spans(
            torch.as_tensor(np.asarray(starts[:n], dtype=np.float32)),
            torch.as_tensor(np.asarray(ends[:n], dtype=np.float32)), candidate, max_answer_len=max_answer_length,
            handle_impossible_answer=has_answer is not None,
            answerable_logits=None if has_answer is None else torch.as_tensor(np.asarray(has_answer, np.float64)))
        current = best.get(feature_id)
        if current is None or score > current["score"]:
            a, b = (0, 0) if start < 0 else trim_answer(context, int(offsets[start][0]), int(offsets[end][1]))
            best[feature_id] = {"text": context[a:b], "start": a, "end": b, "score": score}
    results = {}
    for example_id in map(str, ids):
        detail = best.get(example_id, {"text": "", "start": 0, "end": 0, "score": float("-inf")})
        results[example_id] = detail if return_details else detail["text"]
    return results


@contextlib.contextmanager
def question_fits(examples: Any, tokenizer: Any, max_seq_length: int) -> Iterator[None]:
    """Tokenizing ``examples`` at ``max_seq_length``: the tokenizer's refusal to cut a question (the context is what
    is cut) said in one line naming the flag and the longest question."""
    try:
        yield
    except Exception as error:
        if "Truncation error" not in str(error):
            raise
        longest = max(len(ids) for ids in tokenizer(list(examples["question"]))["input_ids"])
        raise ValueError(f"--max_seq_length {max_seq_length} leaves no room for a context after the questions (the "
                         f"longest is {longest} tokens with its special tokens); raise --max_seq_length.") from None


#: Columns each split needs: answers label the training data and score the validation data, ids key the predictions.
REQUIRED_COLUMNS = {
    "train": ("question", "context", "answers"),
    "validation": ("id", "question", "context", "answers"),
}


def check_columns(splits: dict[str, Any]) -> None:
    """Raise `ValueError` naming the SQuAD-format columns a split lacks."""
    for name, split in splits.items():
        missing = [column for column in REQUIRED_COLUMNS.get(name, ()) if column not in split.column_names]
        if missing:
            raise ValueError(
                f"the {name} data ({len(split)} rows) lack column(s) {missing}; found {split.column_names}. "
                "SQuAD-format records need id, question, context and answers {text: [...], answer_start: [...]}."
            )


def _check_answer_offsets(splits: dict[str, Any], sources: dict[str, str | None]) -> None:
    """Raise `ValueError` with dataset-wide counts and row numbers when answer texts are not at their offsets, or
    naming the file (``sources``) whose answers are malformed."""
    for name, split in splits.items():
        if "answers" not in split.column_names:
            continue
        try:
            bad = misplaced_answers(split["context"], split["answers"])
        except ValueError as error:
            source = sources.get(name)
            raise ValueError(f"the {name} data{f' ({source})' if source else ''}: {error}") from None
        if bad:
            raise ValueError(
                f"{len(bad)} of {len(split)} {name} examples have an answer text not found at its answer_start "
                f"(rows {bad[:10]}{' ...' if len(bad) > 10 else ''}); answer_start is the character offset of the "
                "text in the context: fix those offsets or remove those rows."
            )


def _check_texts(splits: dict[str, Any], sources: dict[str, str | None]) -> None:
    """Raise `ValueError` naming the first record whose question or context is empty (or only whitespace): it would
    train on nothing, and the predict path refuses such a pair."""
    for name, split in splits.items():
        for column in ("question", "context"):
            if column not in split.column_names:
                continue
            for row, text in enumerate(split[column]):
                if isinstance(text, str) and text.strip():
                    continue
                record = f"{'training' if name == 'train' else name} record {row}"
                if "id" in split.column_names:
                    record += f" (id {split[row]['id']!r})"
                if sources.get(name):
                    record += f" of {sources[name]}"
                raise ValueError(f"{record} has an empty {column}; give it its {column} or remove that record.")


def check_records(splits: dict[str, Any], sources: dict[str, str | None]) -> None:
    """`ValueError` (one line, naming the record and its file of ``sources``) for a record with an empty question or
    context, a validation id given twice (predictions are matched by id), or answers not at their offsets."""
    _check_texts(splits, sources)
    if "validation" in splits and "id" in splits["validation"].column_names:
        ids = [str(i) for i in splits["validation"]["id"]]
        if len(set(ids)) < len(ids):
            twice = next(i for i in ids if ids.count(i) > 1)
            source = f" of {sources['validation']}" if sources.get("validation") else ""
            raise ValueError(f"validation id {twice!r} is given to {ids.count(twice)} records{source}; give each its "
                             "own id.")
    _check_answer_offsets(splits, sources)
