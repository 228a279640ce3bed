"""The research package's generated long-range QA data (`clusterformer_research.longrange`): the records, their
layout, the tokenizer whose names are single tokens, and the SQuAD-format files the library's training reads."""

from __future__ import annotations

import itertools
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from clusterformer_research.longrange import (
    PERSON_NAMES,
    PLACE_NAMES,
    build_longrange_tokenizer,
    generate_longrange_dataset,
    load_longrange_dataset,
    main,
    squad_json,
    write_squad_file,
)
from hf_clusterformer.data import MODEL_MAX_LENGTH, PASSAGE_TOKEN, SPECIAL_TOKENS, approx_token_count

WINDOW = 256  # sliding-window size of the model, question included
SMALL = (400, 1200)  # context lengths that keep the tests fast
QUESTION = re.compile(r"Where does (\w+) live\?")


@pytest.fixture(scope="module")
def tokenizer():
    return build_longrange_tokenizer()


def _sentence_token_span(offsets: np.ndarray, context: str, char_start: int) -> tuple[int, int]:
    """First and last context-token index of the sentence starting at ``char_start``."""
    char_end = context.index(".", char_start) + 1
    first = int(np.searchsorted(offsets[:, 1], char_start, side="right"))
    last = int(np.searchsorted(offsets[:, 0], char_end, side="left")) - 1
    return first, last


def _chains(context: str) -> list[tuple[str, str, str]]:
    links = dict((y, x) for x, y in re.findall(r"(\w+) lives with (\w+)\.", context))
    places = dict(re.findall(r"(\w+) lives in (\w+)\.", context))
    assert links.keys() == places.keys(), "every bridge name has exactly one place fact"
    return [(links[y], y, places[y]) for y in links]


@pytest.mark.parametrize("kind", ["longrange", "local"])
def test_records_are_squad_format_with_exact_offsets(kind):
    records = generate_longrange_dataset(60, seed=3, context_tokens=SMALL, kind=kind)
    assert len({r["id"] for r in records}) == 60
    for r in records:
        assert set(r) == {"id", "title", "question", "context", "answers"}
        (text,), (start,) = r["answers"]["text"], r["answers"]["answer_start"]
        assert r["context"][start : start + len(text)] == text
        assert text in PLACE_NAMES and r["context"].count(text) == 1
        assert SMALL[0] <= approx_token_count(r["context"]) <= SMALL[1] + 12


def test_generation_is_deterministic_and_prefix_stable():
    a = generate_longrange_dataset(8, seed=11, context_tokens=SMALL)
    assert a == generate_longrange_dataset(8, seed=11, context_tokens=SMALL)
    assert a[:3] == generate_longrange_dataset(3, seed=11, context_tokens=SMALL)
    b = generate_longrange_dataset(8, seed=12, context_tokens=SMALL)
    assert not {r["context"] for r in a} & {r["context"] for r in b}
    val = generate_longrange_dataset(8, seed=11, context_tokens=SMALL, split="validation")
    assert not {r["context"] for r in a} & {r["context"] for r in val}


def test_longrange_answer_needs_two_facts_more_than_a_window_apart(tokenizer):
    records = generate_longrange_dataset(40, seed=5, context_tokens=(500, 3000))
    for r in records:
        context = r["context"]
        x = QUESTION.fullmatch(r["question"]).group(1)
        # The asked name occurs once, in its link fact; it has no place fact of its own.
        assert context.count(x) == 1 and f"{x} lives in" not in context
        link = re.search(rf"\b{x} lives with (\w+)\.", context)
        y = link.group(1)
        place = re.search(rf"\b{y} lives in (\w+)\.", context)
        assert context.count(y) == 2
        assert place.group(1) == r["answers"]["text"][0]
        assert place.start(1) == r["answers"]["answer_start"][0]

        enc = tokenizer(r["question"], context, return_offsets_mapping=True)
        ids = enc.sequence_ids()
        offsets = np.array([o for o, s in zip(enc["offset_mapping"], ids) if s == 1])
        a0, a1 = _sentence_token_span(offsets, context, link.start())
        b0, b1 = _sentence_token_span(offsets, context, place.start())
        first = ids.index(1)
        decoded = tokenizer.decode(enc["input_ids"][first + b0 : first + b1 + 1])
        assert decoded.strip() == place.group(0)
        between = b0 - a1 - 1 if b0 > a1 else a0 - b1 - 1
        # No window of WINDOW tokens (even without the question) holds both sentences.
        assert between >= WINDOW, (r["id"], between)


