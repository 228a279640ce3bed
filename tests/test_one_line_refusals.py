"""Refusals in one line naming the input and the fix, from the commands and the Python API: a folder that holds a
model, checkpoints of other kinds, sizes and bounds, paths, sources and records; and nothing more said unless -v."""

from __future__ import annotations

import io
import json
import re
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
    squad_jsonl,
    tiny_config,
)
from helpers import hidden_siblings as _siblings
from helpers import main_error as _error
from helpers import main_one_line as _one_line
from helpers import one_line_error as _one_line_error
from helpers import qa_file as _qa_file
from helpers import run_command as _command
from helpers import tiny_qa_model as _model
from helpers import tiny_train_args as _tiny_train
from transformers import (
    BertConfig,
    BertForQuestionAnswering,
    BertTokenizerFast,
    GPT2Config,
    GPT2Model,
    RobertaConfig,
)

import hf_clusterformer
from hf_clusterformer import ClusterFormerConfig, ClusterFormerForQuestionAnswering, ClusterFormerModel
from hf_clusterformer.conversion import convert_checkpoint
from hf_clusterformer.data.tokenizer import build_tokenizer
from hf_clusterformer.hub import save_for_hub
from hf_clusterformer_cli import main

# -- a folder that holds a model or a hand-written card: --overwrite --------------------------------------------------


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

def test_train_into_a_folder_with_a_model_is_refused_before_training(work, converted, capsys):
    run = work / "run"
    run.mkdir()
    (run / "config.json").write_text("{}", encoding="utf-8")
    _error(capsys, ["train", "--output_dir", str(run), "--max_steps", "1", "--report_to", "none", "--use_cpu"],
           str(run), "--overwrite")
    assert (run / "config.json").read_text(encoding="utf-8") == "{}"

def test_card_regenerates_its_own_card_and_keeps_a_hand_written_one(converted, capsys):
    assert main(["card", str(converted)]) == 0  # only the title and path differ from the card convert wrote
    (converted / "README.md").write_text("# my notes\n", encoding="utf-8")
    _error(capsys, ["card", str(converted)], "hand-written", "--overwrite")
    assert main(["card", str(converted), "--overwrite"]) == 0


# -- checkpoints of other kinds: model types, heads, tokenizers -------------------------------------------------------


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


# -- sizes and bounds -------------------------------------------------------------------------------------------------


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

def test_context_length_is_bounded(converted, roberta, work, capsys):
    huge = "99999999999999999999"
    _error(capsys, ["predict", str(converted), "--question", QUESTION, "--context-file", str(work / "context.txt"),
                    "--max-context-length", huge], "--max-context-length", "at most")
    _error(capsys, ["convert", str(roberta), str(work / "huge"), "--max-context-length", huge], "at most")
    _error(capsys, ["evaluate", "--model_name_or_path", str(converted), "--max_context_length", huge,
                    "--output_dir", str(work / "huge-eval")], "--max_context_length must be an integer from 1 to")
    from hf_clusterformer.configuration_clusterformer import MAX_CONTEXT_LENGTH
    from hf_clusterformer.conversion import convert_checkpoint
    from hf_clusterformer_cli_support import MAX_CONTEXT_LENGTH as COMMAND_LIMIT

    assert COMMAND_LIMIT == MAX_CONTEXT_LENGTH
    with pytest.raises(ValueError, match="max_context_length must be an integer"):
        convert_checkpoint(roberta, work / "huge", max_context_length=int(huge))

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
    # Row: --centroid_backend cuda was refused only after the data and the model were built, naming "backend"
    for option, value, words in (("--centroid_backend", "cuda", "must be 'auto' or one of torch"),
                                 ("--centroid_update_steps", "0", "must be positive"),
                                 ("--memory_size", "0", "must be positive")):
        _error(capsys, [*_tiny_train(data), option, value, "--output_dir", str(tmp_path / "out")], f"{option} {words}")
    assert not (tmp_path / "out").exists()

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


# -- inputs: paths, sources, records, texts ---------------------------------------------------------------------------


def test_context_file_from_standard_input_and_a_folder(converted, work, capsys, monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(CONTEXT.encode("utf-8"))))
    capsys.readouterr()
    assert main(["predict", str(converted), "--question", QUESTION, "--context-file", "-", "--allow-untrained",
                 "--json"]) == 0
    answer = json.loads(capsys.readouterr().out)["answers"][0]
    assert answer["answer"] == CONTEXT[answer["start"]:answer["end"]]
    _error(capsys, ["predict", str(converted), "--question", QUESTION, "--context-file", str(work)],
           str(work), "is a folder")

