"""One writer of a model folder: every public way of saving a Cluster-Former model (``model.save_pretrained``,
`save_for_hub`, the pipeline's ``save_pretrained``, conversion, a training run's checkpoint and final save) goes
through `hf_clusterformer_model_folder.write_model_folder` and yields the same model files and the same
``auto_map`` and ``custom_pipelines`` for the same head."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from helpers import tiny_config
from transformers import RobertaConfig, RobertaForQuestionAnswering, TrainingArguments

import hf_clusterformer_model_folder
from hf_clusterformer import ClusterFormerForMaskedLM, ClusterFormerForQuestionAnswering, qa_training
from hf_clusterformer.conversion import convert_checkpoint
from hf_clusterformer.data.tokenizer import build_tokenizer
from hf_clusterformer.hub import hub_auto_map, save_for_hub
from hf_clusterformer.loading import pipeline
from hf_clusterformer_files import CODE_FILES, library_files
from hf_clusterformer_model_folder import CUSTOM_PIPELINE
from hf_clusterformer_writing import STAGING_PREFIX

#: The files that make a model folder (the tokenizer, card and a run's records aside).
MODEL_FILES = {"config.json", "model.safetensors", *CODE_FILES}


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