def _token_counts_between(context: str, starts: list[int]):
    """``count(a, b) == approx_token_count(context[a:b])`` for any two of ``starts``, from the counts of the stretches
    between neighbouring starts: each start follows whitespace, so no token spans one and the counts add up (one pass
    over the context instead of one per pair)."""
    points = sorted(set(starts))
    assert all(p == 0 or context[p - 1].isspace() for p in points)
    before = dict(zip(points, itertools.accumulate(
        [0, *(approx_token_count(context[a:b]) for a, b in zip(points, points[1:]))])))
    return lambda a, b: before[b] - before[a]


def test_no_window_holds_a_link_fact_and_any_place_fact():
    """Every link fact is far from every place fact (not only from its own): a window that sees a
    place fact cannot rule it out because the asked name's link fact is nearby."""
    for r in generate_longrange_dataset(20, seed=8, context_tokens=(1500, 3000)):
        context = r["context"]
        chains = _chains(context)
        assert len(chains) >= 10
        links = [context.index(f"{x} lives with {y}.") for x, y, _ in chains]
        places = [context.index(f"{y} lives in {z}.") for _, y, z in chains]
        assert max(links) < min(places) or max(places) < min(links)
        count = _token_counts_between(context, links + places)
        for a in links:
            for b in places:
                lo, hi = sorted((a, b))
                assert count(lo, hi) - 5 >= 300  # tokens strictly between: approx_token_count(context[lo:hi]) - 5


def test_local_answer_is_inside_one_sentence():
    for r in generate_longrange_dataset(30, seed=2, context_tokens=SMALL, kind="local"):
        y = QUESTION.fullmatch(r["question"]).group(1)
        fact = re.search(rf"\b{y} lives in (\w+)\.", r["context"])
        assert fact.start(1) == r["answers"]["answer_start"][0]
        assert fact.group(1) == r["answers"]["text"][0]


def test_contexts_reach_thousands_of_tokens(tokenizer):
    records = generate_longrange_dataset(10, seed=0, context_tokens=(2000, 8000))
    lengths = [len(ids) for ids in tokenizer([r["context"] for r in records])["input_ids"]]
    approx = [approx_token_count(r["context"]) + 2 for r in records]  # + <s> </s>
    assert all(2000 <= n <= 8100 for n in lengths)
    # names and template words are single tokens, so the estimate is nearly exact
    assert all(0 <= n - m <= 3 for n, m in zip(lengths, approx))


def test_bad_arguments_are_rejected():
    with pytest.raises(ValueError, match="kind"):
        generate_longrange_dataset(1, kind="global")
    with pytest.raises(ValueError, match="too short"):
        generate_longrange_dataset(1, context_tokens=(100, 200))
    with pytest.raises(ValueError, match="context_tokens"):
        generate_longrange_dataset(1, context_tokens=(900, 800))
    assert len(generate_longrange_dataset(2, context_tokens=(60, 80), min_gap_tokens=0)) == 2


def test_load_longrange_dataset_splits():
    dd = load_longrange_dataset("local", train_size=6, validation_size=4, context_tokens=SMALL)
    assert set(dd) == {"train", "validation"}
    assert (dd["train"].num_rows, dd["validation"].num_rows) == (6, 4)
    assert dd["train"].column_names == ["id", "title", "question", "context", "answers"]
    assert not set(dd["train"]["context"]) & set(dd["validation"]["context"])
    row = dd["validation"][0]
    start, text = row["answers"]["answer_start"][0], row["answers"]["text"][0]
    assert row["context"][start : start + len(text)] == text


def test_tokenizer_special_tokens_and_single_token_names(tokenizer):
    assert [tokenizer.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS] == list(range(6))
    assert (tokenizer.cls_token_id, tokenizer.pad_token_id, tokenizer.sep_token_id) == (0, 1, 2)
    assert (tokenizer.unk_token_id, tokenizer.mask_token_id) == (3, 4)
    assert tokenizer.model_max_length == MODEL_MAX_LENGTH
    assert 1000 <= len(tokenizer) <= 4000
    for name in PERSON_NAMES + PLACE_NAMES:
        assert len(tokenizer.tokenize(" " + name)) == 1, name