def test_card_of_a_missing_folder_and_a_checkpoint_without_tokenizer(work, converted, capsys, caplog):
    _error(capsys, ["card", str(work / "nope")], "nope does not exist")
    bare = work / "bare"
    bare.mkdir()
    for name in ("config.json", "model.safetensors"):
        (bare / name).write_bytes((converted / name).read_bytes())
    _error(capsys, ["predict", str(bare), "--question", QUESTION, "--context-file", str(work / "context.txt")],
           f"no tokenizer files in {bare}")
    # Row: the pipeline said "Couldn't instantiate the backend tokenizer ... sentencepiece or tiktoken" instead
    with pytest.raises(ValueError, match=f"^no tokenizer files in {bare} \\(such as tokenizer.json\\); save"):
        hf_clusterformer.pipeline(model=str(bare), allow_untrained=True)
    import logging

    from hf_clusterformer.conversion import convert_checkpoint

    with caplog.at_level(logging.WARNING):
        convert_checkpoint(bare, work / "bare-converted")
    assert f"{bare} holds no tokenizer files; the checkpoint is written without one (to include one, give its " \
           "folder or Hub id as tokenizer=, or --tokenizer of clusterformer convert)." in caplog.text
    assert not (work / "bare-converted" / "tokenizer.json").exists()
    # Row: the warning named tokenizer= but the command had no way to give one
    assert main(["convert", str(bare), str(work / "bare-cli"), "--tokenizer", str(converted),
                 "--allow-untrained"]) == 0
    assert (work / "bare-cli" / "tokenizer.json").exists()
    _error(capsys, ["convert", str(bare), str(work / "bare-cli2"), "--tokenizer", str(work / "nope"),
                   "--allow-untrained"],
           f"--tokenizer directory {work / 'nope'} does not exist")

def test_pipeline_says_bytes(converted):
    qa = hf_clusterformer.pipeline(model=str(converted), allow_untrained=True)
    with pytest.raises(ValueError, match="context is bytes"):
        qa(question=QUESTION, context=CONTEXT.encode("utf-8"))

def test_push_a_file(hub_model):
    """Row: ``push FILE user/x`` said "directory FILE does not exist"."""
    _one_line_error(_command("push", str(hub_model / "config.json"), "user/x"), "is a file",
                    "give the checkpoint directory")

def test_push_to_a_local_path_says_it_is_no_repo_id(hub_model, tmp_path, capsys):
    """Row: ``push M /local/dir`` said the Hub could not be reached instead of "not a repo id"."""
    _error(capsys, ["push", str(hub_model), str(tmp_path)], f"{tmp_path} is a local path, not a Hub repo id",
           "user/my-model")
    _error(capsys, ["push", str(hub_model), "a/b/c"], "a/b/c is not a Hub repo id", "NAME or USER/NAME")
    from hf_clusterformer.hub import push_model

    with pytest.raises(ValueError, match="is a local path, not a Hub repo id"):
        push_model(hub_model, str(tmp_path))

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

def test_training_refuses_a_record_with_an_empty_question(tmp_path, capsys):
    """Row: a training record with an empty question trained (the predict path refuses such a question)."""
    data = _qa_file(tmp_path / "train.jsonl", 3)
    rows = [json.loads(line) for line in data.read_text(encoding="utf-8").splitlines()]
    rows[1]["question"] = "  "
    data.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    _error(capsys, [*_tiny_train(data), "--max_steps", "1", "--output_dir", str(tmp_path / "out")],
           "training record 1 (id '1')", str(data), "empty question", "remove that record")
    assert not (tmp_path / "out" / "config.json").exists()

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


# -- nothing more unless -v; the help, the progress bar and the records say what is done ------------------------------


