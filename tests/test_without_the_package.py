"""Saved folders with transformers alone: what ``save_pretrained``, a Trainer checkpoint and the card's snippets
give loads and answers where this package cannot be imported; with it, transformers' pipeline finds its task, and
``import hf_clusterformer`` loads only what registering needs."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import (
    CHILD_ENV,
    CONTEXT,
    QUESTION,
    tiny_config,
)
from helpers import tiny_qa_model as _model
from helpers import train_one_step as _train_one_step
from helpers import without_package as _without_package

import hf_clusterformer
from hf_clusterformer import ClusterFormerForQuestionAnswering
from hf_clusterformer.hub import save_for_hub
from hf_clusterformer.pipeline import ClusterFormerQuestionAnsweringPipeline

# -- where hf_clusterformer cannot be imported: code files, pipeline code, card snippets, tokenizer -------------------


def test_plain_save_pretrained_loads_without_the_package(tmp_path):
    """A fresh process (no earlier save_for_hub in it) saves with model.save_pretrained alone."""
    save = f"""
import sys, torch
sys.path.insert(0, {str(Path(__file__).parent)!r})
from helpers import squad_jsonl, tiny_config
from hf_clusterformer import ClusterFormerForQuestionAnswering
torch.manual_seed(0)
model = ClusterFormerForQuestionAnswering(tiny_config()).eval()
model.save_pretrained(sys.argv[1])
"""
    subprocess.run([sys.executable, "-c", save, str(tmp_path / "plain")], check=True, capture_output=True,
                   env=CHILD_ENV, timeout=120)
    model = ClusterFormerForQuestionAnswering.from_pretrained(tmp_path / "plain").eval()
    ids = torch.tensor([[0, 5, 6, 2, 2, *range(7, 40), 2]])
    with torch.no_grad():
        expected = model(input_ids=ids).start_logits
    code = """
import torch
from transformers import AutoModelForQuestionAnswering
model = AutoModelForQuestionAnswering.from_pretrained(sys.argv[1], trust_remote_code=True).eval()
with torch.no_grad():
    print(model(input_ids=torch.tensor([[0, 5, 6, 2, 2, *range(7, 40), 2]])).start_logits.tolist())
"""
    result = _without_package(code, str(tmp_path / "plain"))
    assert result.returncode == 0, result.stderr[-3000:]
    assert torch.tensor(json.loads(result.stdout.strip().splitlines()[-1])) == pytest.approx(expected)

def test_save_pretrained_and_trainer_checkpoints_carry_the_pipeline_code(hub_model, tokenizer, tmp_path):
    """Row: ``model.save_pretrained(DIR)`` or a Trainer checkpoint of a model loaded from a Hub checkpoint, then
    ``pipeline("question-answering", model=DIR, trust_remote_code=True)`` without the plugin: no pipeline.py."""
    model = ClusterFormerForQuestionAnswering.from_pretrained(hub_model)
    assert model.config.custom_pipelines  # what the Hub checkpoint's config.json names
    model.save_pretrained(tmp_path / "saved")
    tokenizer.save_pretrained(tmp_path / "saved")
    checkpoint = _train_one_step(model, tokenizer, tmp_path / "run")
    code = """