def test_tokenizer_pair_encoding_offsets(tokenizer):
    person, place = PERSON_NAMES[7], PLACE_NAMES[3]
    question = f"Where does {person} live?"
    context = f"The road was quiet. {person} lives in {place}. <p> Many farmers sang."
    enc = tokenizer(question, context, return_offsets_mapping=True)
    ids, seq = enc["input_ids"], enc.sequence_ids()
    sep = tokenizer.sep_token_id
    q_len = len(tokenizer(question)["input_ids"]) - 2
    assert ids[0] == tokenizer.cls_token_id and ids[-1] == sep
    assert ids[q_len + 1 : q_len + 3] == [sep, sep]  # <s> Q </s></s> C </s>
    pieces = [
        (question if s == 0 else context)[a:b]
        for (a, b), s in zip(enc["offset_mapping"], seq)
        if s is not None
    ]
    assert "".join(pieces[:q_len]).replace(" ", "") == question.replace(" ", "")
    expected = ["The", "road", "was", "quiet", ".", person, "lives", "in", place, "."]
    assert pieces[q_len:][:10] == expected
    assert pieces.count(PASSAGE_TOKEN) == 1 and ids.count(5) == 1  # one token, space absorbed
    assert tokenizer.decode(ids, skip_special_tokens=True).startswith(question)


def test_mention_questions_point_at_the_name_in_its_place_fact():
    for record in generate_longrange_dataset(20, 3, (200, 400), "mention", min_gap_tokens=60):
        name = record["answers"]["text"][0]
        start = record["answers"]["answer_start"][0]
        assert record["question"] == f"Who is {name} with a home?"
        assert record["context"][start:].startswith(f"{name} lives in ")


def test_balanced_twin_placement_favours_no_fact_slot():
    """Every fact slot is in the pair 2 / num_facts of the time; the two mentions stay min_gap apart."""
    import re

    import numpy as np

    from clusterformer_research.longrange import WORD_PERSON_NAMES, WORD_PLACE_NAMES

    records = generate_longrange_dataset(2000, 0, (150, 180), "twin", min_gap_tokens=100, num_facts=20,
                                         names="words", placement="balanced", target="later")
    in_pair = []
    for record in records:
        facts = re.findall(r"(\w+) lives in (\w+)\.", record["context"])
        assert len(facts) == 20 and all(p in WORD_PERSON_NAMES and c in WORD_PLACE_NAMES for p, c in facts)
        answer = record["answers"]["text"][0]
        in_pair.append([c == answer for _, c in facts])
        first, later = record["answers"]["answer_start"]
        assert later < first  # the later mention is the training target
        assert approx_token_count(record["context"][later:first]) >= 100
        assert record["context"][later:].startswith(answer) and record["context"][first:].startswith(answer)
    rate = np.array(in_pair, dtype=float).mean(axis=0)
    assert abs(rate.mean() - 0.1) < 1e-9 and rate.max() < 0.13  # 2 / 20 each, up to sampling noise


def test_word_names_are_one_token_each():
    from clusterformer_research.longrange import WORD_PERSON_NAMES, WORD_PLACE_NAMES

    assert len(set(WORD_PERSON_NAMES)) == len(WORD_PERSON_NAMES) >= 40
    assert len(set(WORD_PLACE_NAMES)) == len(WORD_PLACE_NAMES) >= 40
    assert not set(WORD_PERSON_NAMES) & set(WORD_PLACE_NAMES)
    vocab_file = Path.home() / ".cache" / "hf_clusterformer" / "all-MiniLM-L6-v2" / "vocab.txt"
    if vocab_file.is_file():  # the pretrained vocabulary, when cached: every name is one WordPiece token
        vocab = set(vocab_file.read_text().split())
        assert [n for n in WORD_PERSON_NAMES + WORD_PLACE_NAMES if n.lower() not in vocab] == []


def test_twin_options_are_checked():
    with pytest.raises(ValueError, match="placement"):
        generate_longrange_dataset(1, 0, (150, 180), "twin", min_gap_tokens=10, placement="middle")
    with pytest.raises(ValueError, match="names"):
        generate_longrange_dataset(1, 0, (150, 180), "twin", min_gap_tokens=10, names="greek")


@pytest.mark.parametrize("placement", ["gap", "balanced"])
def test_twin_target_later_lists_the_later_mention_first(placement):
    options = dict(min_gap_tokens=100, num_facts=20, names="words", placement=placement)
    first = generate_longrange_dataset(20, 0, (150, 180), "twin", target="first", **options)
    later = generate_longrange_dataset(20, 0, (150, 180), "twin", target="later", **options)
    for a, b in zip(first, later):
        assert a["context"] == b["context"] and a["answers"]["answer_start"][::-1] == b["answers"]["answer_start"]
        assert b["answers"]["answer_start"][0] > b["answers"]["answer_start"][1]


