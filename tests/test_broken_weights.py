"""Weights that cannot answer, and what a model lost or cut: NaN/inf, wrong-shaped or damaged weights and files are
refused in one line by every reader and writer; dropped or never-fitted centroids and contexts cut short are said."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from helpers import (
    CONTEXT,
    QUESTION,
    SENTENCES,
    SMALL,
    TINY_TRAIN,
    squad_jsonl,
    tiny_config,
    tiny_roberta,
)
from helpers import main_one_line as _one_line
from helpers import qa_file as _qa_file
from helpers import tiny_qa_model as _model
from helpers import tiny_train_args as _tiny_train
from safetensors.torch import load_file, save_file
from transformers import RobertaForQuestionAnswering

from hf_clusterformer import ClusterFormerForQuestionAnswering
from hf_clusterformer.hub import save_for_hub
from hf_clusterformer_cli import main


@pytest.fixture(scope="module")
def roberta(work, tokenizer) -> Path:
    """A plain tiny RoBERTa QA checkpoint with its tokenizer (what ``convert`` reads)."""
    return tiny_roberta(work / "roberta", tokenizer, RobertaForQuestionAnswering)


# -- NaN or inf weights: never trained on, saved, loaded, answered with or exported -----------------------------------


def test_a_diverging_training_run_stops_in_one_line_and_saves_nothing(work, capsys):
    """Row: ``train --learning_rate 1e8`` exited 0 and saved 39 NaN tensors (loss logged as 0.0)."""
    data = squad_jsonl(work / "train.jsonl", QUESTION, CONTEXT, "Tarsk", 4)
    out = work / "diverged"
    line = _one_line(capsys, ["train", "--train_file", str(data), "--output_dir", str(out), "--max_steps", "6",
                              "--learning_rate", "1e8", *TINY_TRAIN], "NaN or inf", "--learning_rate")
    assert "training stopped at step" in line
    assert not out.exists() or not any(out.iterdir())

def test_nan_weights_are_refused_by_loading_predict_and_export(work, roberta, capsys):
    """Row: NaN tensors in a hand-corrupted weights file were not noticed (predict answered with score 1.0)."""
    folder = work / "corrupted"
    assert main(["convert", str(roberta), str(folder), *SMALL]) == 0
    tensors = load_file(folder / "model.safetensors")
    name = next(k for k in tensors if k.endswith("qa_outputs.weight"))
    tensors[name][0, 0] = float("nan")
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError, match="NaN or inf"):
        ClusterFormerForQuestionAnswering.from_pretrained(folder)
    (work / "context.txt").write_text(CONTEXT, encoding="utf-8")
    _one_line(capsys, ["predict", str(folder), "--question", QUESTION, "--context-file", str(work / "context.txt")],
              "NaN or inf", str(folder))
    _one_line(capsys, ["export", str(folder), str(work / "corrupted.pt2")], "NaN or inf")
    assert not (work / "corrupted.pt2").exists()

def test_a_pipeline_of_another_head_and_nan_weights_are_one_line(work, roberta, tokenizer):
    """Rows: a fill-mask pipeline on a QA model folder ran a randomly initialised head; a model object with NaN
    weights handed to a pipeline answered."""
    import hf_clusterformer
    from hf_clusterformer import ClusterFormerForSequenceClassification

    folder = work / "qa-for-pipelines"
    assert main(["convert", str(roberta), str(folder), *SMALL]) == 0
    with pytest.raises(ValueError, match=r"holds a question-answering model \(ClusterFormerForQuestionAnswering\), "
                                         r"not a fill-mask one.*task='question-answering'"):
        hf_clusterformer.pipeline(model=str(folder), task="fill-mask")
    for task, head in (("question-answering", ClusterFormerForQuestionAnswering),
                       ("text-classification", ClusterFormerForSequenceClassification)):
        model = head(tiny_config(vocab_size=len(tokenizer), window_size=32, window_stride=24, max_question_length=16))
        with torch.no_grad():
            next(model.parameters()).view(-1)[0] = float("nan")
        with pytest.raises(ValueError, match=f"this {head.__name__} holds weights that are NaN or inf"):
            hf_clusterformer.pipeline(model=model, tokenizer=tokenizer, task=task)

def test_weights_that_turn_nan_in_a_session_are_refused_by_every_reader_and_writer(work, roberta, tokenizer, capsys,
                                                                                  tmp_path):
    """Row: weights that became NaN after the pipeline was built (a diverged run in the same session) still answered
    with score 1.0; ``save_for_hub``, ``save_pretrained`` and ``card`` wrote such a model silently."""
    import shutil

    import hf_clusterformer
    from hf_clusterformer import ClusterFormerForSequenceClassification

    folder = work / "turns-nan"
    assert main(["convert", str(roberta), str(folder), *SMALL]) == 0
    model = ClusterFormerForQuestionAnswering.from_pretrained(folder)
    qa = hf_clusterformer.pipeline(model=model, tokenizer=tokenizer)
    assert qa(question=QUESTION, context=CONTEXT)["score"] < 1
    classifier = ClusterFormerForSequenceClassification(tiny_config(vocab_size=len(tokenizer), window_size=32,
                                                                    window_stride=24, max_question_length=16))
    classify = hf_clusterformer.pipeline(model=classifier, tokenizer=tokenizer, task="text-classification",
                                         allow_untrained=True)
    classify(CONTEXT)
    with torch.no_grad():
        model.qa_outputs.weight[0, 0] = float("nan")
        classifier.classifier.out_proj.weight[0, 0] = float("inf")
    with pytest.raises(ValueError, match=r"ClusterFormerForQuestionAnswering holds weights that are NaN or inf.*"
                                         r"qa_outputs\.weight"):
        qa(question=QUESTION, context=CONTEXT)
    with pytest.raises(ValueError, match="NaN or inf"):
        classify(CONTEXT)
    for write in (lambda out: save_for_hub(model, tokenizer, out), model.save_pretrained):
        with pytest.raises(ValueError, match="nothing was written to .*NaN or inf"):
            write(tmp_path / "out")
        assert not (tmp_path / "out").exists()
    broken = tmp_path / "broken"  # a folder whose weights file holds NaN (written before these checks, or by hand)
    shutil.copytree(folder, broken)
    tensors = load_file(broken / "model.safetensors")
    tensors["qa_outputs.weight"][0, 0] = float("nan")
    save_file(tensors, broken / "model.safetensors", metadata={"format": "pt"})
    card = (broken / "README.md").read_bytes()
    _one_line(capsys, ["card", str(broken), "--overwrite"], str(broken), "NaN or inf", "a card")
    _one_line(capsys, ["push", str(broken), "user/broken"], "NaN or inf", "a push")
    assert (broken / "README.md").read_bytes() == card


# -- damaged files and wrong shapes: one line naming the input and the fix --------------------------------------------


def test_damaged_inputs_and_unclear_cases_are_one_line(work, roberta, capsys, tmp_path):
    """Rows: a truncated model.safetensors in convert / export / card, a truncated .pt2, ``convert SRC SRC``, a
    user's non-model config.json called "a model", a card whose config is not JSON."""
    from hf_clusterformer.export import ExportError, load_exported

    damaged = tmp_path / "damaged"
    assert main(["convert", str(roberta), str(damaged), *SMALL]) == 0
    weights = damaged / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:200])
    _one_line(capsys, ["convert", str(damaged), str(tmp_path / "out"), *SMALL], "model.safetensors")
    _one_line(capsys, ["export", str(damaged), str(tmp_path / "out.pt2")], str(damaged))
    _one_line(capsys, ["card", str(damaged), "--overwrite"], str(damaged / "model.safetensors"),
              "save or download the checkpoint again")
    (tmp_path / "bad.pt2").write_bytes(b"PK\x03\x04" + b"\0" * 50)
    with pytest.raises(ExportError, match="bad.pt2 is not a torch.export program"):
        load_exported(tmp_path / "bad.pt2")
    _one_line(capsys, ["convert", str(roberta), str(roberta), *SMALL], "is the source folder")
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "config.json").write_text('{"lr": 1}', encoding="utf-8")
    _one_line(capsys, ["convert", str(roberta), str(mine), *SMALL], "not a model's")
    (tmp_path / "broken.json").write_text("{", encoding="utf-8")
    _one_line(capsys, ["card", "--config", str(tmp_path / "broken.json"), "--out", str(tmp_path / "c.md")],
              "broken.json")

