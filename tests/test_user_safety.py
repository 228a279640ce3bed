"""Nothing a user made is lost, no silent answers from weights that were never trained, and saved folders that load
without this package: output folders, untrained-head records, BERT-family checkpoints, the code files of every save,
the pipeline task, the card's own snippets, card regeneration, evaluation records and small input errors.
"""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import sys
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
from remote_code_helpers import HIDE_PACKAGE
from safetensors.torch import load_file
from transformers import BertConfig, BertForQuestionAnswering, BertTokenizerFast

import hf_clusterformer
from hf_clusterformer import ClusterFormerForQuestionAnswering
from hf_clusterformer.data.tokenizer import build_tokenizer
from hf_clusterformer.hub import ModelFolderExistsError, save_for_hub
from hf_clusterformer.modeling_clusterformer import UntrainedModelError, untrained_weights
from hf_clusterformer.pipeline import ClusterFormerQuestionAnsweringPipeline
from hf_clusterformer_cli import main


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("safety")
    (path / "context.txt").write_text(CONTEXT, encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def tokenizer():
    return sentence_tokenizer()


@pytest.fixture(scope="module")
def roberta(work, tokenizer) -> Path:
    """A plain tiny RoBERTa encoder (no QA head) with its tokenizer."""
    return tiny_roberta(work / "roberta", tokenizer)


@pytest.fixture(scope="module")
def converted(work, roberta) -> Path:
    """``clusterformer convert`` of the plain encoder: its QA head is new (allowed, for fine-tuning)."""
    path = work / "converted"
    assert main(["convert", str(roberta), str(path), *SMALL, "--allow-untrained"]) == 0
    return path


def _error(capsys, argv: list[str], *fragments: str) -> str:
    """``main(argv)`` exits 2 with one ``clusterformer: error:`` line holding ``fragments``."""
    capsys.readouterr()
    assert main(argv) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("clusterformer: error: "), lines
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


def _siblings(path: Path) -> list[str]:
    return sorted(child.name for child in path.parent.iterdir() if child.name.startswith(f".{path.name}."))


# -- never lose a user's work -----------------------------------------------------------------------------------------


def test_convert_refuses_a_folder_with_a_model_and_overwrite_replaces_the_model(work, roberta, capsys):
    out = work / "twice"
    assert main(["convert", str(roberta), str(out), *SMALL, "--allow-untrained"]) == 0
    (out / "checkpoint-7").mkdir()
    (out / "checkpoint-7" / "trainer_state.json").write_text("{}", encoding="utf-8")
    before = (out / "model.safetensors").read_bytes()
    _error(capsys, ["convert", str(roberta), str(out), *SMALL, "--num-clusters", "8"], str(out), "--overwrite")
    assert (out / "model.safetensors").read_bytes() == before and (out / "checkpoint-7").is_dir()
    assert main(["convert", str(roberta), str(out), *SMALL, "--num-clusters", "8", "--overwrite",
                 "--allow-untrained"]) == 0
    assert not (out / "checkpoint-7").exists()  # the old model's files are replaced, not mixed with the new one
    assert json.loads((out / "config.json").read_text(encoding="utf-8"))["num_clusters"] == 8
    assert _siblings(out) == []  # no temporary folder left behind


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


def test_train_into_a_folder_with_a_model_is_refused_before_training(work, converted, capsys):
    run = work / "run"
    run.mkdir()
    (run / "config.json").write_text("{}", encoding="utf-8")
    _error(capsys, ["train", "--output_dir", str(run), "--max_steps", "1", "--report_to", "none", "--use_cpu"],
           str(run), "--overwrite")
    assert (run / "config.json").read_text(encoding="utf-8") == "{}"


# -- no silent answers ------------------------------------------------------------------------------------------------


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
           "never trained", "--allow-untrained")


# -- BERT-family checkpoints ------------------------------------------------------------------------------------------


