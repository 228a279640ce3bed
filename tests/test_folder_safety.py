"""Nothing a user made is lost: every writer writes into the output folder as it is (a symlinked folder's target, its
mode, owner and other files kept, each file put in place by its own rename), replaces only the library's own files
without ``--overwrite``, removes with it only the library's own files and Trainer checkpoints, and an interrupted
write says what the folder holds. Broken (NaN) weights are never saved, loaded or exported."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from helpers import (
    CHILD_ENV,
    CONTEXT,
    QUESTION,
    SENTENCES,
    SMALL,
    sentence_tokenizer,
    squad_jsonl,
    tiny_config,
    tiny_roberta,
)
from safetensors.torch import load_file, save_file
from transformers import RobertaConfig, RobertaForQuestionAnswering

from hf_clusterformer import ClusterFormerForQuestionAnswering
from hf_clusterformer.hub import save_for_hub
from hf_clusterformer_cli import main
from hf_clusterformer_files import OWN_FILES_RECORD, ModelFolderExistsError, library_files
from hf_clusterformer_writing import WriteInterrupted, writing_model_dir

TINY_TRAIN = [
    "--hidden_size", "32", "--num_hidden_layers", "2", "--num_attention_heads", "2", "--intermediate_size", "64",
    "--window_size", "32", "--window_stride", "24", "--max_question_length", "16", "--cluster_layers", "1",
    "--num_clusters", "4", "--vocab_size", "300", "--per_device_train_batch_size", "2", "--report_to", "none",
    "--use_cpu", "--seed", "0", "--save_strategy", "no", "--disable_tqdm", "true",
]


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("folders")


@pytest.fixture(scope="module")
def tokenizer():
    return sentence_tokenizer()


@pytest.fixture(scope="module")
def roberta(work, tokenizer) -> Path:
    """A plain tiny RoBERTa QA checkpoint with its tokenizer (what ``convert`` reads)."""
    return tiny_roberta(work / "roberta", tokenizer, RobertaForQuestionAnswering)


def _snapshot(folder: Path) -> dict[str, bytes | str]:
    """Every file's bytes (a symlink: its target) under ``folder``, by relative name."""
    return {p.relative_to(folder).as_posix(): (f"-> {os.readlink(p)}" if p.is_symlink() else p.read_bytes())
            for p in sorted(folder.rglob("*")) if p.is_symlink() or p.is_file()}


def _one_line(capsys, argv: list[str], *fragments: str, status: int = 2) -> str:
    capsys.readouterr()
    assert main(argv) == status
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("clusterformer: "), lines
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


# -- 1. write into the folder as it is --------------------------------------------------------------------------------


def test_convert_into_a_symlinked_folder_writes_into_its_target(work, roberta, capsys):
    """Row: ``convert SRC link`` turned ``link`` into a folder and moved the user's notes out of its target."""
    real, link = work / "real", work / "link"
    real.mkdir()
    (real / "notes.txt").write_text("mine", encoding="utf-8")
    os.chmod(real, 0o700)
    link.symlink_to(real)
    assert main(["convert", str(roberta), str(link), *SMALL]) == 0
    assert link.is_symlink() and os.readlink(link) == str(real)
    assert (real / "notes.txt").read_text(encoding="utf-8") == "mine"
    assert (real / "config.json").is_file() and stat.S_IMODE(real.stat().st_mode) == 0o700
    assert [p.name for p in work.iterdir() if p.name.startswith(".")] == []
    before = (real / "model.safetensors").read_bytes()
    assert main(["convert", str(roberta), str(link), *SMALL, "--num-clusters", "8", "--overwrite"]) == 0
    assert link.is_symlink() and (real / "notes.txt").read_text(encoding="utf-8") == "mine"
    assert json.loads((real / "config.json").read_text(encoding="utf-8"))["num_clusters"] == 8
    assert (real / "model.safetensors").read_bytes() != before


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a folder to another owner needs root")
def test_convert_keeps_the_folders_mode_owner_and_group(work, roberta):
    """Row: ``convert`` into an existing folder turned ``nobody:nogroup 2750`` into ``root:root 0755`` (and 0700,
    0555 into 0755)."""
    for mode in (0o2750, 0o700, 0o555):
        folder = work / f"owned-{mode:o}"
        folder.mkdir()
        os.chown(folder, 65534, 65534)
        os.chmod(folder, mode)
        assert main(["convert", str(roberta), str(folder), *SMALL]) == 0
        status = folder.stat()
        assert (stat.S_IMODE(status.st_mode), status.st_uid, status.st_gid) == (mode, 65534, 65534)
        assert (folder / "config.json").stat().st_gid == (65534 if mode & stat.S_ISGID else 0)


