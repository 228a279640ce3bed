"""The library's data: SQuAD-format records, the locally trained tokenizer and the SQuAD multi-passage builder."""

from __future__ import annotations

import pytest

from hf_clusterformer.data import (
    MODEL_MAX_LENGTH,
    PASSAGE_TOKEN,
    SPECIAL_TOKENS,
    approx_token_count,
    build_multipassage_dataset,
    build_tokenizer,
    default_squad_path,
    load_multipassage_dataset,
    read_squad,
    squad_features,
)


@pytest.fixture(scope="module")
def squad_path():
    path = default_squad_path()
    if not path.exists():
        pytest.skip(f"SQuAD v1.1 dev file not available at {path}")
    return path


def test_tokenizer_round_trip_through_save_pretrained(tmp_path):
    from transformers import AutoTokenizer

    texts = ["the cat sat on the mat.", "a dog ran to the park."] * 50
    tok = build_tokenizer(texts, vocab_size=300, save_dir=tmp_path)
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    sample = ("Did the cat sit?", "<p> the cat sat. <p> a dog ran.")
    assert loaded(*sample)["input_ids"] == tok(*sample)["input_ids"]
    assert loaded.model_max_length == MODEL_MAX_LENGTH
    assert loaded.convert_tokens_to_ids(PASSAGE_TOKEN) == 5
    with pytest.raises(ValueError, match="vocab_size"):
        build_tokenizer(texts, vocab_size=100)


def test_multipassage_contexts_and_offsets(squad_path):
    squad = read_squad(squad_path)
    article_of = {
        p["context"]: article["title"] for article in squad["data"] for p in article["paragraphs"]
    }
    kwargs = {"seed": 1, "context_tokens": (2000, 4000)}
    records = build_multipassage_dataset(squad_path, 25, **kwargs)
    assert records == build_multipassage_dataset(squad_path, 25, **kwargs)
    assert len({r["id"] for r in records}) == 25
    gold_positions = set()
    for r in records:
        context = r["context"]
        assert context.startswith(PASSAGE_TOKEN + " ")
        passages = context[len(PASSAGE_TOKEN) + 1 :].split(f" {PASSAGE_TOKEN} ")
        assert all(p in article_of for p in passages)
        titles = [article_of[p] for p in passages]
        assert titles.count(r["title"]) == 1, "distractors come from other articles"
        gold_positions.add(titles.index(r["title"]))
        assert 2000 <= approx_token_count(context) - len(passages) <= 4000 + 400
        for text, start in zip(r["answers"]["text"], r["answers"]["answer_start"]):
            assert context[start : start + len(text)] == text
        gold_start = context.index(passages[titles.index(r["title"])])
        assert all(gold_start <= s for s in r["answers"]["answer_start"])
    assert len(gold_positions) > 5, "the gold passage is shuffled among the distractors"


def test_multipassage_passage_count_and_exact_token_budget(squad_path):
    records = build_multipassage_dataset(squad_path, 5, passages=7, seed=0)
    assert all(r["context"].count(PASSAGE_TOKEN) == 7 for r in records)
    tok = build_tokenizer([r["context"] for r in records], vocab_size=2000)
    records = build_multipassage_dataset(
        squad_path, 5, seed=2, context_tokens=3000, count_tokens=lambda t: len(tok.tokenize(t))
    )
    lengths = [len(tok.tokenize(r["context"])) for r in records]
    assert all(3000 <= n <= 3000 + 1000 for n in lengths)
    ds = load_multipassage_dataset(squad_path, 3, passages=(2, 4), seed=0)
    assert ds.num_rows == 3 and all(2 <= c.count(PASSAGE_TOKEN) <= 4 for c in ds["context"])
    with pytest.raises(ValueError, match="num_examples"):
        build_multipassage_dataset(squad_path, 10**6)


def test_tokenizer_special_token_ids():
    tokenizer = build_tokenizer(["Where does Anna live? Anna lives in Paris. <p> The road was quiet."] * 20,
                                vocab_size=300)
    assert [tokenizer.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS] == list(range(6))
    assert (tokenizer.cls_token_id, tokenizer.pad_token_id, tokenizer.sep_token_id) == (0, 1, 2)
    assert (tokenizer.unk_token_id, tokenizer.mask_token_id) == (3, 4)
    assert tokenizer.model_max_length == MODEL_MAX_LENGTH


def test_squad_features_and_the_approximate_token_count():
    import datasets

    record = {"id": "a", "title": "t", "question": "Where?", "context": "Anna lives in Paris.",
              "answers": {"text": ["Paris"], "answer_start": [14]}}
    row = datasets.Dataset.from_list([record], features=squad_features())[0]
    assert row == record
    assert approx_token_count("Anna lives in Paris, again...") == 7  # words and punctuation runs