def test_predict_takes_a_bert_qa_checkpoint_once_converted(work, capsys):
    words = sorted({w.strip(".,?").lower() for w in " ".join([*SENTENCES, QUESTION]).split()})
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", ".", ",", "?", *words]
    path = work / "bert-qa"
    BertTokenizerFast(vocab={token: i for i, token in enumerate(vocab)}).save_pretrained(path)
    torch.manual_seed(0)
    config = BertConfig(vocab_size=len(vocab), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=64, max_position_embeddings=512, pad_token_id=0)
    BertForQuestionAnswering(config).save_pretrained(path)
    question = ["--question", QUESTION, "--context-file", str(work / "context.txt"), "--json"]
    _error(capsys, ["predict", str(path), *question], "plain bert checkpoint", f"clusterformer convert {path} OUT")
    assert main(["convert", str(path), str(work / "bert-converted"), *SMALL]) == 0  # its QA head carries over
    capsys.readouterr()
    assert main(["predict", str(work / "bert-converted"), *question]) == 0
    answer = json.loads(capsys.readouterr().out)["answers"][0]
    assert answer["answer"] == CONTEXT[answer["start"]:answer["end"]] and answer["answer"]


def test_a_bert_tokenizer_with_a_roberta_based_model_is_one_line(work, converted, capsys):
    """A BERT tokenizer (``[SEP]``, token type 1 for the context) beside a RoBERTa-based model: predict and train say
    so in one line, and the model itself names token types it does not have (no IndexError inside torch)."""
    import shutil

    words = sorted({w.strip(".,?").lower() for w in " ".join([*SENTENCES, QUESTION]).split()})
    tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", ".", ",", "?", *words]
    bert = BertTokenizerFast(vocab={t: i for i, t in enumerate(tokens)})
    mixed = work / "mixed-tokenizer"
    shutil.copytree(converted, mixed)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json", "merges.txt"):
        (mixed / name).unlink(missing_ok=True)
    bert.save_pretrained(mixed)
    question = ["--question", QUESTION, "--context-file", str(work / "context.txt"), "--allow-untrained"]
    _error(capsys, ["predict", str(mixed), *question], f"tokenizer of {mixed}", "ends the question with id 3 ([SEP])",
           "the tokenizer saved with the model")
    data = squad_jsonl(work / "mixed.jsonl", QUESTION, CONTEXT, "Tarsk", 2)
    _error(capsys, ["train", "--model_name_or_path", str(converted), "--tokenizer_name", str(mixed), "--train_file",
                    str(data), "--output_dir", str(work / "mixed-run"), "--max_steps", "1", "--report_to", "none",
                    "--use_cpu", "--do_train"], f"tokenizer of {mixed}")
    assert not (work / "mixed-run" / "model.safetensors").exists()
    model = ClusterFormerForQuestionAnswering.from_pretrained(converted).eval()
    encoding = bert(QUESTION, CONTEXT, return_tensors="pt")
    assert model.config.type_vocab_size == 1 and int(encoding["token_type_ids"].max()) == 1
    with pytest.raises(ValueError, match=r"token_type_ids holds type 1, but the model has 1 token type \(0\.\.0\)"):
        model(**encoding)


# -- saved folders that work without the package ----------------------------------------------------------------------


def _without_package(code: str, *args: str) -> subprocess.CompletedProcess:
    """Run ``code`` where ``hf_clusterformer`` cannot be imported, with no standard input (a prompt fails at once)."""
    return subprocess.run([sys.executable, "-c", HIDE_PACKAGE + code, *args], capture_output=True, text=True,
                          env=CHILD_ENV, stdin=subprocess.DEVNULL, timeout=120)


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


def test_card_regenerates_its_own_card_and_keeps_a_hand_written_one(converted, capsys):
    assert main(["card", str(converted)]) == 0  # only the title and path differ from the card convert wrote
    (converted / "README.md").write_text("# my notes\n", encoding="utf-8")
    _error(capsys, ["card", str(converted)], "hand-written", "--overwrite")
    assert main(["card", str(converted), "--overwrite"]) == 0


# -- records, bounds and small input errors ---------------------------------------------------------------------------


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


def test_context_length_is_bounded(converted, roberta, work, capsys):
    huge = "99999999999999999999"
    _error(capsys, ["predict", str(converted), "--question", QUESTION, "--context-file", str(work / "context.txt"),
                    "--max-context-length", huge], "--max-context-length", "at most")
    _error(capsys, ["convert", str(roberta), str(work / "huge"), "--max-context-length", huge], "at most")
    _error(capsys, ["evaluate", "--model_name_or_path", str(converted), "--max_context_length", huge,
                    "--output_dir", str(work / "huge-eval")], "--max_context_length must be an integer from 1 to")
    from hf_clusterformer.configuration_clusterformer import MAX_CONTEXT_LENGTH
    from hf_clusterformer.conversion import convert_checkpoint
    from hf_clusterformer_cli import MAX_CONTEXT_LENGTH as COMMAND_LIMIT

    assert COMMAND_LIMIT == MAX_CONTEXT_LENGTH
    with pytest.raises(ValueError, match="max_context_length must be an integer"):
        convert_checkpoint(roberta, work / "huge", max_context_length=int(huge))