def test_save_for_hub_into_a_link_and_a_symlinked_file(tmp_path, tokenizer):
    """Rows: ``save_for_hub`` into a link replaced it by a folder; a symlinked model file was written through."""
    model = ClusterFormerForQuestionAnswering(tiny_config(vocab_size=len(tokenizer), window_size=32, window_stride=24,
                                                          max_question_length=16)).eval()
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "outside.json").write_text("keep", encoding="utf-8")
    (real / "tokenizer_config.json").symlink_to(tmp_path / "outside.json")
    (tmp_path / "link").symlink_to(real)
    with pytest.raises(ModelFolderExistsError, match="tokenizer_config.json.*symlink"):
        save_for_hub(model, tokenizer, tmp_path / "link")
    assert sorted(os.listdir(real)) == ["tokenizer_config.json"]
    save_for_hub(model, tokenizer, tmp_path / "link", overwrite=True)
    assert (tmp_path / "link").is_symlink() and not (real / "tokenizer_config.json").is_symlink()
    assert (tmp_path / "outside.json").read_text(encoding="utf-8") == "keep"
    assert {"config.json", "model.safetensors", "README.md"} <= set(library_files(real))


def test_card_overwrite_replaces_a_symlinked_readme_never_its_target(work, roberta, capsys):
    """Row: ``card --overwrite`` wrote through a README.md symlink onto a file outside the model folder."""
    folder = work / "card-link"
    assert main(["convert", str(roberta), str(folder), *SMALL]) == 0
    outside = work / "elsewhere.md"
    outside.write_text("not a card", encoding="utf-8")
    (folder / "README.md").unlink()
    (folder / "README.md").symlink_to(outside)
    _one_line(capsys, ["card", str(folder)], "README.md")
    assert main(["card", str(folder), "--overwrite"]) == 0
    assert not (folder / "README.md").is_symlink() and outside.read_text(encoding="utf-8") == "not a card"


def test_an_interrupted_write_leaves_the_folder_as_it_was_and_says_so(tmp_path):
    """Ctrl-C while a model is written: the old files stay and the interruption says so (exit 130 from the
    command); the staging folder goes."""
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text('{"old": 1}', encoding="utf-8")
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a command (a test worker ignores it)
    try:
        with pytest.raises(WriteInterrupted, match="left as it was"):
            with writing_model_dir(folder, overwrite=True) as staging:
                (staging / "config.json").write_text("{}", encoding="utf-8")
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(5)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert sorted(os.listdir(folder)) == ["config.json"]
    assert (folder / "config.json").read_text(encoding="utf-8") == '{"old": 1}'


def test_a_killed_write_is_cleaned_up_by_the_next_one_and_said(tmp_path, capsys):
    """Row: a SIGKILL left a hidden staging folder nothing mentioned."""
    folder = tmp_path / "model"
    (folder / ".clusterformer-write-abc").mkdir(parents=True)
    with writing_model_dir(folder) as staging:
        (staging / "config.json").write_text("{}", encoding="utf-8")
    assert sorted(os.listdir(folder)) == [OWN_FILES_RECORD, "config.json"]
    assert ".clusterformer-write-abc" in capsys.readouterr().err


