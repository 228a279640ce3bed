"""Weights never trained: a plain encoder's new QA head is drawn by ``--seed`` and recorded as untrained; predict,
pipelines and evaluate refuse it until it is trained (or ``--allow-untrained``), and loading names what it drew."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
import torch
from helpers import (
    CHILD_ENV,
    CONTEXT,
    QUESTION,
    SMALL,
    squad_jsonl,
)
from helpers import main_error as _error
from safetensors.torch import load_file

import hf_clusterformer
from hf_clusterformer import ClusterFormerForQuestionAnswering
from hf_clusterformer.hub import save_for_hub
from hf_clusterformer.modeling_clusterformer import UntrainedModelError, untrained_weights
from hf_clusterformer.pipeline import ClusterFormerQuestionAnsweringPipeline
from hf_clusterformer_cli import main

# -- a new head: refused until trained, drawn by --seed, said when loaded ---------------------------------------------


def test_predict_refuses_a_new_qa_head_and_says_how_to_train(work, converted, roberta, capsys):
    config = json.loads((converted / "config.json").read_text(encoding="utf-8"))
    assert config["untrained_weights"]["names"] == ["qa_outputs.bias", "qa_outputs.weight"]
    assert "never trained" in (converted / "README.md").read_text(encoding="utf-8")
    context = str(work / "context.txt")
    _error(capsys, ["predict", str(converted), "--question", QUESTION, "--context-file", context],
           str(converted), "never trained", "clusterformer train", "--allow-untrained")
    _error(capsys, ["predict", str(roberta), "--question", QUESTION, "--context-file", context, "--allow-untrained"],
           str(roberta), "plain roberta checkpoint", "clusterformer convert")  # not converted on the fly
    assert main(["predict", str(converted), "--question", QUESTION, "--context-file", context,
                 "--allow-untrained"]) == 0

def test_pipeline_refuses_an_untrained_head_until_it_is_trained(converted, tokenizer, tmp_path):
    with pytest.raises(UntrainedModelError, match="never trained"):
        hf_clusterformer.pipeline(model=str(converted))
    assert hf_clusterformer.pipeline(model=str(converted), allow_untrained=True)(question=QUESTION, context=CONTEXT)
    model = ClusterFormerForQuestionAnswering.from_pretrained(converted)
    assert untrained_weights(model) == ["qa_outputs.bias", "qa_outputs.weight"]
    with torch.no_grad():
        model.qa_outputs.weight.add_(0.01)  # what any training step does
    assert untrained_weights(model) == []
    ClusterFormerQuestionAnsweringPipeline(model=model, tokenizer=tokenizer)
    saved = save_for_hub(model, tokenizer, tmp_path / "trained")
    assert "untrained_weights" not in json.loads((saved / "config.json").read_text(encoding="utf-8"))
    assert "never trained" not in (saved / "README.md").read_text(encoding="utf-8")
    hf_clusterformer.pipeline(model=str(saved))

def test_evaluate_refuses_an_untrained_head(converted, work, capsys):
    dev = squad_jsonl(work / "untrained-dev.jsonl", QUESTION, CONTEXT, "Tarsk", 2)
    _error(capsys, ["evaluate", "--model_name_or_path", str(converted), "--validation_file", str(dev),
                    "--output_dir", str(work / "eval-untrained"), "--report_to", "none", "--use_cpu"],
           "never trained", "--allow-untrained", f"`clusterformer train --model_name_or_path {converted} ...`")

def test_another_heads_pipeline_on_a_folder_says_its_head_is_untrained(converted, caplog):
    """transformers.pipeline of another head on a QA folder builds that head at random: loading says so in one line
    naming the drawn weights, and records them as untrained (this package's checks refuse them)."""
    import logging

    from transformers import pipeline

    from hf_clusterformer.modeling_clusterformer import untrained_weights

    with caplog.at_level(logging.WARNING, logger="hf_clusterformer"):
        fill = pipeline("fill-mask", model=str(converted))
    said = [r.getMessage() for r in caplog.records if "drawn at random" in r.getMessage()]
    assert len(said) == 1
    assert said[0].startswith("ClusterFormerForMaskedLM: the checkpoint has no weights for lm_head.")
    assert "fine-tune it first" in said[0]
    assert any(name.startswith("lm_head.") for name in untrained_weights(fill.model))

def test_loading_says_what_it_drew_in_one_line_without_transformers_tables(converted, roberta, tmp_path):
    """Row: ``from_pretrained`` printed transformers' load-report tables (MISSING centroids when a RoBERTa checkpoint
    loads, UNEXPECTED/MISSING rows and a "seem corrupted" tie note when another head loads from a converted folder)
    beside this package's own line. The table shows where it says more: encoder weights the checkpoint lacks."""
    from safetensors.torch import save_file

    lacking = tmp_path / "lacking"  # a converted folder missing one encoder tensor
    shutil.copytree(converted, lacking)
    tensors = load_file(lacking / "model.safetensors")
    del tensors["roberta.encoder.layer.0.output.dense.bias"]
    save_file(tensors, lacking / "model.safetensors", metadata={"format": "pt"})
    code = """
import sys
import hf_clusterformer
from transformers import AutoModelForMaskedLM
from hf_clusterformer import ClusterFormerForQuestionAnswering, ClusterFormerForSequenceClassification
roberta, converted, lacking = sys.argv[1:4]
ClusterFormerForQuestionAnswering.from_pretrained(roberta, cluster_layers=[1], num_clusters=4)
AutoModelForMaskedLM.from_pretrained(converted)
ClusterFormerForSequenceClassification.from_pretrained(converted, num_labels=3)
print("--- lacking", file=sys.stderr, flush=True)
ClusterFormerForQuestionAnswering.from_pretrained(lacking)
"""
    env = dict(CHILD_ENV, HF_HUB_DISABLE_PROGRESS_BARS="1")
    result = subprocess.run([sys.executable, "-c", code, str(roberta), str(converted), str(lacking)],
                            capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    quiet, lacking_said = result.stderr.split("--- lacking")
    lines = [line for line in quiet.splitlines() if line.strip()]
    assert [line.split(":")[0] for line in lines] == [  # the encoder's new QA head, the heads a QA folder lacks
        "ClusterFormerForQuestionAnswering", "ClusterFormerForMaskedLM",
        "ClusterFormerForSequenceClassification"], quiet
    assert all("drawn at random" in line for line in lines)
    assert "LOAD REPORT" in lacking_said and "roberta.encoder.layer.0.output.dense.bias" in lacking_said
    assert "auto_map" not in json.loads((converted / "tokenizer_config.json").read_text(encoding="utf-8"))

def test_convert_is_deterministic_across_processes(roberta, tmp_path):
    """The same --seed draws the same new head in a fresh process and in this one (whose random state earlier tests
    moved); another seed, another head."""
    heads = []
    for name, seed in (("a", "0"), ("b", "0"), ("c", "1")):
        argv = ["convert", str(roberta), str(tmp_path / name), *SMALL, "--seed", seed, "--allow-untrained"]
        if name == "a":
            subprocess.run([sys.executable, "-m", "hf_clusterformer_cli", *argv], check=True, capture_output=True,
                           env=CHILD_ENV, timeout=180)
        else:
            assert main(argv) == 0
        heads.append(load_file(tmp_path / name / "model.safetensors")["qa_outputs.weight"])
    assert torch.equal(heads[0], heads[1]) and not torch.equal(heads[0], heads[2])
