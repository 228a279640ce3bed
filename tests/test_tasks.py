"""Every head in the command line: ``clusterformer convert --task`` (the pipeline task names, mapped to
`convert_checkpoint`'s keys) keeps a source's head and refuses one the source lacks unless ``--allow-untrained``; a
Cluster-Former folder keeps its own head; ``clusterformer card`` writes each task's pipeline tag, widget and usage
snippets, which run as printed against the converted models, with the plugin and without it."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import main_error as _error
from helpers import one_line_error, run_command, tiny_config, tiny_roberta
from huggingface_hub import metadata_load
from remote_code_helpers import HIDE_PACKAGE
from transformers import (
    RobertaForMaskedLM,
    RobertaForMultipleChoice,
    RobertaForQuestionAnswering,
    RobertaForSequenceClassification,
    RobertaForTokenClassification,
    RobertaModel,
)

from hf_clusterformer import ClusterFormerModel, modeling_clusterformer
from hf_clusterformer.conversion import ConversionTaskError, convert_checkpoint
from hf_clusterformer.data.tokenizer import build_tokenizer
from hf_clusterformer.modelcard import default_widget, make_model_card
from hf_clusterformer_cli import build_parser, main
from hf_clusterformer_heads import HEADS, find_head, head_tasks

#: RoBERTa's class with each head, by pipeline task.
ROBERTA_HEADS = {
    "question-answering": RobertaForQuestionAnswering,
    "fill-mask": RobertaForMaskedLM,
    "text-classification": RobertaForSequenceClassification,
    "token-classification": RobertaForTokenClassification,
    "multiple-choice": RobertaForMultipleChoice,
}
SMALL = ["--cluster-layers", "1", "--num-clusters", "4", "--window-size", "32", "--window-stride", "24",
         "--max-question-length", "64"]
ENV = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1")


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("tasks")


@pytest.fixture(scope="module")
def tokenizer():
    """A tokenizer that knows the words of the cards' widget and snippets (so that their texts stay short)."""
    text = default_widget()[0]
    return build_tokenizer([text["context"], text["text"]] * 4, vocab_size=700)


def _roberta(tokenizer, path: Path, head) -> Path:
    labels = 3 if head in (RobertaForSequenceClassification, RobertaForTokenClassification) else 2
    return tiny_roberta(path, tokenizer, head, seed=len(str(path)), num_labels=labels)


@pytest.fixture(scope="module")
def sources(work, tokenizer) -> dict[str, Path]:
    """A tiny RoBERTa checkpoint with each head (by pipeline task), and a plain encoder (``None``)."""
    paths = {task: _roberta(tokenizer, work / f"roberta-{task}", head) for task, head in ROBERTA_HEADS.items()}
    paths[None] = _roberta(tokenizer, work / "roberta-plain", RobertaModel)
    return paths


@pytest.fixture(scope="module")
def converted(work, sources) -> dict[str, Path]:
    """``clusterformer convert SOURCE OUT --task TASK`` of each head's RoBERTa checkpoint."""
    paths = {}
    for task in head_tasks():
        paths[task] = work / f"cf-{task}"
        assert main(["convert", str(sources[task]), str(paths[task]), "--task", task, *SMALL]) == 0
    return paths


def _config(path: Path) -> dict:
    return json.loads((path / "config.json").read_text(encoding="utf-8"))


# -- convert --task ---------------------------------------------------------------------------------------------------


def test_task_names_are_pipeline_tasks_mapped_to_convert_checkpoint_keys():
    assert all(find_head(head.key) is head for head in HEADS)
    convert = build_parser(model_options=True)._subparsers._group_actions[0].choices["convert"]
    (task,) = [action for action in convert._actions if action.dest == "task"]
    # the pipeline tasks first, then the keys that differ from them (qa, mlm, ...): either name, as in Python
    keys = [h.key for h in HEADS if h.key not in head_tasks()]
    assert task.choices == [*head_tasks(), *keys] and task.default is None


def test_convert_keeps_each_sources_head(converted, sources, capsys):
    for task, folder in converted.items():
        model_class = getattr(modeling_clusterformer, find_head(task).class_name)
        assert _config(folder)["architectures"] == [model_class.__name__]
        assert "untrained_weights" not in _config(folder)  # the head came from the source: nothing new
        model = model_class.from_pretrained(folder)
        source = ROBERTA_HEADS[task].from_pretrained(sources[task]).state_dict()
        weights = model.state_dict()
        for name, tensor in source.items():
            if "position_ids" not in name:
                assert torch.equal(weights[name], tensor), (task, name)
    capsys.readouterr()
    # a Cluster-Former folder converted again keeps its head without --task (a masked-LM model stays one)
    again = converted["fill-mask"].parent / "cf-fill-mask-again"
    assert main(["convert", str(converted["fill-mask"]), str(again), "--num-clusters", "2"]) == 0
    assert capsys.readouterr().out.startswith(f"wrote {again}, a fill-mask model, from a clusterformer checkpoint")
    again_config = _config(again)
    assert again_config["architectures"] == ["ClusterFormerForMaskedLM"] and "untrained_weights" not in again_config
    # and the library does the same
    kept = convert_checkpoint(converted["multiple-choice"], again.parent / "mc-again")
    assert kept.task == "multiple-choice" and not kept.newly_initialized
    assert convert_checkpoint(sources["fill-mask"], again.parent / "by-name", task="fill-mask", cluster_layers=[],
                              window_size=32, window_stride=24, max_question_length=64).task == "mlm"


