"""The SQuAD v1.1 metric, directly and through ``evaluate.load`` by path."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hf_clusterformer.metrics import (
    SQUAD_METRIC_PATH,
    compute_squad,
    exact_match_score,
    f1_score,
    load_squad_metric,
    normalize_answer,
)


def _refs(*answers: list[str]) -> list[dict]:
    return [
        {"id": str(i), "answers": {"text": texts, "answer_start": [0] * len(texts)}}
        for i, texts in enumerate(answers)
    ]


def _preds(*texts: str) -> list[dict]:
    return [{"id": str(i), "prediction_text": t} for i, t in enumerate(texts)]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("The Cat sat", "cat sat"),
        ("  an  Apple, a day! ", "apple day"),
        ("Theatre the-end", "theatre theend"),  # articles only as whole words
        ("A.", ""),
        ("Denver   Broncos\n", "denver broncos"),
    ],
)
def test_normalize_answer(text, expected):
    assert normalize_answer(text) == expected


def test_hand_computed_scores():
    # "the Cat sat" -> [cat, sat]; "cat sat on" -> [cat, sat, on]; 2 shared tokens:
    # precision 2/2 = 1, recall 2/3, F1 = 2 * 1 * 2/3 / (1 + 2/3) = 0.8
    assert f1_score("the Cat sat", "cat sat on") == pytest.approx(0.8)
    assert exact_match_score("the Cat sat", "cat sat on") == 0.0
    # "sat sat mat" vs "sat on mat": shared multiset {sat, mat} = 2, P = 2/3, R = 2/3, F1 = 2/3
    assert f1_score("sat sat mat", "sat on mat") == pytest.approx(2 / 3)
    assert f1_score("dog", "cat") == 0.0
    assert exact_match_score("The Denver Broncos.", "denver broncos") == 1.0
    # "the" alone normalises to nothing: the v1.1 script gives F1 0 even against itself
    assert f1_score("the", "a") == 0.0 and exact_match_score("the", "a") == 1.0


def test_compute_squad_takes_the_best_gold_and_averages_in_percent():
    refs = {"a": ["cat sat on"], "b": ["Paris", "the city of Paris"], "c": ["blue"], "d": ["x"]}
    preds = {"a": "the Cat sat", "b": "city of Paris", "c": "red"}  # "d" unanswered: scores 0
    # EM: a 0, b 1 (matches the second gold after normalisation), c 0, d 0 -> 25
    # F1: a 0.8, b 1.0, c 0, d 0 -> 1.8 / 4 = 45
    result = compute_squad(preds, refs)
    assert result == pytest.approx({"exact_match": 25.0, "f1": 45.0})
    # a reference without gold answers is unanswerable: right only for an empty prediction
    assert compute_squad({"q": ""}, {"q": []}) == {"exact_match": 100.0, "f1": 100.0}
    assert compute_squad({"q": "x"}, {"q": []}) == {"exact_match": 0.0, "f1": 0.0}
    with pytest.raises(ValueError):
        compute_squad({}, {})


def test_evaluate_load_by_path_matches_hand_values():
    assert Path(SQUAD_METRIC_PATH).is_file()
    metric = load_squad_metric()
    result = metric.compute(
        predictions=_preds("the Cat sat", "Denver Broncos", "nothing"),
        references=_refs(["cat sat on"], ["Carolina Panthers", "the Denver Broncos"], ["x y"]),
    )
    # EM: 0 + 1 + 0 = 1 of 3; F1: 0.8 + 1 + 0 = 1.8 of 3
    assert result == pytest.approx({"exact_match": 100 / 3, "f1": 60.0})
    # batches accumulate like any evaluate metric
    metric.add_batch(predictions=_preds("cat"), references=_refs(["Cat"]))
    assert metric.compute() == {"exact_match": 100.0, "f1": 100.0}


def test_evaluate_load_works_offline_in_a_fresh_interpreter(tmp_path):
    code = (
        "import evaluate, json, sys;"
        "m = evaluate.load(sys.argv[1]);"
        "print(json.dumps(m.compute("
        "predictions=[{'id': '1', 'prediction_text': 'The Cat sat'}],"
        "references=[{'id': '1', 'answers': {'text': ['cat sat on'], 'answer_start': [0]}}])))"
    )
    env = dict(
        os.environ,
        HF_HUB_OFFLINE="1",
        HF_EVALUATE_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        HF_HOME=str(tmp_path / "hf"),
        HF_MODULES_CACHE=str(tmp_path / "modules"),
    )
    out = subprocess.run(
        [sys.executable, "-c", code, SQUAD_METRIC_PATH],
        env=env, capture_output=True, text=True, timeout=120, check=True,
    )
    assert json.loads(out.stdout.strip().splitlines()[-1]) == pytest.approx(
        {"exact_match": 0.0, "f1": 80.0}
    )


def test_scores_import_without_datasets_and_evaluate(monkeypatch):
    """Where neither is installed (a bare GPU machine), the scores import and score the same; only the ``evaluate``
    wrapper is absent."""
    import importlib

    for name in ("datasets", "evaluate"):
        monkeypatch.setitem(sys.modules, name, None)  # an import fails as if not installed
    for name in ("hf_clusterformer.metrics", "hf_clusterformer.metrics.squad_metric"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    bare = importlib.import_module("hf_clusterformer.metrics")
    assert bare.exact_match_score is not exact_match_score
    assert not hasattr(bare.squad_metric, "SquadMetric")
    for prediction, truth in (("the Denver Broncos", "Denver Broncos"), ("Denver", "Denver Broncos"), ("x", "y")):
        assert (bare.exact_match_score(prediction, truth), bare.f1_score(prediction, truth)) == (
            exact_match_score(prediction, truth), f1_score(prediction, truth))
    assert bare.compute_squad({"1": "Denver"}, {"1": ["Denver Broncos"]}) == compute_squad(
        {"1": "Denver"}, {"1": ["Denver Broncos"]})