def test_a_wrong_shaped_centroid_tensor_in_predict_is_one_line(work, roberta, capsys):
    """Row: ``predict`` on a folder whose centroids have another width than its config printed transformers'
    size-mismatch traceback."""
    folder = work / "wrong-centroids"
    assert main(["convert", str(roberta), str(folder), *SMALL]) == 0
    tensors = load_file(folder / "model.safetensors")
    name = next(k for k in tensors if k.endswith("router.centroids"))
    tensors[name] = tensors[name][:, :16].contiguous()
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    (work / "context.txt").write_text(CONTEXT, encoding="utf-8")
    _one_line(capsys, ["predict", str(folder), "--question", QUESTION, "--context-file", str(work / "context.txt")],
              str(folder), f"{name} is (4, 16), its config gives (4, 32)", "write the checkpoint again")


# -- centroids dropped or never fitted are said -----------------------------------------------------------------------


def test_dropped_and_never_fitted_centroids_are_said(work, roberta, tokenizer, caplog, tmp_path):
    """Rows: re-converting a trained model with another --num-clusters dropped its fitted centroids silently;
    export and the exported runner said nothing of never-fitted centroids."""
    import logging

    from hf_clusterformer.conversion import convert_checkpoint
    from hf_clusterformer.export import export_model, load_exported

    model = ClusterFormerForQuestionAnswering(tiny_config(vocab_size=len(tokenizer), window_size=32, window_stride=24,
                                                          max_question_length=16, cluster_layers=[1])).eval()
    model.cluster_routers()[1].fitted.fill_(True)
    fitted = save_for_hub(model, tokenizer, tmp_path / "fitted")
    with caplog.at_level(logging.WARNING):
        converted = convert_checkpoint(fitted, tmp_path / "refit", num_clusters=4)
    assert converted.dropped_centroids == [1] and "cluster layers [1]" in caplog.text and "dropped" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        out = export_model(tmp_path / "refit", tmp_path / "refit.pt2")
        assert "never fitted" in caplog.text
        caplog.clear()
        load_exported(out)
    assert "cluster layers [1]" in caplog.text and "never fitted" in caplog.text