def test_a_head_the_source_lacks_is_refused_unless_allowed(converted, sources, work, capsys):
    plain, out = sources[None], work / "refused"
    _error(capsys, ["convert", str(plain), str(out), *SMALL],
           f"{plain} has no question-answering head: qa_outputs.bias, qa_outputs.weight would be new, untrained",
           "--allow-untrained")
    # Row: the console printed the model's "this head was drawn at random ... fine-tune it first" above the refusal
    one_line_error(run_command("convert", str(plain), str(out), *SMALL), "has no question-answering head")
    allowed = run_command("convert", str(plain), str(out), *SMALL, "--allow-untrained")
    assert allowed.returncode == 0 and allowed.stderr == "", allowed.stderr[-2000:]
    assert "newly initialised (train before use): qa_outputs.bias, qa_outputs.weight" in allowed.stdout
    shutil.rmtree(out)
    _error(capsys, ["convert", str(plain), str(out), *SMALL, "--task", "fill-mask"], "has no masked-LM head",
           "lm_head.", "--allow-untrained")
    # a RoBERTa masked-LM checkpoint: question answering by default, and the message names the head it has
    _error(capsys, ["convert", str(sources["fill-mask"]), str(out), *SMALL],
           "has no question-answering head", "its own head is masked-LM: --task fill-mask keeps it",
           "--allow-untrained")
    # a Cluster-Former masked-LM folder asked for another head
    _error(capsys, ["convert", str(converted["fill-mask"]), str(out), "--task", "text-classification"],
           "has no sequence-classification head", "classifier.out_proj.weight", "--task fill-mask keeps it")
    _error(capsys, ["convert", str(converted["fill-mask"]), str(out), "--task", "summarization"],
           "invalid choice: 'summarization'")
    assert not out.exists()

    allowed = work / "allowed"
    assert main(["convert", str(plain), str(allowed), *SMALL, "--task", "multiple-choice", "--allow-untrained"]) == 0
    printed = capsys.readouterr().out
    assert "a multiple-choice model" in printed and "newly initialised (train before use): classifier.bias" in printed
    assert _config(allowed)["untrained_weights"]["names"] == [
        "classifier.bias", "classifier.weight", "roberta.pooler.dense.bias", "roberta.pooler.dense.weight"]
    assert "| Multiple-choice head | newly initialised, never trained" in (allowed / "README.md").read_text("utf-8")
    # its head is still untrained: converting the folder again says so, and keeps it only when allowed
    _error(capsys, ["convert", str(allowed), str(out)], f"the multiple-choice head of {allowed}", "was never trained",
           "--allow-untrained")
    assert main(["convert", str(allowed), str(out), "--allow-untrained"]) == 0
    assert _config(out)["architectures"] == ["ClusterFormerForMultipleChoice"]

    with pytest.raises(ConversionTaskError, match=r"has no masked-LM head.*allow_untrained=True"):
        convert_checkpoint(plain, work / "library", task="mlm", allow_untrained=False, window_size=32,
                           window_stride=24, max_question_length=64)
    with pytest.raises(ValueError, match="task must be one of qa, mlm"):
        convert_checkpoint(plain, work / "library", task="summarization")
    assert not (work / "library").exists()


def test_a_base_model_folder_needs_a_task(work, tokenizer, capsys):
    folder = work / "cf-base"
    ClusterFormerModel(tiny_config(vocab_size=len(tokenizer))).save_pretrained(folder)
    _error(capsys, ["convert", str(folder), str(work / "base-out")], "holds a ClusterFormerModel, which has no head",
           "--task question-answering", "--task multiple-choice", "--allow-untrained")
    with pytest.raises(ConversionTaskError, match=r"task='qa'.*allow_untrained=True"):
        convert_checkpoint(folder, work / "base-out")
    assert main(["convert", str(folder), str(work / "base-out"), "--task", "token-classification",
                 "--allow-untrained"]) == 0
    assert _config(work / "base-out")["architectures"] == ["ClusterFormerForTokenClassification"]


