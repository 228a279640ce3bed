"""QA preprocessing (answer spans to token labels) and postprocessing (logits to text)."""

from __future__ import annotations

import logging
import re

import datasets
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from clusterformer_research.longrange import build_longrange_tokenizer, generate_longrange_dataset
from hf_clusterformer.data import build_multipassage_dataset, build_tokenizer, default_squad_path, read_squad
from hf_clusterformer.features import (
    postprocess_predictions,
    prepare_train_features,
    prepare_validation_features,
)
from hf_clusterformer.metrics import compute_squad


def _batch(records: list[dict]) -> dict[str, list]:
    return {key: [r[key] for r in records] for key in records[0]}


def _oracle_logits(train_features: dict, length: int) -> tuple[np.ndarray, np.ndarray]:
    """Logits that put all mass on the labelled start and end tokens."""
    n = len(train_features["start_positions"])
    start, end = np.zeros((n, length)), np.zeros((n, length))
    start[np.arange(n), train_features["start_positions"]] = 10.0
    end[np.arange(n), train_features["end_positions"]] = 10.0
    return start, end


@pytest.fixture(scope="module")
def tokenizer():
    return build_longrange_tokenizer()


@pytest.fixture(scope="module")
def records():
    return generate_longrange_dataset(12, seed=4, context_tokens=(600, 2000)) + (
        generate_longrange_dataset(12, seed=4, context_tokens=(600, 2000), kind="local")
    )


@pytest.fixture(scope="module")
def squad_setup():
    path = default_squad_path()
    if not path.exists():
        pytest.skip(f"SQuAD v1.1 dev file not available at {path}")
    paragraphs = [p["context"] for a in read_squad(path)["data"] for p in a["paragraphs"]]
    tok = build_tokenizer(paragraphs, vocab_size=4000)
    recs = build_multipassage_dataset(path, 40, seed=7, context_tokens=(2000, 5000))
    return tok, recs


def test_train_labels_cover_exactly_the_answer(tokenizer, records):
    features = prepare_train_features(_batch(records), tokenizer, max_length=4096)
    assert not any(features["answer_truncated"])
    for r, ids, s, e in zip(
        records, features["input_ids"], features["start_positions"], features["end_positions"]
    ):
        assert len(ids) > 600  # the whole context is one feature
        assert 0 < s <= e
        assert tokenizer.decode(ids[s : e + 1]).strip() == r["answers"]["text"][0]


def test_multipassage_labels_and_round_trip(squad_setup):
    tok, recs = squad_setup
    batch = _batch(recs)
    train = prepare_train_features(batch, tok, max_length=8192)
    assert not any(train["answer_truncated"])
    assert all(len(ids) > 2000 for ids in train["input_ids"])
    val = prepare_validation_features(batch, tok, max_length=8192)
    assert val["example_id"] == batch["id"]
    spans = []
    for offsets, s, e, r in zip(
        val["offset_mapping"], train["start_positions"], train["end_positions"], recs
    ):
        (a, _), (_, b) = offsets[s], offsets[e]
        spans.append(r["context"][a:b])
        # the labelled tokens cover the answer; a token may carry extra punctuation
        assert r["answers"]["text"][0] in spans[-1]
        assert len(spans[-1]) <= len(r["answers"]["text"][0]) + 2
    exact = sum(span == r["answers"]["text"][0] for span, r in zip(spans, recs))
    assert exact >= 0.9 * len(recs)
    start, end = _oracle_logits(train, max(len(x) for x in train["input_ids"]))
    # some SQuAD answers are longer than the default 30 tokens
    predictions = postprocess_predictions(recs, val, start, end, max_answer_length=100)
    assert predictions == {r["id"]: span for r, span in zip(recs, spans)}
    gold = {r["id"]: r["answers"]["text"] for r in recs}
    assert compute_squad(predictions, gold) == {"exact_match": 100.0, "f1": 100.0}


def test_truncated_answers_are_counted_flagged_and_dropped(tokenizer, records, caplog):
    max_length = 400
    dataset = datasets.Dataset.from_list(records)
    # independent count: the answer's last token lies beyond the context tokens that fit
    expected = []
    for r in records:
        question_tokens = len(tokenizer(r["question"])["input_ids"]) - 2
        fits = max_length - question_tokens - 4  # <s> Q </s></s> C </s>
        enc = tokenizer(r["context"], add_special_tokens=False, return_offsets_mapping=True)
        end_char = r["answers"]["answer_start"][0] + len(r["answers"]["text"][0])
        last = max(i for i, (a, _) in enumerate(enc["offset_mapping"]) if a < end_char)
        expected.append(last >= fits)
    assert 0 < sum(expected) < len(records)

    stats: dict[str, int] = {}
    with caplog.at_level(logging.WARNING, logger="hf_clusterformer.features"):
        flagged = dataset.map(
            prepare_train_features,
            batched=True,
            fn_kwargs={"tokenizer": tokenizer, "max_length": max_length, "stats": stats},
            remove_columns=dataset.column_names,
        )
    assert flagged["answer_truncated"] == expected
    assert stats == {"examples": len(records), "truncated": sum(expected), "dropped": 0,
                     "unanswerable": 0}
    assert f"{sum(expected)} of {len(records)} examples lost their answer" in caplog.text
    assert all(len(ids) <= max_length for ids in flagged["input_ids"])
    for t, s, e in zip(expected, flagged["start_positions"], flagged["end_positions"]):
        assert (s == e == 0) == t

    dropped = dataset.map(
        prepare_train_features,
        batched=True,
        fn_kwargs={"tokenizer": tokenizer, "max_length": max_length, "drop_truncated": True},
        remove_columns=dataset.column_names,
    )
    assert dropped.num_rows == len(records) - sum(expected)
    assert all(s > 0 for s in dropped["start_positions"])