# -- 2. only the library's own files are replaced ---------------------------------------------------------------------


@pytest.mark.parametrize("name", ["pipeline.py", "tokenizer_config.json", "modeling_clusterformer.py"])
def test_a_users_file_with_a_model_files_name_is_refused_without_overwrite(work, roberta, capsys, name):
    """Row: convert replaced the user's own ``pipeline.py`` (and tokenizer_config.json, ...) with exit 0."""
    folder = work / f"users-{name}"
    folder.mkdir()
    (folder / name).write_text("mine", encoding="utf-8")
    before = _snapshot(folder)
    _one_line(capsys, ["convert", str(roberta), str(folder), *SMALL], name, "--overwrite")
    assert _snapshot(folder) == before
    assert main(["convert", str(roberta), str(folder), *SMALL, "--overwrite"]) == 0
    assert (folder / name).read_text(encoding="utf-8") != "mine"


def test_save_pretrained_keeps_the_users_code_files_unless_overwrite(tmp_path, tokenizer):
    """Row: ``model.save_pretrained(DIR)`` replaced the user's own ``modeling_clusterformer.py``,
    ``configuration_clusterformer.py`` and ``pipeline.py`` without a word; a folder it wrote itself is saved into
    again, and ``overwrite=True`` replaces the user's files."""
    model = ClusterFormerForQuestionAnswering(tiny_config(vocab_size=len(tokenizer), window_size=32, window_stride=24,
                                                          max_question_length=16))
    folder = tmp_path / "mine"
    folder.mkdir()
    names = ("modeling_clusterformer.py", "configuration_clusterformer.py", "pipeline.py")
    for name in (*names, "notes.txt"):
        (folder / name).write_text(f"# my {name}\n", encoding="utf-8")
    before = _snapshot(folder)
    with pytest.raises(ModelFolderExistsError, match=r"modeling_clusterformer\.py.* is yours.*overwrite=True"):
        model.save_pretrained(folder)
    assert _snapshot(folder) == before
    model.save_pretrained(tmp_path / "fresh")
    model.save_pretrained(tmp_path / "fresh")  # its own files, recorded: saved into again
    assert set(names) <= set(library_files(tmp_path / "fresh"))
    model.save_pretrained(folder, overwrite=True)
    assert all((folder / name).read_text(encoding="utf-8") != f"# my {name}\n" for name in names)
    assert (folder / "notes.txt").read_text(encoding="utf-8") == "# my notes.txt\n"
    ClusterFormerForQuestionAnswering.from_pretrained(folder)