def test_training_that_never_fits_the_centroids_says_how_to_fit_them(tmp_path, caplog):
    """Row: ``train --num_clusters 5000`` on small data ended with centroids never fitted, and a warning telling the
    user to train with CentroidUpdateCallback (which the run had done)."""
    data = _qa_file(tmp_path / "train.jsonl", 1)
    with caplog.at_level("WARNING"):
        assert main([*_tiny_train(data), "--num_clusters", "5000", "--max_steps", "2", "--output_dir",
                     str(tmp_path / "out"), "--do_eval", "True", "--validation_file", str(data)]) == 0
    lines = [r.getMessage() for r in caplog.records if r.levelname == "WARNING" and "fitted" in r.getMessage()]
    assert len(lines) == 1 and "\n" not in lines[0], lines
    banked = int(re.search(r"and (\d+) were banked", lines[0])[1])
    for fragment in ("cluster layer 1 never fitted", "waits for 100000 banked states", "num_clusters=5000",
                     f"num_clusters={banked // 32} or fewer", f"min_states={banked}", "more data"):
        assert fragment in lines[0], lines[0]
    assert 0 < banked < 5000 and "Trainer" not in lines[0]

def test_centroid_updater_on_a_model_in_eval_mode_says_why_nothing_happens(tokenizer):
    """Row: ``CentroidUpdater`` on a model in ``eval()`` banked nothing and ``update()`` returned None silently."""
    from hf_clusterformer.centroid_updates import CentroidUpdater

    model = _model(tokenizer, num_clusters=2)  # in eval mode
    updater = CentroidUpdater(model, min_states=2)
    encoded = tokenizer(QUESTION, CONTEXT, return_tensors="pt")
    with torch.no_grad():
        model(**encoded)
    for call in (updater.update, updater.step):
        with pytest.raises(RuntimeError, match=r"banked no states: the model is in eval mode.*call model\.train\(\)"):
            call()
    model.train()
    with torch.no_grad():
        model(**encoded)
    assert updater.update() is not None and updater.fitted