def test_commands_are_quiet_unless_verbose(converted, hub_model, work):
    """No progress bars or loading reports by default; the unfitted-centroid warning once where the routing takes part
    (a cluster layer; not a converted encoder's window_cluster layer, whose routed path starts closed); -v shows the
    rest."""
    command = [sys.executable, "-m", "hf_clusterformer_cli", "predict", str(converted), "--question", QUESTION,
               "--context-file", str(work / "context.txt"), "--allow-untrained"]
    quiet = subprocess.run(command, capture_output=True, text=True, env=CHILD_ENV, timeout=180)
    assert quiet.returncode == 0 and quiet.stderr == "", quiet.stderr[-2000:]
    routed = subprocess.run([*command[:4], str(hub_model), *command[5:]], capture_output=True, text=True,
                            env=CHILD_ENV, timeout=180)
    assert routed.returncode == 0, routed.stderr[-2000:]
    lines = routed.stderr.strip().splitlines()
    assert len(lines) == 1 and "never fitted" in lines[0], lines
    verbose = subprocess.run([*command, "-v"], capture_output=True, text=True, env=CHILD_ENV, timeout=180)
    assert verbose.returncode == 0 and "Loading weights" in verbose.stderr

def test_export_is_quiet_unless_verbose(hub_model, tmp_path, capsys, caplog):
    """Row: ``export`` printed torch.onnx's notes on skipped torchvision ops and a FutureWarning of torch's
    internals (and "(None: ...)" for a format taken from the suffix); ``--quantize int8`` onnxruntime's advice to
    pre-process. `quiet_exporters` (around every
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
                logging.warning("Please consider to run pre-processing before quantization. Refer to example: ...")
        return [r.getMessage() for r in caplog.records if r.name.startswith("torch.onnx") or r.name == "root"] + [
            str(w.message) for w in caught if issubclass(w.category, FutureWarning)]

    assert notes_of_a_block() == []
    logging.getLogger("torch.onnx").setLevel(logging.INFO)
    try:
        assert len(notes_of_a_block()) == 3
    finally:
        logging.getLogger("torch.onnx").setLevel(logging.NOTSET)
    out = tmp_path / "model.onnx"
    assert main(["export", str(hub_model), str(out), "-v"]) == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert line == f"wrote {out} (onnx: dynamic batch and length); run it with " \
                   f"hf_clusterformer.export.load_exported({str(out)!r})"
    assert logging.getLogger("torch.onnx").level == logging.NOTSET  # as before the command

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

def test_evaluate_help_shows_this_package_options_and_points_to_the_trainer_ones(capsys):
    with pytest.raises(SystemExit):
        main(["evaluate", "--help"])
    short = capsys.readouterr().out
    assert "--model_name_or_path" in short and "--centroid_update_steps" in short and "--help-training" in short
    assert "--lr_scheduler_type" not in short and len(short.splitlines()) < 200
    with pytest.raises(SystemExit):
        main(["evaluate", "--help-training"])
    assert "--lr_scheduler_type" in capsys.readouterr().out

def test_train_and_evaluate_help_name_the_default_output_folder(capsys):
    """Row: ``train`` / ``evaluate`` wrote ``./outputs/run_qa`` by default without the help saying so."""
    for command, said in (("train", "train writes its model and records (all_results.json, eval_predictions.json) "
                                    "to outputs/run_qa"),
                          ("evaluate", "evaluate writes its records (all_results.json, eval_predictions.json) to "
                                       "outputs/evaluate")):
        capsys.readouterr()
        with pytest.raises(SystemExit):
            main([command, "--help"])
        assert f"Without --output_dir, {said};" in " ".join(capsys.readouterr().out.split())
    with pytest.raises(SystemExit):
        main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--output_dir (default outputs/run_qa)" in text and "--output_dir (default outputs/evaluate)" in text


def test_evaluate_after_train_with_the_default_folders(tmp_path, monkeypatch, capsys):
    """Row: ``train`` then ``evaluate --model_name_or_path outputs/run_qa``, both without --output_dir, was refused:
    evaluate wrote into the trained model's folder, whose records of the training run it must keep."""
    monkeypatch.chdir(tmp_path)
    torch.manual_seed(0)
    tokenizer = build_tokenizer(SENTENCES * 4 + [QUESTION], vocab_size=300)
    config = tiny_config(vocab_size=len(tokenizer), window_size=32, window_stride=24, max_question_length=16,
                         max_position_embeddings=64)
    trained = Path("outputs/run_qa")
    ClusterFormerForQuestionAnswering(config).save_pretrained(trained)
    tokenizer.save_pretrained(trained)
    (trained / "all_results.json").write_text('{"train": "the run that made this model"}', encoding="utf-8")
    dev = squad_jsonl(tmp_path / "dev.jsonl", QUESTION, CONTEXT, "Tarsk", 2)
    evaluate = ["evaluate", "--model_name_or_path", str(trained), "--validation_file", str(dev), "--report_to", "none",
                "--use_cpu"]
    assert main(evaluate) == 0
    assert json.loads((tmp_path / "outputs/evaluate/all_results.json").read_text(encoding="utf-8"))["model"][
        "model_name_or_path"] == str(trained)
    assert (trained / "all_results.json").read_text(encoding="utf-8") == '{"train": "the run that made this model"}'
    _error(capsys, evaluate, "outputs/evaluate already holds all_results.json", "--overwrite")

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