def test_a_stray_tokenizer_file_of_the_users_is_never_left_beside_a_new_tokenizer(work, roberta, tokenizer, capsys):
    """Row: ``convert`` into a folder holding a stray ``added_tokens.json`` of the user's wrote a model whose tokenizer
    could not load, and ``predict`` then showed a 25-line TypeError traceback."""
    import hf_clusterformer

    folder = work / "stray-added-tokens"
    folder.mkdir()
    stray = '{"<extra>": "x"}\n'
    (folder / "added_tokens.json").write_text(stray, encoding="utf-8")
    before = _snapshot(folder)
    _one_line(capsys, ["convert", str(roberta), str(folder), *SMALL], "added_tokens.json", "tokenizer", "--overwrite")
    assert _snapshot(folder) == before
    assert main(["convert", str(roberta), str(folder), *SMALL, "--overwrite"]) == 0
    assert "kept your" in capsys.readouterr().err
    assert (folder / "added_tokens.json.yours").read_text(encoding="utf-8") == stray  # kept, but not read
    assert not (folder / "added_tokens.json").exists()
    context = work / "stray-context.txt"
    context.write_text(CONTEXT, encoding="utf-8")
    predict = ["predict", str(folder), "--question", QUESTION, "--context-file", str(context)]
    assert main(predict) == 0
    # a stray put there afterwards: predict and the pipeline say so in one line
    (folder / "added_tokens.json").write_text(stray, encoding="utf-8")
    _one_line(capsys, predict, f"the tokenizer of {folder} does not load", "added_tokens.json", "not the model's own")
    with pytest.raises(ValueError, match="does not load.*added_tokens.json"):
        hf_clusterformer.pipeline(model=str(folder))
    # converting from it: refused, rather than a model written without its tokenizer
    _one_line(capsys, ["convert", str(folder), str(work / "from-stray")], "does not load", "added_tokens.json")
    assert not (work / "from-stray").exists()
    # the Python writers: save_for_hub, and the pipeline's save_pretrained (into a folder as it is)
    model = ClusterFormerForQuestionAnswering.from_pretrained(folder, max_context_length=4096)
    for name, write in (("hub", lambda out, **kw: save_for_hub(model, tokenizer, out, **kw)),
                        ("pipeline", lambda out, **kw: hf_clusterformer.pipeline(
                            model=model, tokenizer=tokenizer).save_pretrained(out, **kw))):
        out = work / f"stray-special-{name}"
        out.mkdir()
        (out / "special_tokens_map.json").write_text('{"mask_token": "<m>"}', encoding="utf-8")
        with pytest.raises(ModelFolderExistsError, match="special_tokens_map.json is yours.*overwrite=True"):
            write(out)
        assert sorted(p.name for p in out.iterdir()) == ["special_tokens_map.json"]
        write(out, overwrite=True)
        assert (out / "special_tokens_map.json.yours").is_file() and not (out / "special_tokens_map.json").exists()
        hf_clusterformer.pipeline(model=str(out))


def test_a_converted_folder_is_what_it_was_plus_the_models_files(work, roberta):
    folder = work / "plus-only"
    (folder / "logs").mkdir(parents=True)
    (folder / "logs" / "a.log").write_text("log", encoding="utf-8")
    (folder / "notes.txt").write_text("mine", encoding="utf-8")
    before = _snapshot(folder)
    assert main(["convert", str(roberta), str(folder), *SMALL]) == 0
    after = _snapshot(folder)
    assert {k: v for k, v in after.items() if k in before} == before
    assert set(after) - set(before) == set(library_files(folder)) | {OWN_FILES_RECORD}


# -- 3. no answer from broken weights --------------------------------------------------------------------------------


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


# -- 4. no silent truncation ----------------------------------------------------------------------------------------


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


# -- 6. centroids -----------------------------------------------------------------------------------------------------


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


# -- 7. one line naming the input and the fix -------------------------------------------------------------------------


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


def test_ctrl_c_of_a_training_run_is_one_line_and_keeps_its_checkpoints(work, tmp_path):
    """Rows: a SIGINT during ``train --overwrite`` deleted the checkpoints the run had saved (and printed a
    KeyboardInterrupt traceback); the old model stays."""
    out = tmp_path / "run"
    out.mkdir()
    (out / "config.json").write_text('{"model_type": "clusterformer"}', encoding="utf-8")
    data = squad_jsonl(tmp_path / "train.jsonl", QUESTION, CONTEXT, "Tarsk", 4)
    args = [a for a in TINY_TRAIN if a not in ("--save_strategy", "no")]
    log = tmp_path / "train.err"  # a file, not a pipe: a full pipe would stall the run, and reading it never end
    with open(log, "w", encoding="utf-8") as err:
        process = subprocess.Popen(
            [sys.executable, "-m", "hf_clusterformer_cli", "train", "--train_file", str(data), "--output_dir",
             str(out), "--overwrite", "--max_steps", "100000", "--save_steps", "1", "--save_total_limit", "2", *args],
            stdout=subprocess.DEVNULL, stderr=err, text=True, env=CHILD_ENV, stdin=subprocess.DEVNULL,
            # a test worker's ignored SIGINT is inherited
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.time() + 240
        # any saved checkpoint past the first (checkpoint-2 is rotated away once checkpoint-4 is saved)
        while not [p for p in out.glob(".clusterformer-write-*/checkpoint-*/trainer_state.json")
                   if p.parent.name != "checkpoint-1"]:
            if process.poll() is not None or time.time() > deadline:
                process.kill()
                process.wait()
                pytest.fail(f"no second checkpoint in 240 s (exit code {process.returncode}):\n"
                            + log.read_text(encoding="utf-8")[-3000:])
            time.sleep(0.2)
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=120) == 130
    finally:
        process.kill()
        process.wait()
    lines = [line for line in log.read_text(encoding="utf-8").strip().splitlines() if line.strip()]
    assert lines[-1].startswith("clusterformer: interrupted: ") and "left as it was" in lines[-1], lines[-5:]
    assert not any("Traceback" in line for line in lines), lines
    assert (out / "config.json").read_text(encoding="utf-8") == '{"model_type": "clusterformer"}'
    assert [p for p in out.glob("checkpoint-*") if (p / "trainer_state.json").is_file()]
    assert not list(out.glob(".clusterformer-write-*"))