from transformers import pipeline
qa = pipeline("question-answering", model=sys.argv[1], trust_remote_code=True)
answer = qa(question=sys.argv[2], context=sys.argv[3])
assert sys.argv[3][answer["start"]:answer["end"]] == answer["answer"], answer
print(type(qa).__name__)
"""
    for folder in (tmp_path / "saved", checkpoint):
        assert (folder / "pipeline.py").is_file()
        result = _without_package(code, str(folder), QUESTION, CONTEXT)
        assert result.returncode == 0, result.stderr[-3000:]
        assert result.stdout.strip().splitlines()[-1] == "ClusterFormerQuestionAnsweringPipeline"

def test_card_snippets_run_as_printed(tmp_path, tokenizer):
    """Row: the card's usage snippet raised ``NameError: long_text`` when run as printed. The plugin snippet runs with
    the package; the other, with ``trust_remote_code``, where the package cannot be imported, without a prompt."""
    folder = save_for_hub(_model(tokenizer, max_question_length=32, max_position_embeddings=128), tokenizer,
                          tmp_path / "card-model")
    card = (folder / "README.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```python\n(.*?)```", card, flags=re.S)
    assert len(blocks) == 2 and "trust_remote_code=True" in blocks[1].split("AutoTokenizer.from_pretrained")[1]
    with_plugin, without = (block.replace("path/to/checkpoint", str(folder)) for block in blocks)
    result = subprocess.run([sys.executable, "-c", with_plugin], capture_output=True, text=True, env=CHILD_ENV,
                            stdin=subprocess.DEVNULL, timeout=180)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "'answer'" in result.stdout
    result = _without_package("\n" + without)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "'answer'" in result.stdout and "[y/N]" not in result.stdout + result.stderr

def test_tokenizer_without_the_plugin_loads_as_the_card_says(hub_model):
    """Row: ``AutoTokenizer.from_pretrained(DIR)`` without the plugin prompts about remote code, because transformers
    reads the config (which names code) before any tokenizer; the card and README pass ``trust_remote_code=True``,
    which loads it without a prompt."""
    card = (hub_model / "README.md").read_text(encoding="utf-8")
    assert 'AutoTokenizer.from_pretrained("path/to/checkpoint", trust_remote_code=True, revision=revision)' in card
    code = """
from transformers import AutoTokenizer
print(type(AutoTokenizer.from_pretrained(sys.argv[1], trust_remote_code=True)).__name__)
"""
    result = _without_package(code, str(hub_model))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "[y/N]" not in result.stdout + result.stderr and result.stdout.strip().endswith("Tokenizer")


# -- with the package: transformers' pipeline task, and what the import loads -----------------------------------------


def test_question_answering_task_once_registered(converted, tmp_path):
    """A folder with the pipeline code in config.json: transformers' own rule asks for trust_remote_code, so the
    calls that use this package's pipeline are hf_clusterformer.pipeline and pipeline_class=."""
    from transformers import pipeline

    hf_clusterformer.register_pipeline()  # explicit: the import alone leaves transformers' task list alone
    with pytest.raises(ValueError, match="trust_remote_code"):
        pipeline("question-answering", model=str(converted))
    qa = pipeline("question-answering", model=str(converted), pipeline_class=ClusterFormerQuestionAnsweringPipeline,
                  allow_untrained=True)
    assert type(qa) is ClusterFormerQuestionAnsweringPipeline
    built = hf_clusterformer.pipeline(model=str(converted), allow_untrained=True)
    assert type(built) is ClusterFormerQuestionAnsweringPipeline
    model = ClusterFormerForQuestionAnswering(tiny_config())
    model.save_pretrained(tmp_path / "no-custom-pipeline")  # no custom_pipelines entry: the registry answers
    from transformers import AutoTokenizer

    assert type(pipeline("question-answering", model=model, tokenizer=AutoTokenizer.from_pretrained(converted))) is (
        ClusterFormerQuestionAnsweringPipeline
    )

def test_import_loads_only_what_registration_needs():
    """Row: ``import hf_clusterformer`` took 4.5 s against 0.8 s for ``import transformers``. Registering the Auto
    classes needs the model classes, so transformers' RoBERTa modeling (modeling_utils and what it imports: most of
    the time) is loaded; the Hub, training, data and metric parts, datasets, evaluate and plotting are not."""
    code = ("import sys, hf_clusterformer\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('datasets', 'evaluate', 'faiss', 'matplotlib')"
            " or m.startswith('hf_clusterformer.')))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=CHILD_ENV, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert json.loads(result.stdout.strip().replace("'", '"')) == [
        "hf_clusterformer.configuration_clusterformer", "hf_clusterformer.loading",
        "hf_clusterformer.modeling_clusterformer", "hf_clusterformer.pipeline",
    ]
