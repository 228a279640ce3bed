"""Self-contained checkpoints: files and imports, loading in a Python where ``hf_clusterformer`` cannot be imported
(from a directory and through the local Hub server), push/pull with identical logits, conversion of RoBERTa
checkpoints, and what `push_model` refuses.

Processes that must not see the package run with a meta-path finder that makes ``import hf_clusterformer`` fail,
and first check that it does.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
import torch
from helpers import tiny_config, transformers_warnings
from remote_code_helpers import HIDE_PACKAGE, OFFLINE, SENTENCES
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from support.hub_fixtures import TEST_TOKEN, run_with_endpoint
from transformers import AutoConfig, GPT2Config, RobertaConfig, RobertaForQuestionAnswering, RobertaModel

import hf_clusterformer
from hf_clusterformer import ClusterFormerForQuestionAnswering
from hf_clusterformer.centroid_updates import CentroidUpdater
from hf_clusterformer.conversion import convert_checkpoint
from hf_clusterformer.data.tokenizer import build_tokenizer
from hf_clusterformer.hub import (
    CODE_FILES,
    check_hub_checkpoint,
    hub_auto_map,
    hub_code_imports,
    push_model,
    save_for_hub,
)
from hf_clusterformer.pipeline import ClusterFormerQuestionAnsweringPipeline, required_model_max_length

QUESTION = "Where does Zorvan live?"
CONTEXT = " ".join(SENTENCES[i % 3] for i in range(12))


LOAD = HIDE_PACKAGE + """
import json
import torch
from safetensors.torch import load_file
from transformers import AutoModelForQuestionAnswering, pipeline

torch.set_num_threads(1)
model_source, pipeline_source, reference_dir = sys.argv[1:4]
ref = load_file(reference_dir + "/reference.safetensors")
text = json.load(open(reference_dir + "/reference.json"))
model = AutoModelForQuestionAnswering.from_pretrained(model_source, trust_remote_code=True).eval()
with torch.no_grad():
    out = model(input_ids=ref["input_ids"], attention_mask=ref["attention_mask"])
state = model.state_dict()
result = {
    "model_module": type(model).__module__,
    "logits_equal": all(torch.equal(out[k], ref[k]) for k in ("start_logits", "end_logits", "answerable_logits")),
    "buffers_equal": all(torch.equal(state[k], ref[k]) for k in text["buffers"]),
    "config": {k: getattr(model.config, k) for k in text["config"]},
}
if pipeline_source != "-":
    qa = pipeline("question-answering", model=pipeline_source, trust_remote_code=True, device="cpu")
    result["pipeline"] = type(qa).__module__
    result["answers"] = qa(question=text["question"], context=text["context"], top_k=3)
result["plugin_modules"] = sorted(m for m in sys.modules if m.startswith("hf_clusterformer"))
print(json.dumps(result))
"""

PUSH = """
import json, sys
import torch
from huggingface_hub import HfApi
from transformers import AutoModelForQuestionAnswering, AutoTokenizer
from hf_clusterformer.hub import prepare_for_hub, push_model