def test_padding_to_max_length(tokenizer, records):
    features = prepare_train_features(_batch(records[:3]), tokenizer, 3000, pad_to_max_length=True)
    assert {len(ids) for ids in features["input_ids"]} == {3000}
    assert features["input_ids"][0][-1] == tokenizer.pad_token_id


def test_bad_inputs_raise_clear_errors(tokenizer, records):
    batch = _batch(records[:3])
    with pytest.raises(ValueError, match=r"\['answers'\]"):
        prepare_train_features({k: batch[k] for k in ("question", "context")}, tokenizer, 512)
    with pytest.raises(ValueError, match=r"\['context', 'id'\]"):
        prepare_validation_features({"question": batch["question"]}, tokenizer, 512)
    shifted = [
        {"text": a["text"], "answer_start": [a["answer_start"][0] + d]}
        for a, d in zip(batch["answers"], (1, 0, -2))
    ]
    with pytest.raises(ValueError, match="2 of 3 examples have an answer text not found"):
        prepare_train_features(dict(batch, answers=shifted), tokenizer, 512)
    with pytest.raises(ValueError, match="batched"):
        prepare_train_features(records[0], tokenizer, 512)
    with pytest.raises(ValueError, match="'text' and 'answer_start'"):
        prepare_train_features(dict(batch, answers=["Paris"] * 3), tokenizer, 512)


def test_unanswerable_examples_point_at_cls(tokenizer, records):
    batch = _batch(records[:2])
    batch["answers"] = [{"text": [], "answer_start": []}, batch["answers"][1]]
    stats: dict[str, int] = {}
    features = prepare_train_features(batch, tokenizer, 4096, stats=stats)
    assert (features["start_positions"][0], features["end_positions"][0]) == (0, 0)
    assert features["start_positions"][1] > 0
    assert stats["unanswerable"] == 1 and stats["truncated"] == 0


def test_validation_offsets_only_for_context_tokens(tokenizer, records):
    features = prepare_validation_features(_batch(records[:2]), tokenizer, 4096)
    for r, ids, offsets in zip(records, features["input_ids"], features["offset_mapping"]):
        assert len(ids) == len(offsets)
        kept = [i for i, o in enumerate(offsets) if o is not None]
        # <s> Q </s></s> and the final </s> carry no offsets; the context tokens are contiguous
        assert kept == list(range(kept[0], len(ids) - 1))
        assert ids[kept[0] - 2 : kept[0]] == [tokenizer.sep_token_id] * 2
        a, b = offsets[kept[-1]]
        assert r["context"][a:b] == r["context"].rstrip()[-(b - a) :]


def test_postprocess_picks_best_valid_span(tokenizer, records):
    recs = records[:2]
    val = prepare_validation_features(_batch(recs), tokenizer, 4096)
    length = max(len(x) for x in val["input_ids"])
    start, end = np.zeros((2, length)), np.zeros((2, length))
    first = [next(i for i, o in enumerate(offs) if o is not None) for offs in val["offset_mapping"]]
    # Example 0: the largest logits sit on question tokens and <s>, which are not candidates.
    start[0, :first[0]] = end[0, :first[0]] = 100.0
    start[0, first[0] + 10], end[0, first[0] + 12] = 5.0, 5.0
    # Example 1: a better-scoring span that is too long loses to a valid one.
    s = first[1] + 20
    start[1, s], end[1, s + 40], end[1, s + 3] = 9.0, 9.0, 1.0
    details = postprocess_predictions(recs, val, start, end, max_answer_length=30,
                                      return_details=True)
    spans = [(first[0] + 10, first[0] + 12), (s, s + 3)]
    for r, f, (a, b) in zip(recs, val["offset_mapping"], spans):
        got = details[r["id"]]
        assert (got["start"], got["end"]) == (f[a][0], f[b][1])
        assert got["text"] == r["context"][f[a][0] : f[b][1]]
    # the score is the span's probability under a softmax over every valid context span (brute force here)
    for row, r in enumerate(recs):
        valid = [i for i, o in enumerate(val["offset_mapping"][row]) if o is not None]
        total = sum(np.exp(start[row, i] + end[row, j]) for i in valid for j in valid if 0 <= j - i < 30)
        assert details[r["id"]]["score"] == pytest.approx(np.exp(10.0) / total, rel=1e-4)  # fp32 logits
    longer = postprocess_predictions(recs, val, start, end, max_answer_length=41)
    offsets = val["offset_mapping"][1]
    assert longer[recs[1]["id"]] == recs[1]["context"][offsets[s][0] : offsets[s + 40][1]]