def test_messages_that_say_to_convert_name_the_flags_the_source_needs(sources, work, capsys):
    (work / "context.txt").write_text("Zorvan lives in Tarsk.", encoding="utf-8")
    question = ["--question", "Where?", "--context-file", str(work / "context.txt")]
    _error(capsys, ["card", str(sources[None])], f"clusterformer convert {sources[None]} OUT --allow-untrained")
    _error(capsys, ["card", str(sources["fill-mask"])],
           f"clusterformer convert {sources['fill-mask']} OUT --task fill-mask")
    _error(capsys, ["push", str(sources["text-classification"]), "user/x"], "--task text-classification")
    _error(capsys, ["predict", str(sources["fill-mask"]), *question],
           f"clusterformer convert {sources['fill-mask']} OUT --allow-untrained`")


# -- cards ------------------------------------------------------------------------------------------------------------


def test_cards_carry_each_tasks_pipeline_tag_widget_and_snippets(converted, capsys):
    for task, folder in converted.items():
        assert main(["card", str(folder), "--model-id", f"user/{task}"]) == 0  # regenerates the card convert wrote
        card = (folder / "README.md").read_text(encoding="utf-8")
        metadata = metadata_load(folder / "README.md")
        assert metadata["pipeline_tag"] == task and task in metadata["tags"]
        widget = metadata.get("widget")
        blocks = re.findall(r"```python\n(.*?)```", card, flags=re.S)
        assert len(blocks) == 2 and "trust_remote_code=True" in blocks[1] and "trust_remote_code" not in blocks[0]
        if task == "question-answering":
            assert widget == default_widget() and "hf_clusterformer.pipeline(" in blocks[0]
            continue
        assert "question-answering" not in card and "hf_clusterformer.pipeline(" not in card and "Exact" not in card
        if task == "multiple-choice":
            assert widget is None and "AutoModelForMultipleChoice.from_pretrained" in blocks[1]
        else:
            assert widget == default_widget(task) and f'pipeline("{task}", model="user/{task}"' in blocks[0]
        if task == "fill-mask":
            assert widget[0]["text"].endswith("goes back to <mask> every spring.") and "<mask>" in blocks[0]


def test_make_model_card_takes_the_task_from_the_config_and_results_only_for_question_answering():
    config = tiny_config()
    assert make_model_card(config).data.pipeline_tag == "question-answering"
    config.architectures = ["ClusterFormerForTokenClassification"]
    assert make_model_card(config).data.pipeline_tag == "token-classification"
    card = make_model_card(tiny_config(), task="fill-mask", mask_token="[MASK]")
    assert "[MASK]" in card.data.widget[0]["text"] and "Not evaluated: no score has been recorded" in card.text
    with pytest.raises(ValueError, match="exact match / F1 of question answering"):
        make_model_card(config, results={"eval_exact_match": 50.0, "eval_f1": 60.0}, datasets=["rajpurkar/squad"])
    with pytest.raises(ValueError, match="task must be one of"):
        make_model_card(tiny_config(), task="summarization")


def test_card_of_a_classifier_leaves_its_runs_metrics_out(converted, capsys):
    folder = converted["text-classification"]
    (folder / "all_results.json").write_text(json.dumps({"eval_accuracy": 0.5, "eval_loss": 1.0}), encoding="utf-8")
    try:
        assert main(["card", str(folder)]) == 0
    finally:
        (folder / "all_results.json").unlink()
    assert "Not evaluated: no score has been recorded" in (folder / "README.md").read_text(encoding="utf-8")


RUN = """
import sys, json
for name, code in json.loads(sys.argv[1]).items():
    exec(compile(code, f"<{name} snippet>", "exec"), {"__name__": "__main__"})
    print(f"=== {name} ran", flush=True)
"""


def test_every_tasks_snippets_run_as_printed(converted):
    """Both snippets of each card, with the checkpoint's path for its Hub id: the plugin's in one process, the others
    in one where ``hf_clusterformer`` cannot be imported (and no prompt can be answered)."""
    plugin, remote = {}, {}
    for task, folder in converted.items():
        card = (folder / "README.md").read_text(encoding="utf-8")
        model_id = re.search(r'model="([^"]+)"|from_pretrained\("([^"]+)"', card)
        repo = next(group for group in model_id.groups() if group)
        plugin[task], remote[task] = (block.replace(f'"{repo}"', json.dumps(str(folder)))
                                      for block in re.findall(r"```python\n(.*?)```", card, flags=re.S))
    for prefix, snippets in (("", plugin), (HIDE_PACKAGE, remote)):
        result = subprocess.run([sys.executable, "-c", prefix + RUN, json.dumps(snippets)], capture_output=True,
                                text=True, env=ENV, stdin=subprocess.DEVNULL, timeout=300)
        assert result.returncode == 0, result.stderr[-3000:]
        assert [line for line in result.stdout.splitlines() if line.startswith("===")] == [
            f"=== {task} ran" for task in snippets]
        assert "'answer'" in result.stdout and "'sequence'" in result.stdout and "'label'" in result.stdout
        assert "'entity'" in result.stdout and re.search(r"^(Garlow|Harrow|Arden)$", result.stdout, flags=re.M)
