"""examples/run_classification.py: excerpts never share a paragraph between training and test, and the script runs
end to end at tiny size (a model from scratch on the SQuAD dev articles)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from transformers import AutoModelForSequenceClassification

import hf_clusterformer  # noqa: F401  (registers the Auto classes)
from hf_clusterformer import ClusterFormerForSequenceClassification
from hf_clusterformer.data import build_tokenizer, default_squad_path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "examples" / "run_classification.py"
pytestmark = pytest.mark.skipif(not default_squad_path().exists(), reason="SQuAD v1.1 dev is not in ../shared/data")


@pytest.fixture(scope="module")
def script():
    spec = importlib.util.spec_from_file_location("run_classification", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["run_classification"] = module  # its dataclasses look their module up
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        del sys.modules["run_classification"]


def test_excerpts_share_no_paragraph_between_training_and_test(script):
    titles, train, test = script.split_articles(None, 4, 3)
    assert len(titles) == len(set(titles)) == 4
    tokenizer = build_tokenizer([p for ps in train for p in ps[:5]], vocab_size=400)
    rng = np.random.default_rng(0)
    for side, other in ((train, test), (test, train)):
        excerpts = script.draw_excerpts(side, tokenizer, 3, 300, 900, rng)
        assert excerpts["label"] == [c for c in range(4) for _ in range(3)]
        for text, label in zip(excerpts["text"], excerpts["label"]):
            parts = text.split("\n\n")
            assert set(parts) <= set(side[label]) and not set(parts) & {p for ps in other for p in ps}
            assert len(tokenizer(text)["input_ids"]) >= 300 or len(parts) == len(side[label])


def test_run_classification_end_to_end(tmp_path):
    out = tmp_path / "cls"
    args = [
        "--hidden_size", "32", "--num_hidden_layers", "2", "--num_attention_heads", "2", "--intermediate_size", "64",
        "--vocab_size", "400", "--window_size", "32", "--window_stride", "24", "--cluster_layers", "1",
        "--num_clusters", "8", "--num_classes", "3", "--train_per_class", "4", "--test_per_class", "2",
        "--excerpt_tokens_min", "200", "--excerpt_tokens_max", "400", "--max_steps", "4",
        "--per_device_train_batch_size", "2", "--centroid_update_steps", "2", "--memory_size", "2000",
        "--report_to", "none", "--save_strategy", "no", "--use_cpu", "--disable_tqdm", "true",
        "--output_dir", str(out), "--do_train", "--do_eval",
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads((out / "all_results.json").read_text())
    assert results["train_excerpts"] == 12 and results["test_excerpts"] == 6 and results["train_steps"] == 4
    assert 0 <= results["test_accuracy"] <= 1 and results["test_tokens_min"] >= 200
    model = AutoModelForSequenceClassification.from_pretrained(out)
    assert isinstance(model, ClusterFormerForSequenceClassification)
    assert list(model.config.id2label.values()) == results["classes"]