def test_ctrl_c_after_the_command_said_wrote_ends_it_with_status_0(work, roberta, tmp_path):
    """Row: a SIGINT after ``convert`` printed "wrote DIR" exited 130, saying "nothing was written", although the
    complete model was on disk."""
    out = tmp_path / "converted"
    process = subprocess.Popen(
        [sys.executable, "-m", "hf_clusterformer_cli", "convert", str(roberta), str(out), *SMALL],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=CHILD_ENV, stdin=subprocess.DEVNULL,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        said = process.stdout.readline()
        assert said.startswith(f"wrote {out}, "), said
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=120)
    finally:
        process.kill()
        process.wait()
    assert process.returncode == 0, err[-2000:]
    assert err.strip() in ("", f"clusterformer: interrupted after {out} was written in full"), err[-2000:]
    ClusterFormerForQuestionAnswering.from_pretrained(out)


# -- 8. pipelines of every head: the model's limit, never a silent cut, the folder's own head, finite weights ---------


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


def test_converting_another_tasks_head_names_it_and_the_fix(work, tokenizer, capsys):
    """Row: a token-classification checkpoint converted with ``--task multiple-choice`` was said to hold "tensors of
    other shapes than its config"."""
    from transformers import RobertaForTokenClassification

    config = RobertaConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                           intermediate_size=64, max_position_embeddings=514, type_vocab_size=1, pad_token_id=1,
                           bos_token_id=0, eos_token_id=2, num_labels=3)
    source = work / "token-roberta"
    RobertaForTokenClassification(config).save_pretrained(source)
    tokenizer.save_pretrained(source)
    line = _one_line(capsys, ["convert", str(source), str(work / "mc"), *SMALL, "--task", "multiple-choice"],
                     f"{source} has no multiple-choice head", "classifier.weight",
                     "its own head is token-classification: --task token-classification keeps it", "--allow-untrained")
    assert "other shapes" not in line
    assert main(["convert", str(source), str(work / "mc"), *SMALL, "--task", "multiple-choice",
                 "--allow-untrained"]) == 0


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


def test_squad_answers_whose_text_is_a_string_are_one_line(work, capsys):
    """Row: records with ``answers.text`` a string, not a list, gave an unclear line (or a traceback)."""
    start = CONTEXT.index("Tarsk")
    rows = [{"id": str(i), "title": "t", "question": QUESTION, "context": CONTEXT,
             "answers": {"text": "Tarsk", "answer_start": [start]}} for i in range(2)]
    data = work / "string-answers.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    _one_line(capsys, ["train", "--train_file", str(data), "--output_dir", str(work / "string-run"), "--max_steps",
                       "1", *TINY_TRAIN],
              str(data), "must hold lists", "{'text': ['answer'], 'answer_start': [offset]}")