# -- no silent truncation: the model's limit, and a cut said ----------------------------------------------------------


def test_evaluate_reads_to_the_models_limit_and_says_when_it_cuts(work, roberta, caplog):
    """Row: ``evaluate`` cut a 22,438-token example to 16,384 tokens (its default) with no word."""
    import logging

    from hf_clusterformer.configuration_clusterformer import ClusterFormerConfig

    model = work / "evaluated"
    assert main(["convert", str(roberta), str(model), *SMALL]) == 0
    limit = ClusterFormerConfig.from_pretrained(model).max_input_length
    data = squad_jsonl(work / "dev.jsonl", QUESTION, CONTEXT, "Tarsk", 2)
    base = ["evaluate", "--model_name_or_path", str(model), "--validation_file", str(data), "--allow_untrained",
            "--report_to", "none", "--use_cpu", "--disable_tqdm", "true"]
    assert main([*base, "--output_dir", str(work / "eval-default")]) == 0
    results = json.loads((work / "eval-default" / "all_results.json").read_text(encoding="utf-8"))
    assert results["data"]["max_seq_length"] == limit and results["metrics"]["eval_contexts_truncated"] == 0
    with caplog.at_level(logging.WARNING):
        assert main([*base, "--output_dir", str(work / "eval-cut"), "--max_seq_length", "40"]) == 0
    assert f"2 of 2 validation contexts were cut at 40 tokens (--max_seq_length; the model reads up to {limit})" \
        in caplog.text

def test_pipelines_of_every_head_read_to_the_models_limit_and_never_cut(tokenizer):
    """Row: a token-classification pipeline labelled 510 of 11,199 tokens, with no word, when the tokenizer kept
    RoBERTa's ``model_max_length=512``."""
    import copy

    import hf_clusterformer
    from hf_clusterformer import ClusterFormerForTokenClassification

    model = ClusterFormerForTokenClassification(tiny_config(
        vocab_size=len(tokenizer), window_size=64, window_stride=56, max_position_embeddings=80, num_clusters=32,
        max_context_length=2048, id2label={0: "PLACE", 1: "OTHER"})).eval()
    roberta_like = copy.deepcopy(tokenizer)
    roberta_like.model_max_length = 512
    tag = hf_clusterformer.pipeline(model=model, tokenizer=roberta_like, task="token-classification", device="cpu")
    assert tag.tokenizer.model_max_length == model.config.max_input_length
    text = " ".join(SENTENCES[i % 2] for i in range(70))
    length = len(tokenizer(text)["input_ids"])
    assert 512 < length <= 2048
    assert len(tag(text, ignore_labels=[])) == length - 2  # every token but <s> and </s>
    longer = " ".join(SENTENCES[i % 2] for i in range(200))
    count = len(tokenizer(longer)["input_ids"])
    with pytest.raises(ValueError, match=f"the text has {count} tokens, more than this model reads "
                                         f"\\({model.config.max_input_length}\\)"):
        tag(longer)