def test_training_flags_that_cannot_work_are_one_line_and_files_are_read_whole(tmp_path, capsys):
    """Rows of a first-use trial: --eval_strategy steps said "you didn't pass an eval_dataset" (it was passed);
    --max_answer_length 0 reached torch.cat(); a --max_seq_length shorter than a question was a tokenizers traceback;
    ``evaluate --do_train`` trained and wrote a model; a file of 230 records was evaluated on its first 200 (the built
    set's default cap) without a word."""
    data = _qa_file(tmp_path / "train.jsonl", 3)
    out = str(tmp_path / "out")
    cases = [(["--eval_strategy", "steps", "--eval_steps", "1"], "--eval_strategy steps: this command evaluates once"),
             (["--max_answer_length", "0"], "--max_answer_length must be at least 1, got 0."),
             (["--max_seq_length", "8"], "--max_seq_length 8 leaves no room for a context after the questions")]
    for flags, words in cases:
        _error(capsys, [*_tiny_train(data), "--max_steps", "1", *flags, "--output_dir", out], words)
    _error(capsys, ["evaluate", "--model_name_or_path", str(tmp_path), "--validation_file", str(data), "--do_train"],
           "evaluate does not train")
    assert not (tmp_path / "out").exists()
    whole = _qa_file(tmp_path / "validation.jsonl", 230)
    argv = [*_tiny_train(data), "--validation_file", str(whole), "--do_eval", "True", "--max_steps", "1",
            "--output_dir", out]
    assert main(argv) == 0
    assert json.loads((tmp_path / "out" / "all_results.json").read_text())["metrics"]["eval_samples"] == 230


def test_a_reader_that_stops_early_ends_predict_without_a_traceback(converted, tmp_path):
    """Row: ``clusterformer predict ... --top-k 1000 | head -1`` printed a BrokenPipeError traceback."""
    (tmp_path / "long.txt").write_text(" ".join([CONTEXT] * 10), encoding="utf-8")  # answers beyond a pipe's buffer
    command = [sys.executable, "-m", "hf_clusterformer_cli", "predict", str(converted), "--question", QUESTION,
               "--context-file", str(tmp_path / "long.txt"), "--allow-untrained", "--top-k", "5000"]
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=CHILD_ENV) as child:
        first = child.stdout.readline()
        child.stdout.close()
        error = child.stderr.read().decode()
        assert child.wait(timeout=180) == 141
    assert first.startswith(b"1. ") and "Traceback" not in error and "BrokenPipe" not in error, error


def test_resuming_a_finished_run_continues_it_in_its_folder(tmp_path, capsys):
    """Row: ``train --resume_from_checkpoint True --max_steps 3`` over a run of 2 steps trained step 3, then stopped
    with "rr/.clusterformer-files.json is yours" (the library's own record) and lost the new model and checkpoint;
    with no checkpoint at all it said "Can't find a valid checkpoint at True"."""
    data, out = _qa_file(tmp_path / "train.jsonl", 3), tmp_path / "run"
    argv = [*_tiny_train(data), "--save_steps", "1", "--output_dir", str(out)]
    _error(capsys, [*argv, "--max_steps", "2", "--resume_from_checkpoint", "True"],
           f"--resume_from_checkpoint: {out} holds no Trainer checkpoint (checkpoint-N) to resume from")
    assert main([*argv, "--max_steps", "2"]) == 0
    assert main([*argv, "--max_steps", "3", "--resume_from_checkpoint", "True"]) == 0
    state = json.loads((out / "checkpoint-3" / "trainer_state.json").read_text(encoding="utf-8"))
    assert state["global_step"] == 3 and (out / "model.safetensors").exists()