torch.set_num_threads(1)
checkpoint = sys.argv[1]
model = AutoModelForQuestionAnswering.from_pretrained(checkpoint)
tokenizer = AutoTokenizer.from_pretrained(checkpoint)
assert type(model).__module__ == "hf_clusterformer.modeling_clusterformer", type(model).__module__
prepare_for_hub(model, tokenizer)
model.push_to_hub("user/cf-pushed")
tokenizer.push_to_hub("user/cf-pushed")
commit = push_model(checkpoint, "user/cf-full")
api = HfApi()
print(json.dumps({
    "pushed": sorted(api.list_repo_files("user/cf-pushed")),
    "full": sorted(api.list_repo_files("user/cf-full")),
    "full_sha": api.model_info("user/cf-full").sha,
    "commit": commit.oid,
}))
"""

CONFIG_FIELDS = ["layer_kinds", "num_clusters", "window_size", "window_stride", "max_question_length",
                 "max_context_length", "use_answerability_head"]



@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer(SENTENCES * 4, vocab_size=300)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory, tokenizer):
    """A tiny QA model with K-Means-fitted centroids and an answerability head, saved by `save_for_hub`, plus its
    reference logits, buffers and pipeline answers (in ``reference.*`` next to it)."""
    torch.manual_seed(0)
    config = tiny_config(
        vocab_size=len(tokenizer), max_question_length=16, use_answerability_head=True, num_clusters=4
    )
    model = ClusterFormerForQuestionAnswering(config)
    updater = CentroidUpdater(model, min_states=64, backend="torch")
    encoding = tokenizer(QUESTION, CONTEXT, return_tensors="pt")
    model.train()
    with torch.no_grad():
        model(**encoding)
    assert updater.update() is not None
    updater.close()
    model.eval()
    assert all(bool(router.fitted) for router in model.cluster_routers().values())

    root = tmp_path_factory.mktemp("checkpoint")
    path = save_for_hub(model, tokenizer, root / "model", card_data={"model_id": "user/cf-full"})
    with torch.no_grad():
        out = model(**encoding)
    buffers = {k: v for k, v in model.state_dict().items() if ".router." in k}
    save_file(
        {"input_ids": encoding["input_ids"], "attention_mask": encoding["attention_mask"],
         "start_logits": out.start_logits, "end_logits": out.end_logits, "answerable_logits": out.answerable_logits,
         **buffers},
        root / "reference.safetensors",
    )
    qa = ClusterFormerQuestionAnsweringPipeline(model=model, tokenizer=tokenizer, device="cpu")
    answers = qa(question=QUESTION, context=CONTEXT, top_k=3)
    (root / "reference.json").write_text(json.dumps({
        "question": QUESTION, "context": CONTEXT, "buffers": sorted(buffers),
        "config": CONFIG_FIELDS, "answers": answers,
    }))
    return path, root, model, answers


def _load_without_package(model_source, pipeline_source, reference_dir, endpoint, hf_home, offline):
    extra = {"HF_HUB_OFFLINE": "1"} if offline else {}
    args = [str(model_source), str(pipeline_source), str(reference_dir)]
    proc = run_with_endpoint(LOAD, endpoint, hf_home, extra, args=args)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _check_loaded(result, model, answers, with_pipeline=True):
    assert result["model_module"].startswith("transformers_modules.")  # the checkpoint's own code
    assert result["logits_equal"] and result["buffers_equal"]
    assert result["config"] == {k: getattr(model.config, k) for k in CONFIG_FIELDS}
    assert result["plugin_modules"] == []
    if with_pipeline:
        assert result["pipeline"].startswith("transformers_modules.") and result["pipeline"].endswith(".pipeline")
        assert [(a["start"], a["end"], a["answer"]) for a in result["answers"]] == [
            (a["start"], a["end"], a["answer"]) for a in answers
        ]
        assert [a["score"] for a in result["answers"]] == pytest.approx([a["score"] for a in answers], rel=1e-6)


def test_checkpoint_is_self_contained(checkpoint):
    path, _, model, _ = checkpoint
    files = sorted(p.name for p in path.iterdir() if not p.name.startswith("."))
    expected = [
        *CODE_FILES, "README.md", "config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"
    ]
    assert files == sorted(expected)
    assert [p.name for p in path.iterdir() if p.name.startswith(".")] == [".clusterformer-files.json"]  # never pushed
    assert check_hub_checkpoint(path) == []
    package = Path(hf_clusterformer.__file__).parent
    for name in CODE_FILES:
        assert (path / name).read_bytes() == (package / name).read_bytes()
    stdlib = set(sys.stdlib_module_names)
    assert hub_code_imports(path / "modeling_clusterformer.py") - stdlib == {"torch", "transformers"}
    assert hub_code_imports(path / "pipeline.py") - stdlib == {"torch", "transformers"}
    assert hub_code_imports(path / "configuration_clusterformer.py") - stdlib <= {"transformers", "huggingface_hub"}

    config = json.loads((path / "config.json").read_text())
    assert config["auto_map"] == hub_auto_map()
    assert (
        config["custom_pipelines"]["question-answering"]["impl"] == "pipeline.ClusterFormerQuestionAnsweringPipeline"
    )
    assert {k: config[k] for k in CONFIG_FIELDS} == {k: getattr(model.config, k) for k in CONFIG_FIELDS}
    assert not hasattr(model.config, "custom_pipelines")  # only the saved copy names the pipeline file
    tokenizer_config = json.loads((path / "tokenizer_config.json").read_text())
    assert tokenizer_config["model_max_length"] >= required_model_max_length(model.config)

    with safe_open(path / "model.safetensors", "pt") as weights:
        keys = set(weights.keys())
    for index in model.config.global_layers:
        router = f"roberta.encoder.layer.{index}.router"
        assert {f"{router}.centroids", f"{router}.fitted"} <= keys
    saved = load_file(path / "model.safetensors")
    for key, value in model.state_dict().items():
        assert torch.equal(saved[key], value), key
    assert "answerability.weight" in keys
    assert "Centroids | fitted by K-Means" in (path / "README.md").read_text()


def test_loads_from_a_directory_without_the_package(checkpoint, tmp_path):
    path, root, model, answers = checkpoint
    result = _load_without_package(path, path, root, OFFLINE, tmp_path / "home", offline=True)
    _check_loaded(result, model, answers)


@pytest.mark.skipif(shutil.which("git") is None, reason="the git command line tool is not installed")
def test_push_and_pull_through_the_hub_without_the_package(checkpoint, hub_server, tmp_path):
    path, root, model, answers = checkpoint
    pushing = run_with_endpoint(PUSH, hub_server.url, tmp_path / "push-home", args=[str(path)])
    pushed = json.loads(pushing.stdout.strip().splitlines()[-1])
    # model.push_to_hub + tokenizer.push_to_hub after prepare_for_hub: weights, config with auto_map, code, tokenizer
    assert {"config.json", "model.safetensors", "configuration_clusterformer.py", "modeling_clusterformer.py",
            "tokenizer.json", "tokenizer_config.json"} <= set(pushed["pushed"])
    assert sorted(p.name for p in path.iterdir() if not p.name.startswith(".")) == [
        f for f in pushed["full"] if f != ".gitattributes"]
    assert pushed["full_sha"] == pushed["commit"]
    assert not [f for f in pushed["pushed"] + pushed["full"] if f.endswith((".bin", ".pt", ".pth", ".pkl"))]

    result = _load_without_package(
        "user/cf-pushed", "user/cf-full", root, hub_server.url, tmp_path / "pull-home", offline=False
    )
    _check_loaded(result, model, answers)


def test_push_model_refuses_incomplete_or_pickled_checkpoints(checkpoint, tmp_path):
    path, _, _, _ = checkpoint
    broken = tmp_path / "broken"
    shutil.copytree(path, broken)
    (broken / "pytorch_model.bin").write_bytes(b"not allowed")
    config = json.loads((broken / "config.json").read_text())
    del config["auto_map"]["AutoModel"]
    (broken / "config.json").write_text(json.dumps(config))
    (broken / "pipeline.py").unlink()
    problems = check_hub_checkpoint(broken)
    assert any("pickle" in p for p in problems)
    assert any("auto_map['AutoModel']" in p for p in problems)
    assert any("pipeline.py is missing" in p for p in problems)
    with pytest.raises(ValueError, match="Refusing to push"):
        push_model(broken, "user/broken", endpoint=OFFLINE, token=TEST_TOKEN)  # fails before any request


def _roberta_source(tmp_path, tokenizer, head=True):
    config = RobertaConfig(
        vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
        max_position_embeddings=80, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
    )
    torch.manual_seed(1)
    model = (RobertaForQuestionAnswering(config) if head else RobertaModel(config, add_pooling_layer=False)).eval()
    source = tmp_path / ("roberta-qa" if head else "roberta")
    model.save_pretrained(source)
    tokenizer.save_pretrained(source)
    return model, source


def test_convert_roberta_qa_checkpoint_keeps_its_logits(tmp_path, tokenizer):
    roberta, source = _roberta_source(tmp_path, tokenizer)
    converted = convert_checkpoint(
        source, tmp_path / "converted", cluster_layers=[], window_size=48, window_stride=40, max_question_length=16,
        max_context_length=2048,
    )
    assert converted.newly_initialized == [] and converted.has_tokenizer
    assert check_hub_checkpoint(converted.path) == []
    model = ClusterFormerForQuestionAnswering.from_pretrained(converted.path).eval()
    encoding = tokenizer(QUESTION, SENTENCES[1], return_tensors="pt")
    assert encoding["input_ids"].shape[1] - (len(tokenizer(QUESTION)["input_ids"]) + 1) <= 48  # one window
    with torch.no_grad():
        ours, theirs = model(**encoding), roberta(**encoding)
    torch.testing.assert_close(ours.start_logits, theirs.start_logits, atol=1e-5, rtol=0)
    torch.testing.assert_close(ours.end_logits, theirs.end_logits, atol=1e-5, rtol=0)


def test_convert_sets_the_cluster_options_and_reports_new_heads(tmp_path, tokenizer):
    _, source = _roberta_source(tmp_path, tokenizer, head=False)
    converted = convert_checkpoint(
        source, tmp_path / "converted", cluster_layers=[1], num_clusters=4, window_size=32, window_stride=24,
        max_question_length=16, card_data={"model_id": "user/converted", "base_model": "FacebookAI/roberta-base"},
    )
    assert converted.newly_initialized == ["qa_outputs.bias", "qa_outputs.weight"]
    config = AutoConfig.from_pretrained(converted.path)
    layout = (config.model_type, config.global_layers, config.num_clusters, config.window_size, config.window_stride)
    assert layout == ("clusterformer", [1], 4, 32, 24)
    model = ClusterFormerForQuestionAnswering.from_pretrained(converted.path)
    assert not bool(model.cluster_routers()[1].fitted)
    card = (converted.path / "README.md").read_text()
    assert "base_model: FacebookAI/roberta-base" in card and "not fitted" in card

    with pytest.raises(ValueError, match="position embeddings"):
        convert_checkpoint(source, tmp_path / "too-wide", window_size=64, window_stride=48, max_question_length=16)
    gpt2 = tmp_path / "gpt2"
    GPT2Config(vocab_size=50, n_embd=16, n_layer=1, n_head=2).save_pretrained(gpt2)
    with pytest.raises(ValueError, match="'gpt2' checkpoint; convertible types are roberta, bert, clusterformer"):
        convert_checkpoint(gpt2, tmp_path / "from-gpt2")


def test_loading_a_roberta_checkpoint_extends_it_without_a_type_warning(tmp_path, tokenizer):
    _, source = _roberta_source(tmp_path, tokenizer, head=False)
    with transformers_warnings() as messages:
        model = ClusterFormerForQuestionAnswering.from_pretrained(
            source, cluster_layers=[1], window_size=32, window_stride=24, max_question_length=16
        )
    assert model.config.model_type == "clusterformer"
    assert not any("model of type" in message for message in messages), messages