def test_twin_places_come_from_the_first_num_places_names_of_the_pool():
    from clusterformer_research.longrange import WORD_PLACE_NAMES

    records = generate_longrange_dataset(60, 0, (40, 50), "twin", min_gap_tokens=0, num_facts=5, names="words",
                                         placement="balanced", target="later", num_places=6)
    named = {word.rstrip(".") for r in records for word in r["context"].split()
             if word.rstrip(".") in WORD_PLACE_NAMES}
    assert named <= set(WORD_PLACE_NAMES[:6]) and len(named) == 6
    with pytest.raises(ValueError, match="num_places"):
        generate_longrange_dataset(1, 0, (40, 50), "twin", min_gap_tokens=0, num_facts=5, num_places=3)


def test_twin_fillers_and_question_options():
    base = dict(context_tokens=(40, 50), kind="twin", min_gap_tokens=0, num_facts=5, names="words",
                placement="balanced", target="later")
    records = generate_longrange_dataset(40, 0, num_fillers=3, question="Which town is home to two people?", **base)
    fillers = {s for r in records for s in re.split(r"(?<=\.) ", r["context"]) if " lives in " not in s}
    assert len(fillers) <= 3 and all(r["question"] == "Which town is home to two people?" for r in records)
    assert generate_longrange_dataset(5, 0, **base) == generate_longrange_dataset(5, 0, num_fillers=None, **base)


# -- SQuAD-format files for the library ------------------------------------------------------------------------------


@pytest.mark.parametrize("suffix", [".json", ".jsonl"])
def test_written_files_read_back_as_the_records_through_the_training_loader(tmp_path, suffix):
    """What ``python -m clusterformer_research.longrange`` writes, the library's ``--train_file`` reads unchanged
    (twin records carry both mentions as answers)."""
    from hf_clusterformer.qa_training import DataArguments, load_raw_datasets

    records = generate_longrange_dataset(5, 2, (60, 90), "local", min_gap_tokens=10)
    records += generate_longrange_dataset(3, 2, (60, 80), "twin", min_gap_tokens=10, num_facts=5)
    path = write_squad_file(records, tmp_path / f"records{suffix}")
    raw = load_raw_datasets(DataArguments(train_file=str(path), validation_file=str(path)))
    for split in ("train", "validation"):
        assert [dict(row) for row in raw[split]] == records
    if suffix == ".json":
        assert json.loads(path.read_text(encoding="utf-8")) == squad_json(records)
    with pytest.raises(FileExistsError, match="--overwrite"):
        write_squad_file(records, path)
    assert write_squad_file(records[:1], path, overwrite=True) == path
    with pytest.raises(ValueError, match=r"\.json"):
        write_squad_file(records, tmp_path / "records.csv")


def test_the_command_writes_a_split_and_the_tokenizer(tmp_path, capsys):
    out, tokenizer_dir = tmp_path / "dev.json", tmp_path / "tokenizer"
    argv = ["--kind", "local", "--split", "validation", "--num_examples", "3", "--context_tokens", "60", "90",
            "--min_gap_tokens", "10", "--seed", "4", "--out", str(out)]
    assert main([*argv, "--tokenizer_dir", str(tokenizer_dir), "--vocab_size", "400"]) == 0
    flat = [qa["id"] for article in json.loads(out.read_text(encoding="utf-8"))["data"]
            for paragraph in article["paragraphs"] for qa in paragraph["qas"]]
    expected = generate_longrange_dataset(3, 4, (60, 90), "local", min_gap_tokens=10, split="validation")
    assert flat == [r["id"] for r in expected]
    assert (tokenizer_dir / "tokenizer.json").is_file()
    capsys.readouterr()
    assert main(argv) == 2  # the file exists
    assert "--overwrite" in capsys.readouterr().err
    assert main([*argv, "--overwrite", "--min_gap_tokens", "-1"]) == 2
    assert "min_gap_tokens" in capsys.readouterr().err


def test_the_command_runs_as_a_module(tmp_path):
    out = tmp_path / "train.jsonl"
    done = subprocess.run([sys.executable, "-m", "clusterformer_research.longrange", "--kind", "twin",
                           "--num_examples", "2", "--context_tokens", "60", "80", "--min_gap_tokens", "10",
                           "--num_facts", "5", "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert len(rows) == 2 and all(len(row["answers"]["answer_start"]) == 2 for row in rows)