def test_a_validation_id_given_twice_is_named(tmp_path, capsys):
    """Row: three validation records with id "0" gave "Mismatch in the number of predictions (1) and references (3)"
    from the metric, after the run."""
    train = _qa_file(tmp_path / "train.jsonl", 3)
    twice = tmp_path / "dev.jsonl"
    twice.write_text(train.read_text(encoding="utf-8").replace('"id": "1"', '"id": "0"'), encoding="utf-8")
    _error(capsys, [*_tiny_train(train), "--validation_file", str(twice), "--do_eval", "True", "--max_steps", "1",
                    "--output_dir", str(tmp_path / "out")], f"validation id '0' is given to 2 records of {twice}")
    assert not (tmp_path / "out").exists()


def test_from_scratch_sizes_given_with_a_checkpoint_are_refused(converted, tmp_path, capsys):
    """Rows: ``train --model_name_or_path CKPT --hidden_size 64`` trained the checkpoint's 32-wide model silently;
    then it said so in a log line that the command's quiet console did not show, and evaluate took the sizes too."""
    data = _qa_file(tmp_path / "train.jsonl", 2)
    for command in ("train", "evaluate"):
        argv = [command, "--model_name_or_path", str(converted), "--train_file" if command == "train" else
                "--validation_file", str(data), "--hidden_size", "64", "--num_hidden_layers", "1", "--max_steps", "1",
                "--report_to", "none", "--use_cpu", "--output_dir", str(tmp_path / command), "-q"]
        _error(capsys, argv, "--hidden_size 64, --num_hidden_layers 1: sizes of a model built from scratch, which "
                             "--model_name_or_path does not read (the checkpoint has its own); leave them out")
        assert not (tmp_path / command / "config.json").exists()


def test_predict_offsets_index_the_context_files_own_characters(converted, tmp_path, capsys):
    """Row: on a CRLF file, predict --json's start/end indexed the newline-normalised text (29 of 30 spans off by the
    lines before them), unlike the same file from standard input."""
    crlf = tmp_path / "crlf.txt"
    crlf.write_bytes(CONTEXT.replace(". ", ".\r\n").encode("utf-8"))
    assert main(["predict", str(converted), "--question", QUESTION, "--context-file", str(crlf), "--json",
                 "--top-k", "30", "--allow-untrained"]) == 0
    answers = json.loads(capsys.readouterr().out)
    answers = answers["answers"] if isinstance(answers, dict) else answers
    text = crlf.read_bytes().decode("utf-8")
    assert len(answers) == 30 and all(text[a["start"]:a["end"]] == a["answer"] for a in answers)

def test_pipeline_takes_the_task_first_as_transformers_does(converted):
    """Row: ``hf_clusterformer.pipeline("question-answering", model=DIR)`` (transformers' order) raised "got
    multiple values for argument 'model'", and ``pipeline("question-answering")`` looked for a folder of that name."""
    first = hf_clusterformer.pipeline("question-answering", model=str(converted), allow_untrained=True)
    ours = hf_clusterformer.pipeline(model=str(converted), allow_untrained=True)
    assert type(first) is type(ours) and first(question=QUESTION, context=CONTEXT) == ours(question=QUESTION,
                                                                                            context=CONTEXT)
    assert type(hf_clusterformer.pipeline("qa", str(converted), allow_untrained=True)) is type(ours)
    with pytest.raises(ValueError, match=r"^pipeline\(\) needs model=: a loaded model, a checkpoint folder or a Hub"):
        hf_clusterformer.pipeline("question-answering")
    with pytest.raises(TypeError, match=r"^pipeline\(\) got model twice"):
        hf_clusterformer.pipeline(str(converted), model=str(converted))

def test_card_refuses_a_model_id_no_hub_repo_can_have(converted, work, capsys):
    """Row: ``card --model-id "bad id with spaces"`` wrote snippets loading that id; push refuses the same string."""
    _error(capsys, ["card", str(converted), "--out", str(work / "bad-id-card.md"), "--model-id", "bad id with spaces"],
           "--model-id 'bad id with spaces' is no Hub repo id")
    assert not (work / "bad-id-card.md").exists()


def test_evaluate_without_validation_data_names_what_evaluate_takes(converted, tmp_path, capsys):
    """Row: ``evaluate`` with only a --train_file said "--do_eval needs validation data" (it has no --do_eval)."""
    data = _qa_file(tmp_path / "train.jsonl", 2)
    _error(capsys, ["evaluate", "--model_name_or_path", str(converted), "--train_file", str(data), "--output_dir",
                    str(tmp_path / "out"), "--report_to", "none", "--use_cpu", "-q"],
           "evaluation needs validation data: give --validation_file")