def test_context_file_from_standard_input_and_a_folder(converted, work, capsys, monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(CONTEXT.encode("utf-8"))))
    capsys.readouterr()
    assert main(["predict", str(converted), "--question", QUESTION, "--context-file", "-", "--allow-untrained",
                 "--json"]) == 0
    answer = json.loads(capsys.readouterr().out)["answers"][0]
    assert answer["answer"] == CONTEXT[answer["start"]:answer["end"]]
    _error(capsys, ["predict", str(converted), "--question", QUESTION, "--context-file", str(work)],
           str(work), "is a folder")


def test_card_of_a_missing_folder_and_a_checkpoint_without_tokenizer(work, converted, capsys):
    _error(capsys, ["card", str(work / "nope")], "nope does not exist")
    bare = work / "bare"
    bare.mkdir()
    for name in ("config.json", "model.safetensors"):
        (bare / name).write_bytes((converted / name).read_bytes())
    _error(capsys, ["predict", str(bare), "--question", QUESTION, "--context-file", str(work / "context.txt")],
           f"no tokenizer files in {bare}")


def test_pipeline_says_bytes(converted):
    qa = hf_clusterformer.pipeline(model=str(converted), allow_untrained=True)
    with pytest.raises(ValueError, match="context is bytes"):
        qa(question=QUESTION, context=CONTEXT.encode("utf-8"))


def test_evaluate_records_the_evaluated_model(work, capsys):
    """all_results.json holds the settings of the model evaluated, not the command line's defaults."""
    torch.manual_seed(0)
    tokenizer = build_tokenizer(SENTENCES * 4 + [QUESTION], vocab_size=300)
    config = tiny_config(vocab_size=len(tokenizer), hidden_size=48, num_attention_heads=3, window_size=32,
                         window_stride=24, max_question_length=16, max_position_embeddings=64)
    model = ClusterFormerForQuestionAnswering(config)
    path = work / "to-evaluate"
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    out = work / "evaluated"
    dev = squad_jsonl(work / "evaluated-dev.jsonl", QUESTION, CONTEXT, "Tarsk", 2)
    assert main(["evaluate", "--model_name_or_path", str(path), "--validation_file", str(dev),
                 "--output_dir", str(out), "--report_to", "none", "--use_cpu"]) == 0
    recorded = json.loads((out / "all_results.json").read_text(encoding="utf-8"))["model"]
    assert recorded["hidden_size"] == 48 and recorded["num_attention_heads"] == 3
    assert recorded["model_name_or_path"] == str(path) and recorded["layer_kinds"] == config.layer_kinds


def test_commands_are_quiet_unless_verbose(converted, work):
    """No progress bars or loading reports by default; the unfitted-centroid warning once; -v shows the rest."""
    command = [sys.executable, "-m", "hf_clusterformer_cli", "predict", str(converted), "--question", QUESTION,
               "--context-file", str(work / "context.txt"), "--allow-untrained"]
    quiet = subprocess.run(command, capture_output=True, text=True, env=CHILD_ENV, timeout=180)
    assert quiet.returncode == 0, quiet.stderr[-2000:]
    lines = quiet.stderr.strip().splitlines()
    assert len(lines) == 1 and "never fitted" in lines[0], lines
    verbose = subprocess.run([*command, "-v"], capture_output=True, text=True, env=CHILD_ENV, timeout=180)
    assert verbose.returncode == 0 and "Loading weights" in verbose.stderr


def test_evaluate_help_shows_this_package_options_and_points_to_the_trainer_ones(capsys):
    with pytest.raises(SystemExit):
        main(["evaluate", "--help"])
    short = capsys.readouterr().out
    assert "--model_name_or_path" in short and "--centroid_update_steps" in short and "--help-training" in short
    assert "--lr_scheduler_type" not in short and len(short.splitlines()) < 200
    with pytest.raises(SystemExit):
        main(["evaluate", "--help-training"])
    assert "--lr_scheduler_type" in capsys.readouterr().out
