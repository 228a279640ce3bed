"""bench/realtext.py: the real-text recipe (SQuAD v1.1 dev, MiniLM start) end to end at tiny size, on the CPU."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "bench" / "realtext.py"


def _squad_path() -> Path:
    from hf_clusterformer.data.multipassage import default_squad_path

    return default_squad_path()


def _pretrained() -> Path:
    from hf_clusterformer.pretrained import PretrainedUnavailableError, fetch_pretrained

    try:
        return fetch_pretrained(download=False)
    except PretrainedUnavailableError:
        pytest.skip("all-MiniLM-L6-v2 is not in the cache (python -m hf_clusterformer.pretrained fetches it)")


@pytest.fixture(scope="module")
def realtext():
    if not _squad_path().exists():
        pytest.skip(f"SQuAD v1.1 dev file not available at {_squad_path()}")
    _pretrained()
    spec = importlib.util.spec_from_file_location("realtext", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_multipassage_contexts(realtext):
    """Gold paragraph at its recorded place with exact answer offsets; ``same`` takes the gold's article first;
    lengths end near the target; the draw depends only on the seed."""
    from transformers import AutoTokenizer

    corpus = realtext.Corpus(None, AutoTokenizer.from_pretrained(_pretrained()))
    pool = corpus.question_pool((40, 48), 64)
    assert pool and all(40 <= corpus.article[p] < 48 for p, _ in pool)
    paragraph, qa = pool[5]
    for kind in ("other", "same"):
        record = realtext.multipassage_record(corpus, paragraph, qa, kind, 1500, (40, 48), np.random.default_rng(3))
        again = realtext.multipassage_record(corpus, paragraph, qa, kind, 1500, (40, 48), np.random.default_rng(3))
        assert record == again
        start, end = record["passages"][record["gold"]]
        assert record["context"][start:end] == corpus.texts[paragraph]
        for text, offset in zip(record["answers"]["text"], record["answers"]["answer_start"]):
            assert record["context"][offset: offset + len(text)] == text and start <= offset < end
        texts = [record["context"][s:e] for s, e in record["passages"]]
        owners = [corpus.article[corpus.texts.index(t)] for t in texts]
        assert all(40 <= a < 48 for a in owners)
        distractors = [a for i, a in enumerate(owners) if i != record["gold"]]
        if kind == "other":
            assert corpus.article[paragraph] not in distractors
        else:  # the gold's article holds more than 1500 tokens: every distractor comes from it
            assert set(distractors) == {corpus.article[paragraph]}
        tokens = sum(corpus.lengths([corpus.texts.index(t) for t in texts]))
        assert abs(tokens - 1500) < 400


def test_tiny_run_end_to_end(tmp_path, realtext):
    """``--tiny`` trains both variants a few steps, scores every cell and writes JSON, table, plot and budget."""
    env = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    done = subprocess.run([sys.executable, str(SCRIPT), "--tiny", "--output_dir", str(tmp_path)],
                          capture_output=True, text=True, env=env, timeout=240, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "ESTIMATE of the configured run" in done.stdout
    assert "ORACLE F1 (gold paragraph alone) clusterformer" in done.stdout
    assert "ORACLE F1 (gold paragraph alone) sliding" in done.stdout

    budget = json.loads((tmp_path / "budget.json").read_text())
    assert budget["seconds_per_step"] > 0 and budget["sequential_seconds"] > 0
    records = {v: json.loads((tmp_path / f"{v}-seed0.json").read_text()) for v in ("clusterformer", "sliding")}
    cells = {v: {(c["kind"], c["length"]): c for c in r["cells"]} for v, r in records.items()}
    expected = {("oracle", 0)} | {(kind, length) for kind in ("other", "same") for length in (400, 800)}
    assert set(cells["clusterformer"]) == set(cells["sliding"]) == expected
    assert records["clusterformer"]["question_ids"] == records["sliding"]["question_ids"]
    assert len(records["sliding"]["question_ids"]) == 3
    for key in expected:  # the same questions and contexts in every cell of both models
        assert cells["clusterformer"][key]["digest"] == cells["sliding"][key]["digest"]
        assert set(cells["clusterformer"][key]["predictions"]) == set(records["sliding"]["question_ids"])
    for variant, by_cell in cells.items():
        for (kind, length), cell in by_cell.items():
            assert cell["questions"] == 3
            assert 0 <= cell["em"] <= cell["f1"] <= 100 and cell["seconds_per_question"] > 0
            if length:
                assert abs(cell["context_tokens"] - length) < 0.5 * length
            colocation = [k for k in cell if k.endswith("colocated") or k.endswith("with_question")]
            if variant == "sliding":
                assert not colocation
            else:
                assert {"gold_passage_colocated", "answer_colocated", "gold_tokens_with_question"} <= set(colocation)
                assert all(cell[k] is None or 0 <= cell[k] <= 100 for k in colocation)
    assert records["clusterformer"]["centroids"]["fitted"]
    assert [p["step"] for p in records["sliding"]["curve"]] == [1, 2, 3]

    table = (tmp_path / "results.md").read_text()
    assert "Oracle F1 (gold paragraph alone): clusterformer" in table
    assert table.count("| gold paragraph | oracle |") == 2
    assert "1 distinct cell inputs" not in table and "5 distinct cell inputs" in table
    assert (tmp_path / "f1_vs_length.png").read_bytes()[:4] == b"\x89PNG"

    again = subprocess.run([sys.executable, str(SCRIPT), "--report_only", "--output_dir", str(tmp_path)],
                           capture_output=True, text=True, env=env, timeout=120, cwd=ROOT)
    assert again.returncode == 0, again.stderr[-3000:]
    assert (tmp_path / "results.md").read_text() == table