def test_postprocess_gives_the_empty_answer_where_the_answerability_head_says_none(tokenizer, records):
    """Row: evaluating SQuAD 2.0 data never predicted the empty answer, even with the answerability head."""
    recs = records[:2]
    val = prepare_validation_features(_batch(recs), tokenizer, 4096)
    length = max(len(x) for x in val["input_ids"])
    start, end = np.zeros((2, length)), np.zeros((2, length))
    answerable = np.array([[6.0, -6.0], [-6.0, 6.0]])  # [no answer, answer]: none in example 0, one in example 1
    details = postprocess_predictions(recs, val, start, end, 30, return_details=True, answerable_logits=answerable)
    assert details[recs[0]["id"]]["text"] == "" and details[recs[0]["id"]]["score"] > 0.99
    assert details[recs[1]["id"]]["text"] != ""
    assert all(text for text in postprocess_predictions(recs, val, start, end, 30).values())  # no head: a span


def test_postprocess_accepts_datasets_and_several_features_per_example(tokenizer, records):
    recs = records[:3]
    train = prepare_train_features(_batch(recs), tokenizer, 4096)
    val = prepare_validation_features(_batch(recs), tokenizer, 4096)
    start, end = _oracle_logits(train, max(len(x) for x in val["input_ids"]))
    # a second, weaker feature for example 0 that points elsewhere
    extra = {k: v + [v[0]] for k, v in val.items()}
    weak_start, weak_end = np.zeros_like(start[:1]), np.zeros_like(end[:1])
    weak_start[0, train["start_positions"][0] + 1] = 3.0
    weak_end[0, train["end_positions"][0] + 1] = 3.0
    start2, end2 = np.vstack([start, weak_start]), np.vstack([end, weak_end])
    expected = {r["id"]: r["answers"]["text"][0] for r in recs}
    assert postprocess_predictions(recs, extra, start2, end2) == expected
    as_datasets = postprocess_predictions(
        datasets.Dataset.from_list(recs), datasets.Dataset.from_dict(extra), start2, end2
    )
    assert as_datasets == expected
    # an example without any feature gets an empty answer
    missing = postprocess_predictions(recs, {k: v[:2] for k, v in val.items()}, start[:2], end[:2])
    assert missing[recs[2]["id"]] == ""
    with pytest.raises(ValueError, match="logit rows"):
        postprocess_predictions(recs, val, start[:2], end[:2])


_CONTEXT = generate_longrange_dataset(1, seed=9, context_tokens=(700, 700))[0]["context"]
_WORDS = [m.span() for m in re.finditer(r"\w+", _CONTEXT)]


@settings(max_examples=60, deadline=None)
@given(first=st.integers(0, len(_WORDS) - 1), extra=st.integers(0, 8))
def test_word_aligned_spans_round_trip(tokenizer, first, extra):
    last = min(first + extra, len(_WORDS) - 1)
    start_char, end_char = _WORDS[first][0], _WORDS[last][1]
    record = {
        "id": "q",
        "question": "Where is it?",
        "context": _CONTEXT,
        "answers": {"text": [_CONTEXT[start_char:end_char]], "answer_start": [start_char]},
    }
    batch = _batch([record])
    train = prepare_train_features(batch, tokenizer, 2048)
    val = prepare_validation_features(batch, tokenizer, 2048)
    offsets = val["offset_mapping"][0]
    s, e = train["start_positions"][0], train["end_positions"][0]
    assert (offsets[s][0], offsets[e][1]) == (start_char, end_char)
    start, end = _oracle_logits(train, len(offsets))
    assert postprocess_predictions([record], val, start, end, max_answer_length=64) == {
        "q": record["answers"]["text"][0]
    }


def test_evaluation_answers_are_bounded_as_the_pipeline_bounds_them(tokenizer):
    """Row: the pipeline never starts or ends an answer with white space or a byte-order mark, but evaluation's
    postprocessing did (logits peaked on a line-end token gave "\\r\\n" as the answer)."""
    context = "\ufeffZorvan lives in Tarsk.\r\n\r\nMelka lives in Orn."
    record = {"id": "q", "question": "Where does Zorvan live?", "context": context,
              "answers": {"text": ["Tarsk"], "answer_start": [context.index("Tarsk")]}}
    val = prepare_validation_features(_batch([record]), tokenizer, 256)
    offsets = val["offset_mapping"][0]
    blank = [i for i, o in enumerate(offsets) if o is not None and not context[o[0]:o[1]].strip(" \r\n\ufeff")]
    assert blank  # the tokenizer gives the line ends (or the mark) tokens of their own
    start, end = np.zeros((1, len(offsets))), np.zeros((1, len(offsets)))
    start[0, blank] = end[0, blank] = 10.0  # all mass on the blank tokens
    detail = postprocess_predictions([record], val, start, end, return_details=True)["q"]
    assert detail["text"] == detail["text"].strip(" \r\n\ufeff") != ""
    assert detail["text"] == context[detail["start"]:detail["end"]]
