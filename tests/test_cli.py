"""The ``clusterformer`` command: help texts, predict on a long context (text and JSON), one-line errors with exit
status 2, inspect with a plot, and convert of a RoBERTa QA checkpoint.

The console script itself runs in subprocesses where its exit status and stderr matter; the other cases call
``hf_clusterformer_cli.main`` in this process (same code path, without a 5 s interpreter start each).
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForQuestionAnswering, AutoTokenizer, RobertaConfig, RobertaForQuestionAnswering

import hf_clusterformer  # noqa: F401  (registers the Auto classes)
from clusterformer_research.longrange import generate_longrange_dataset, write_squad_file
from hf_clusterformer import ClusterFormerConfig, ClusterFormerForQuestionAnswering
from hf_clusterformer.data import build_tokenizer
from hf_clusterformer_cli import main

SCRIPT = Path(sys.executable).with_name("clusterformer")
QUESTION = "Where does Zorvan live?"
SUBCOMMANDS = ("train", "evaluate", "predict", "inspect", "convert", "push", "card")


def _run(*args: str) -> subprocess.CompletedProcess:
    """The console script (or ``python -m hf_clusterformer_cli`` where it is not installed) in a subprocess."""
    command = [str(SCRIPT)] if SCRIPT.exists() else [sys.executable, "-m", "hf_clusterformer_cli"]
    env = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    return subprocess.run([*command, *args], capture_output=True, text=True, env=env, timeout=180)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("cli")


@pytest.fixture(scope="module")
def data_files(workdir) -> tuple[Path, Path]:
    """Generated long-range training (8) and validation (4) records as SQuAD-format files (the research package)."""
    options = {"context_tokens": (150, 250), "kind": "longrange", "min_gap_tokens": 30}
    train = write_squad_file(generate_longrange_dataset(8, 0, split="train", **options),
                             workdir / "longrange-train.json", overwrite=True)
    dev = write_squad_file(generate_longrange_dataset(4, 0, split="validation", **options),
                           workdir / "longrange-dev.json", overwrite=True)
    return train, dev


@pytest.fixture(scope="module")
def context(workdir) -> tuple[Path, str]:
    """A generated context of about 4000 words and punctuation marks (several thousand BPE tokens)."""
    text = generate_longrange_dataset(1, 0, (4000, 4000), "longrange")[0]["context"]
    path = workdir / "context.txt"
    path.write_text(text, encoding="utf-8")
    return path, text


@pytest.fixture(scope="module")
def model_dir(workdir, context) -> Path:
    """A random tiny Cluster-Former QA model and a BPE tokenizer built on the context, saved together."""
    tokenizer = build_tokenizer([context[1], QUESTION], vocab_size=400)
    torch.manual_seed(0)
    config = ClusterFormerConfig(
        vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=3, num_attention_heads=2, intermediate_size=64,
        cluster_layers=[2], num_clusters=8, window_size=64, window_stride=48, max_question_length=32,
        max_context_length=16384, max_position_embeddings=128, pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, type_vocab_size=1,
    )
    path = workdir / "model"
    ClusterFormerForQuestionAnswering(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def _one_line_error(result, *fragments: str) -> None:
    assert result.returncode == 2, (result.returncode, result.stdout[-500:], result.stderr[-2000:])
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("clusterformer: error: "), result.stderr
    for fragment in fragments:
        assert fragment in lines[0]


# -- help -----------------------------------------------------------------------------------------------------------


def test_script_help_lists_every_subcommand():
    result = _run("--help")
    assert result.returncode == 0, result.stderr
    for command in SUBCOMMANDS:
        assert command in result.stdout


@pytest.mark.parametrize("command", SUBCOMMANDS)
def test_subcommand_help(command, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([command, "--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert "usage:" in out
    if command in ("train", "evaluate"):  # every run_qa option: model, data, centroid and TrainingArguments
        for option in ("--model_name_or_path", "--cluster_layers", "--context_tokens_min", "--squad_path",
                       "--centroid_update_steps", "--do_train", "--max_steps", "--output_dir"):
            assert option in out
    elif command in ("predict", "inspect"):
        assert "--question" in out and "--context-file" in out
    elif command == "convert":
        assert "--cluster-layers" in out and "--global-layer-type" in out


def test_train_switches_take_a_bare_flag_and_help_names_each_default_once(capsys):
    """Rows: ``train --use-answerability-head`` wanted a value (convert's is a bare switch), and train's help said
    "Default: a checkpoint's own, else False. (default: None)"."""
    from hf_clusterformer.qa_training import parse_args

    model, *_ = parse_args(["--use-answerability-head", "--pair_token_types", "--chunk_question_prefix", "false",
                            "--output_dir", "unused"])
    assert (model.use_answerability_head, model.pair_token_types, model.chunk_question_prefix) == (True, True, False)
    assert parse_args(["--output_dir", "unused"])[0].use_answerability_head is None  # left out: the checkpoint's own
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "(default: None)" not in out and "QA head. Default: a checkpoint's own, else False." in out
    assert out.count("default:") + out.count("Default:") >= 20 and "Default: a checkpoint's own, else 64. (" not in out


def test_options_are_taken_in_full_and_a_near_miss_is_named(model_dir, context, capsys):
    """Row: ``train --max_step 3`` ran as ``--max_steps`` (argparse's prefix matching, which a new option can turn
    into another meaning or an error); a typo said "Some specified arguments are not used by the HfArgumentParser"."""
    path, _ = context
    predict = ["predict", str(model_dir), "--question", QUESTION, "--context-file", str(path)]
    for argv, said in [
        ([*predict, "--top", "2"], "unknown option --top (did you mean --top-k?) (see `clusterformer predict "
                                   "--help`)"),
        ([*predict, "--max_answer_lenght", "3", "--zzz"], "unknown options --max_answer_lenght (did you mean "
                                                          "--max-answer-length?), --zzz (see"),
        ([*predict, "stray"], "unexpected argument stray (see `clusterformer predict --help`)"),
        (["train", "--max_step", "3"], "unknown option --max_step (did you mean --max-steps?) (see `clusterformer "
                                       "train --help`)"),
        (["evaluate", "--model_name_or_path", str(model_dir), "stray"],
         "unexpected argument stray (see `clusterformer evaluate --help`)"),
    ]:
        assert said in _main_error(capsys, argv)


def test_no_subcommand_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([])
    assert exit_info.value.code == 2
    assert "required" in capsys.readouterr().err


# -- predict --------------------------------------------------------------------------------------------------------


def test_predict_prints_answers_scores_and_time(model_dir, context):
    path, text = context
    result = _run("predict", str(model_dir), "--question", QUESTION, "--context-file", str(path), "--top-k", "2")
    assert result.returncode == 0, result.stderr[-2000:]
    lines = result.stdout.strip().splitlines()
    assert len(lines) == 3
    for rank, line in enumerate(lines[:2], 1):
        match = re.fullmatch(r"(\d+)\. (.+)  score (\d\.\d{4})  chars (\d+)-(\d+)", line)
        assert match, line
        assert int(match[1]) == rank
        start, end = int(match[4]), int(match[5])
        assert 0 <= start < end <= len(text)
        assert ast.literal_eval(match[2]) == text[start:end]  # the repr of the context span
    timing = re.fullmatch(r"(\d+) tokens in one forward pass, (\d+\.\d\d) s", lines[2])
    assert timing, lines[2]
    assert int(timing[1]) > 4000


def test_predict_json(model_dir, context):
    path, text = context
    result = _run("predict", str(model_dir), "--question", QUESTION, "--context-file", str(path), "--json",
                  "--top-k", "3", "--max-answer-length", "5")
    assert result.returncode == 0, result.stderr[-2000:]
    output = json.loads(result.stdout)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    assert output["tokens"] == len(tokenizer(QUESTION, text)["input_ids"]) > 4000
    assert output["seconds"] > 0
    answers = output["answers"]
    assert len(answers) == 3
    assert [a["score"] for a in answers] == sorted((a["score"] for a in answers), reverse=True)
    offsets = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
    for answer in answers:
        assert answer["answer"] == text[answer["start"] : answer["end"]]
        covered = [o for o in offsets if o[0] < answer["end"] and o[1] > answer["start"]]
        assert 1 <= len(covered) <= 5  # --max-answer-length is in tokens


def test_predict_answers_as_the_pipeline_does_by_default_and_with_align_to_words(model_dir, context, capsys):
    """Rows: predict's --max-answer-length defaulted to 30 where the pipeline's max_answer_len took 15 (other
    answers, and the help named no default); predict had no --align-to-words; a file saved with a byte-order mark
    and Windows line ends gave answers starting with the mark or ending in a line end."""
    from hf_clusterformer.pipeline import MAX_ANSWER_TOKENS

    path, text = context
    words = text.split(" ")
    text = "\ufeff" + "\r\n".join(" ".join(words[i:i + 40]) for i in range(0, len(words), 40))
    path = path.with_name("context-bom.txt")
    path.write_bytes(text.encode("utf-8"))
    qa = hf_clusterformer.pipeline(model=str(model_dir))
    for flags, options in (([], {}), (["--align-to-words"], {"align_to_words": True})):
        capsys.readouterr()
        assert main(["predict", str(model_dir), "--question", QUESTION, "--context-file", str(path), "--json",
                     "--top-k", "20", *flags]) == 0
        answers = json.loads(capsys.readouterr().out)["answers"]
        assert answers == qa(question=QUESTION, context=text, top_k=20, **options)
        for answer in answers:
            assert answer["answer"] == text[answer["start"]:answer["end"]] == answer["answer"].strip()
            assert not answer["answer"].startswith("\ufeff")
    capsys.readouterr()
    with pytest.raises(SystemExit):
        main(["predict", "--help"])
    assert f"(default: {MAX_ANSWER_TOKENS})" in " ".join(capsys.readouterr().out.split())


def test_predict_missing_context_file(model_dir, workdir):
    missing = workdir / "no-such-context.txt"
    _one_line_error(_run("predict", str(model_dir), "--question", QUESTION, "--context-file", str(missing)),
                    str(missing), "does not exist")


def test_predict_unreadable_checkpoint(workdir, context):
    broken = workdir / "broken"
    broken.mkdir()
    (broken / "config.json").write_text('{"model_type": "clusterformer", ', encoding="utf-8")
    _one_line_error(_run("predict", str(broken), "--question", QUESTION, "--context-file", str(context[0])),
                    "could not load a Cluster-Former checkpoint", str(broken))


def test_predict_empty_context_file(model_dir, workdir, capsys):
    empty = workdir / "empty.txt"
    empty.write_text(" \n\n", encoding="utf-8")
    assert main(["predict", str(model_dir), "--question", QUESTION, "--context-file", str(empty)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"clusterformer: error: context file {empty} is empty; give a file with the context text."]


def test_predict_missing_checkpoint_dir(workdir, context, capsys):
    missing = workdir / "no-such-model"
    assert main(["predict", str(missing), "--question", QUESTION, "--context-file", str(context[0])]) == 2
    assert capsys.readouterr().err.strip() == f"clusterformer: error: checkpoint directory {missing} does not exist."


def test_predict_checkpoint_file_and_empty_question(model_dir, context, capsys):
    file_not_dir = str(model_dir / "config.json")
    assert main(["predict", file_not_dir, "--question", QUESTION, "--context-file", str(context[0])]) == 2
    assert "is a file; give the checkpoint directory" in capsys.readouterr().err
    assert main(["predict", str(model_dir), "--question", "  ", "--context-file", str(context[0])]) == 2
    assert capsys.readouterr().err.strip() == "clusterformer: error: the question is empty."


def test_evaluate_needs_a_checkpoint(capsys):
    assert main(["evaluate", "--validation_file", "dev.json"]) == 2
    assert "evaluate needs --model_name_or_path" in capsys.readouterr().err


# -- inspect --------------------------------------------------------------------------------------------------------


def test_inspect_prints_clusters_and_writes_a_plot(model_dir, context, workdir, capsys):
    pytest.importorskip("matplotlib")
    plot = workdir / "clusters.png"
    code = main(["inspect", str(model_dir), "--question", QUESTION, "--context-file", str(context[0]),
                 "--max-clusters", "3", "--plot", str(plot)])
    assert code == 0
    out = capsys.readouterr().out
    assert out.startswith("Cluster layer 2: ") and "chunks of 48 states" in out
    assert len(re.findall(r"^  cluster +\d+ size +\d+ span +\d+ tokens: ", out, flags=re.M)) == 3
    assert "Cluster size histogram" in out
    assert out.strip().endswith(f"plot written to {plot}")
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and plot.stat().st_size > 1000


def test_inspect_bad_layer(model_dir, context, capsys):
    argv = ["inspect", str(model_dir), "--question", QUESTION, "--context-file", str(context[0]), "--layer", "0"]
    assert main(argv) == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]  # after the weight-loading progress bar
    assert last == ("clusterformer: error: Layer 0 cannot be inspected: it is a sliding layer, which routes nothing; "
                    "choose a routed layer, one of [2].")


# -- convert --------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def roberta_qa(workdir, context) -> Path:
    """A tiny RobertaForQuestionAnswering checkpoint with its tokenizer."""
    tokenizer = build_tokenizer([context[1][:20000], QUESTION], vocab_size=300)
    config = RobertaConfig(
        vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
        max_position_embeddings=64, type_vocab_size=1, pad_token_id=1, bos_token_id=0, eos_token_id=2,
    )
    torch.manual_seed(1)
    path = workdir / "roberta-qa"
    RobertaForQuestionAnswering(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def test_convert_roberta_checkpoint(roberta_qa, workdir, capsys):
    target = workdir / "converted"
    code = main(["convert", str(roberta_qa), str(target), "--cluster-layers", "1", "--num-clusters", "4",
                 "--window-size", "32", "--window-stride", "24", "--max-question-length", "16"])
    assert code == 0
    out = capsys.readouterr().out
    # the QA head came along: nothing new; a pretrained encoder's global layer adds to its window by default
    assert out.strip() == (f"wrote {target}, a question-answering model, from a roberta checkpoint "
                           "(layers ['sliding', 'window_cluster'], 4 clusters, windows 32/24)")

    again = workdir / "again"  # a Cluster-Former source keeps its settings unless told otherwise
    assert main(["convert", str(target), str(again), "--num-clusters", "2"]) == 0
    assert capsys.readouterr().out.strip() == (
        f"wrote {again}, a question-answering model, from a clusterformer checkpoint "
        "(layers ['sliding', 'window_cluster'], 2 clusters, windows 32/24)"
    )

    paper = workdir / "paper"  # the paper's replacing layer, named
    assert main(["convert", str(roberta_qa), str(paper), "--cluster-layers", "1", "--global-layer-type", "cluster",
                 "--num-clusters", "4", "--window-size", "32", "--window-stride", "24", "--max-question-length",
                 "16"]) == 0
    assert "(layers ['sliding', 'cluster'], 4 clusters" in capsys.readouterr().out
    # Row: the flag's help promised one kind per layer, but a second kind was an "unrecognized argument"
    per_layer = workdir / "per-layer"
    assert main(["convert", str(roberta_qa), str(per_layer), "--cluster-layers", "1", "0", "--global-layer-type",
                 "lsh", "cluster", "--num-clusters", "4", "--window-size", "32", "--window-stride", "24",
                 "--max-question-length", "16"]) == 0
    # Row: with the indices out of order, each kind landed on the other's layer
    assert "(layers ['cluster', 'lsh'], 4 clusters" in capsys.readouterr().out

    # Row: a layer added to a converted sliding-window model was the paper's replacing kind, not the pretrained default
    plain, added = workdir / "plain", workdir / "added"
    assert main(["convert", str(roberta_qa), str(plain), "--cluster-layers", "--window-size", "32", "--window-stride",
                 "24", "--max-question-length", "16"]) == 0
    assert main(["convert", str(plain), str(added), "--cluster-layers", "1", "--num-clusters", "4"]) == 0
    assert "(layers ['sliding', 'window_cluster'], 4 clusters" in capsys.readouterr().out

    retyped = workdir / "retyped"  # layer kinds replace a Cluster-Former source's placement
    argv = ["convert", str(target), str(retyped), "--layer-kinds", "sliding", "lsh", "--no-use-answerability-head"]
    assert main(argv) == 0
    assert "(layers ['sliding', 'lsh'], 4 clusters" in capsys.readouterr().out

    converted = AutoModelForQuestionAnswering.from_pretrained(target)
    assert isinstance(converted, ClusterFormerForQuestionAnswering)
    assert converted.config.layer_kinds == ["sliding", "window_cluster"]
    assert (converted.config.window_size, converted.config.window_stride) == (32, 24)
    source = RobertaForQuestionAnswering.from_pretrained(roberta_qa).state_dict()
    weights = converted.state_dict()
    for name, tensor in source.items():
        assert torch.equal(weights[name], tensor), name
    pair = ("Where?", "Zorvan lives in Tarsk.")
    assert AutoTokenizer.from_pretrained(target)(*pair) == AutoTokenizer.from_pretrained(roberta_qa)(*pair)

    # A one-window input with no global layer is plain RoBERTa: the converted model gives RoBERTa's logits.
    sliding = ClusterFormerForQuestionAnswering.from_pretrained(target, cluster_layers=[]).eval()
    roberta = RobertaForQuestionAnswering.from_pretrained(roberta_qa).eval()
    tokenizer = AutoTokenizer.from_pretrained(target)
    encoding = tokenizer(QUESTION, "Zorvan lives with Melka. Melka lives in Tarsk.", return_tensors="pt")
    with torch.no_grad():
        ours, theirs = sliding(**encoding), roberta(**encoding)
    assert torch.allclose(ours.start_logits, theirs.start_logits, atol=1e-5)


def test_convert_to_window_cluster_layers_reads_as_the_sliding_model(roberta_qa, workdir, context, capsys):
    """``convert --global-layer-type window_cluster --route-by keys``: nothing is reported as newly initialised (the
    routed projection starts at zero by design), ``predict`` (the QA pipeline) takes the result without refusing it
    as untrained and answers as the same checkpoint converted without global layers, and ``inspect`` lists its
    clusters."""
    options = ["--num-clusters", "4", "--window-size", "32", "--window-stride", "24", "--max-question-length", "16"]
    target, sliding = workdir / "window-cluster", workdir / "window-sliding"
    assert main(["convert", str(roberta_qa), str(target), "--cluster-layers", "1", "--global-layer-type",
                 "window_cluster", "--route-by", "keys", *options]) == 0
    assert capsys.readouterr().out.strip() == (f"wrote {target}, a question-answering model, from a roberta "
                                               "checkpoint (layers ['sliding', 'window_cluster'], 4 clusters, "
                                               "windows 32/24)")
    config = ClusterFormerConfig.from_pretrained(target)
    assert (config.layer_kinds, config.route_by) == (["sliding", "window_cluster"], "keys")
    assert not getattr(config, "untrained_weights", None)  # nothing recorded as untrained
    assert main(["convert", str(roberta_qa), str(sliding), "--cluster-layers", *options]) == 0
    assert "(layers ['sliding', 'sliding']" in capsys.readouterr().out
    short = workdir / "window-context.txt"
    short.write_text(context[1][:6000], encoding="utf-8")
    answers = []
    for folder in (target, sliding):
        assert main(["predict", str(folder), "--question", QUESTION, "--context-file", str(short), "--json",
                     "--top-k", "3"]) == 0
        answers.append(json.loads(capsys.readouterr().out)["answers"])
    assert [a["answer"] for a in answers[0]] == [a["answer"] for a in answers[1]] and len(answers[0]) == 3
    assert [a["score"] for a in answers[0]] == pytest.approx([a["score"] for a in answers[1]], abs=1e-5)
    assert main(["inspect", str(target), "--question", QUESTION, "--context-file", str(short),
                 "--max-clusters", "2"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("Cluster layer 1: ") and "chunks of 24 states" in out
    assert len(re.findall(r"^  cluster +\d+ size +\d+ span +\d+ tokens: ", out, flags=re.M)) == 2


def test_convert_rejects_other_architectures(workdir, capsys):
    from transformers import GPT2Config

    gpt2 = workdir / "gpt2"
    GPT2Config(n_embd=32, n_layer=1, n_head=2).save_pretrained(gpt2)
    assert main(["convert", str(gpt2), str(workdir / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"clusterformer: error: could not convert {gpt2}: ")
    assert "convertible types are roberta, bert" in err
    assert not (workdir / "out").exists()


def test_convert_refuses_a_qa_head_without_two_outputs(workdir, capsys):
    """A question-answering checkpoint whose head gives 3 outputs per token would load as a broken QA model."""
    from transformers import RobertaConfig, RobertaForQuestionAnswering

    source = workdir / "qa3"
    config = RobertaConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                           intermediate_size=32, num_labels=3)
    RobertaForQuestionAnswering(config).save_pretrained(source)
    capsys.readouterr()  # the saving's progress bar
    assert main(["convert", str(source), str(workdir / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "gives 3 outputs per token" in err and "--task" in err, err
    assert not (workdir / "out").exists()


def test_push_missing_checkpoint(workdir, capsys):
    assert main(["push", str(workdir / "nothing"), "user/repo"]) == 2
    assert "does not exist" in capsys.readouterr().err


# -- one-line errors --------------------------------------------------------------------------------------------------


def _main_error(capsys, argv: list[str], *fragments: str) -> str:
    """Run ``main(argv)`` in this process: exit status 2 and one ``clusterformer: error:`` line holding
    ``fragments``."""
    assert main(argv) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines and lines[-1].startswith("clusterformer: error: "), lines
    assert "Traceback" not in "\n".join(lines)
    for fragment in fragments:
        assert fragment in lines[-1], lines[-1]
    return lines[-1]


def _predict(model_dir, context, *extra: str) -> list[str]:
    return ["predict", str(model_dir), "--question", QUESTION, "--context-file", str(context[0]), *extra]


def test_predict_question_over_the_limit(model_dir, context, capsys):
    argv = ["predict", str(model_dir), "--question", "Where " * 40 + "?", "--context-file", str(context[0])]
    _main_error(capsys, argv, "max_question_length=32", "shorten the question")


def test_predict_context_over_max_context_length_and_raising_it(model_dir, context, capsys):
    _main_error(capsys, _predict(model_dir, context, "--max-context-length", "100"),
                str(context[0]), "more than --max-context-length 100;", "pass --max-context-length")
    small = context[0].parent / "short.txt"
    small.write_text(context[1][:300], encoding="utf-8")
    assert main(["predict", str(model_dir), "--question", QUESTION, "--context-file", str(small),
                 "--max_context_length", "200", "--top_k", "2", "--max_answer_length", "3"]) == 0
    assert len(capsys.readouterr().out.strip().splitlines()) == 3  # underscore spellings work too


def test_predict_context_file_not_utf8(model_dir, workdir, capsys):
    latin = workdir / "latin1.txt"
    latin.write_bytes("Zorvan lives in Tårsk.".encode("latin-1"))
    _main_error(capsys, ["predict", str(model_dir), "--question", QUESTION, "--context-file", str(latin)],
                str(latin), "not UTF-8", "byte 0xe5", "save it as UTF-8")


@pytest.mark.parametrize("option", ["--top-k", "--max-answer-length"])
def test_predict_zero_counts(model_dir, context, capsys, option):
    _main_error(capsys, _predict(model_dir, context, option, "0"), option, "positive integer", "--help")


def test_predict_devices(model_dir, context, capsys):
    missing = f"cuda:{torch.cuda.device_count()}"  # one past the last GPU; no GPU at all on a CPU build
    _main_error(capsys, _predict(model_dir, context, "--device", missing), f"--device {missing}", "cuda")
    _main_error(capsys, _predict(model_dir, context, "--device", "nonsense"), "--device nonsense", "use cpu")


def test_inspect_plot_into_a_missing_folder_and_empty_question(model_dir, context, workdir, capsys):
    """Row: ``inspect --plot new/p.png`` refused the missing folder where ``export new/m.onnx`` made it; a file where
    a folder is meant is one line."""
    pytest.importorskip("matplotlib")
    plot = workdir / "no-such-folder" / "deeper" / "clusters.png"
    argv = ["inspect", str(model_dir), "--question", QUESTION, "--context-file", str(context[0]), "--plot"]
    assert main([*argv, str(plot)]) == 0 and plot.stat().st_size > 1000
    _main_error(capsys, [*argv, str(context[0] / "clusters.png")], "--plot", "is a file, not a folder")
    _main_error(capsys, ["inspect", str(model_dir), "--question", " ", "--context-file", str(context[0])],
                "the question is empty")


def test_missing_model_paths_fail_fast(workdir, context, capsys, monkeypatch):
    monkeypatch.chdir(workdir)
    (workdir / "runs").mkdir(exist_ok=True)
    _main_error(capsys, ["evaluate", "--model_name_or_path", "./missing", "--validation_file", "dev.json"],
                "--model_name_or_path directory ./missing does not exist")
    (workdir / "runs" / "empty").mkdir(exist_ok=True)
    _main_error(capsys, ["evaluate", "--model_name_or_path", "runs/empty", "--validation_file", "dev.json"],
                "runs/empty")
    # No "./", but "runs" is a local folder: a path, not a Hub id.
    _main_error(capsys, ["predict", "runs/missing", "--question", QUESTION, "--context-file", str(context[0])],
                "checkpoint directory runs/missing does not exist")


def test_hub_id_with_the_hub_out_of_reach_fails_fast(context, tmp_path):
    from support.hub_fixtures import client_env

    env = client_env("http://127.0.0.1:9", tmp_path / "home")
    result = subprocess.run([sys.executable, "-m", "hf_clusterformer_cli", "predict", "someone/missing", "--question",
                             QUESTION, "--context-file", str(context[0])], capture_output=True, text=True, env=env,
                            timeout=120)
    _one_line_error(result, "someone/missing is not a local directory", "Hub is out of reach", "127.0.0.1:9")


@pytest.mark.parametrize("damage", ["truncated", "garbage"])
def test_damaged_weights_name_the_file(model_dir, context, data_files, workdir, capsys, damage):
    broken = workdir / f"weights-{damage}"
    if not broken.exists():
        import shutil

        shutil.copytree(model_dir, broken)
        weights = (broken / "model.safetensors").read_bytes()
        damaged = weights[: len(weights) // 2] if damage == "truncated" else b"garbage" * 9
        (broken / "model.safetensors").write_bytes(damaged)
    _main_error(
        capsys, _predict(broken, context), str(broken / "model.safetensors"), "not a readable safetensors file"
    )
    _main_error(capsys, ["evaluate", "--model_name_or_path", str(broken), "--validation_file", str(data_files[1]),
                         "--eval_samples", "2",
                         "--output_dir", str(workdir / "eval-broken"), "--report_to", "none", "--use_cpu"],
                str(broken / "model.safetensors"), "not a readable safetensors file")
    for command in (["export", str(broken), str(workdir / f"broken-{damage}.onnx")],
                    ["card", str(broken), "--out", str(workdir / f"broken-{damage}.md")],
                    ["convert", str(broken), str(workdir / f"broken-{damage}-converted")]):
        _main_error(capsys, command, str(broken / "model.safetensors"), "not a readable safetensors file",
                    "save or download the checkpoint again")


def test_train_option_errors_are_one_line(workdir, capsys):
    _main_error(capsys, ["train", "--max_steps", "many", "--output_dir", str(workdir / "x")],
                "--max_steps", "invalid int value: 'many'", "clusterformer train --help")
    _main_error(capsys, ["train", "--no-such-option", "1", "--output_dir", str(workdir / "x")], "--no-such-option")


def test_invalid_json_data_file(workdir, capsys):
    bad = workdir / "bad.json"
    bad.write_text('[{"id": "1", "question": "Q?",\n  "context": }]', encoding="utf-8")
    _main_error(capsys, ["train", "--train_file", str(bad), "--output_dir", str(workdir / "bad-run")],
                f"data file {bad} is not valid JSON at line 2 column 14")
    lines = workdir / "bad.jsonl"
    lines.write_text('{"id": "1"}\n{"id": 2,\n', encoding="utf-8")
    _main_error(capsys, ["train", "--train_file", str(lines), "--output_dir", str(workdir / "bad-run")],
                f"data file {lines} is not valid JSON at line 2")


def test_a_json_data_file_saved_with_a_byte_order_mark_reads(workdir):
    """Row: a data file saved as "UTF-8 with BOM" (as some editors do) was 'not valid JSON at line 1 column 1
    (Unexpected UTF-8 BOM (decode using utf-8-sig)); fix that line'."""
    from hf_clusterformer.qa_training import _parse_json_file

    records = [{"id": "1", "question": "Q?", "context": "Zorvan lives in Tarsk.", "answers": {"text": ["Tarsk"],
                                                                                             "answer_start": [16]}}]
    for suffix, text in ((".json", json.dumps(records)), (".jsonl", "\n".join(map(json.dumps, records)))):
        path = workdir / f"bom{suffix}"
        path.write_bytes(b"\xef\xbb\xbf" + text.encode("utf-8"))
        assert _parse_json_file(str(path)) == records


# -- train, card and push ---------------------------------------------------------------------------------------------

TINY_TRAIN = [
    "--hidden_size", "32", "--num_hidden_layers", "2", "--num_attention_heads", "2", "--intermediate_size", "64",
    "--window_size", "32", "--window_stride", "24", "--max_question_length", "16", "--cluster_layers", "1",
    "--num_clusters", "4", "--vocab_size", "400", "--eval_samples", "4", "--per_device_train_batch_size", "4",
    "--centroid_update_steps", "2", "--report_to", "none", "--use_cpu", "--seed", "0",
]


@pytest.fixture(scope="module")
def trained(workdir, data_files) -> Path:
    """``clusterformer train`` on generated data files, 4 steps, with a Trainer checkpoint folder (optimizer state)."""
    output = workdir / "trained"
    train, dev = data_files
    assert main(["train", "--train_file", str(train), "--validation_file", str(dev), "--train_samples", "8",
                 "--max_steps", "4", "--save_strategy", "steps", "--save_steps", "4", "--output_dir", str(output),
                 *TINY_TRAIN]) == 0
    return output


def test_train_writes_a_pushable_checkpoint_with_its_card(trained):
    from hf_clusterformer.hub import check_hub_checkpoint, hub_files

    uploaded, skipped = hub_files(trained)
    assert check_hub_checkpoint(trained, uploaded) == []
    assert {"config.json", "model.safetensors", "configuration_clusterformer.py", "modeling_clusterformer.py",
            "pipeline.py", "tokenizer.json", "README.md", "all_results.json"} <= set(uploaded)
    assert "training_args.bin" in skipped and any(name.startswith("checkpoint-4/") for name in skipped)
    card = (trained / "README.md").read_text(encoding="utf-8")
    assert "| Centroids | fitted by K-Means on the model's own hidden states |" in card
    assert "Local SQuAD-format files: training `longrange-train.json`, validation `longrange-dev.json`." in card
    assert "huggingface.co/datasets" not in card


def test_card_command_on_its_own_results(trained, capsys):
    (trained / "README.md").write_text("# my notes\n", encoding="utf-8")
    _main_error(capsys, ["card", str(trained)], "README.md exists and differs", "--overwrite")
    assert (trained / "README.md").read_text(encoding="utf-8") == "# my notes\n"
    assert main(["card", str(trained), "--overwrite"]) == 0
    assert capsys.readouterr().out.strip() == f"wrote {trained / 'README.md'}"
    card = (trained / "README.md").read_text(encoding="utf-8")
    assert "fitted by K-Means on the model's own hidden states" in card and "not recorded" not in card
    assert "model-index" in card and "| longrange-dev.json | validation |" in card
    out = trained.parent / "card-multipassage.md"
    assert main(["card", "--config", str(trained), "--results", str(trained / "all_results.json"), "--dataset",
                 "squad-multipassage", "--out", str(out)]) == 0
    text = out.read_text(encoding="utf-8")
    assert "huggingface.co/datasets/squad-multipassage" not in text and "built from the SQuAD v1.1 dev set" in text
    _main_error(capsys, ["card", str(trained.parent / "nothing")], "nothing does not exist")
    (trained.parent / "empty-folder").mkdir(exist_ok=True)
    _main_error(capsys, ["card", str(trained.parent / "empty-folder")], "has no config.json")
    (trained.parent / "broken.json").write_text("{", encoding="utf-8")
    _main_error(capsys, ["card", str(trained), "--results", str(trained.parent / "broken.json"), "--out",
                         str(out)], "broken.json is not valid JSON")


def _push(checkpoint: Path, repo: str, endpoint: str, home: Path, token: str | None = "hf_test_token"):
    from support.hub_fixtures import client_env

    env = dict(client_env(endpoint, home, token=token), OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-m", "hf_clusterformer_cli", "push", str(checkpoint), repo],
                          capture_output=True, text=True, env=env, timeout=180)


def test_push_takes_the_train_output_and_skips_training_state(trained, hub_server, tmp_path):
    from huggingface_hub import HfApi

    result = _push(trained, "user/trained", hub_server.url, tmp_path / "home")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "skipped (training state, not uploaded): " in result.stdout and "training_args.bin" in result.stdout
    assert re.search(r"checkpoint-4/ \(\d+ files\)", result.stdout)
    files = set(HfApi(endpoint=hub_server.url, token="hf_test_token").list_repo_files("user/trained"))
    assert {"config.json", "model.safetensors", "modeling_clusterformer.py", "README.md", "tokenizer.json"} <= files
    assert not [name for name in files if name.endswith(".bin") or name.startswith("checkpoint-")]
    sha = HfApi(endpoint=hub_server.url, token="hf_test_token").model_info("user/trained").sha
    assert f"commit {sha}" in result.stdout and f"revision='{sha}'" in result.stdout  # the commit to pin


def test_push_without_a_token_or_a_hub(trained, hub_server, tmp_path):
    _one_line_error(_push(trained, "user/no-token", hub_server.url, tmp_path / "a", token=None),
                    "the Hub refused to push", "HTTP 401", "HF_TOKEN")
    _one_line_error(_push(trained, "user/no-hub", "http://127.0.0.1:9", tmp_path / "b"),
                    "cannot push", "127.0.0.1:9 cannot be reached", "HF_ENDPOINT")


def test_train_with_a_train_file_only_skips_evaluation(workdir, capsys):
    records = generate_longrange_dataset(4, 0, (150, 250), "longrange", min_gap_tokens=30)
    train_file = workdir / "train.jsonl"
    train_file.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    output = workdir / "train-only"
    assert main(["train", "--train_file", str(train_file), "--max_steps", "1", "--output_dir", str(output),
                 *TINY_TRAIN]) == 0
    results = json.loads((output / "all_results.json").read_text(encoding="utf-8"))
    assert "eval_f1" not in results["metrics"] and not (output / "eval_predictions.json").exists()
    assert "Not evaluated" in (output / "README.md").read_text(encoding="utf-8")


def _fresh_main(option: str) -> tuple[str, str]:
    """``clusterformer OPTION`` (which exits 0) in a fresh process: its output, and the libraries it imported."""
    code = (f"import sys, hf_clusterformer_cli\ntry:\n    hf_clusterformer_cli.main([{option!r}])\n"
            "except SystemExit as exit:\n    assert exit.code == 0\n"
            "print(sorted(m for m in ('torch', 'transformers', 'hf_clusterformer') if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    output, imported = result.stdout.strip().rsplit("\n", 1)
    return output, imported


def test_help_starts_without_torch_or_transformers():
    output, imported = _fresh_main("--help")
    assert "predict" in output and imported == "[]"


def test_version_names_the_installed_package_and_its_libraries_without_importing_them():
    import importlib.metadata

    import torch
    import transformers

    import hf_clusterformer

    line, imported = _fresh_main("--version")
    assert line.startswith(f"clusterformer {hf_clusterformer.__version__} (transformers {transformers.__version__}, "
                           f"torch {torch.__version__}, Python "), line
    assert importlib.metadata.version("hf-clusterformer") == hf_clusterformer.__version__  # setup.cfg reads it
    assert imported == "[]"


def test_usage_errors_of_predict_inspect_push_and_export_start_without_torch(tmp_path):
    """A missing or unreadable input, a missing local checkpoint or a file given as one: exit 2 and one line, before
    torch or transformers is imported (so in well under a second)."""
    context = tmp_path / "context.txt"
    context.write_text("Zorvan lives in Tarsk.", encoding="utf-8")
    missing, folder = tmp_path / "missing", tmp_path / "no-config"
    folder.mkdir()
    cases = [
        (["predict", str(folder), "--question", "q", "--context-file", str(missing)], "does not exist"),
        (["predict", str(missing), "--question", "q", "--context-file", str(context)], "does not exist"),
        (["inspect", str(folder), "--question", "q", "--context-file", str(context)], "has no config.json"),
        (["push", str(context), "user/name"], "is a file"),
        (["push", str(missing), "user/name"], f"checkpoint directory {missing} does not exist"),
        (["push", "no-such-local-run-7f3a", "user/name"],
         "checkpoint directory no-such-local-run-7f3a does not exist"),
        (["push", str(folder), "user/name"], "has no config.json"),
        (["export", str(missing) + "/", str(tmp_path / "out.onnx")], "does not exist"),
    ]
    code = ("import contextlib, io, json, sys, hf_clusterformer_cli\n"
            "results = []\n"
            "for argv in json.loads(sys.argv[1]):\n"
            "    err = io.StringIO()\n"
            "    with contextlib.redirect_stderr(err):\n"
            "        results.append([hf_clusterformer_cli.main(argv), err.getvalue()])\n"
            "print(json.dumps([results, sorted(m for m in ('torch', 'transformers', 'hf_clusterformer') "
            "if m in sys.modules)]))")
    result = subprocess.run([sys.executable, "-c", code, json.dumps([argv for argv, _ in cases])], capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    results, imported = json.loads(result.stdout)
    assert imported == []
    for (argv, fragment), (status, err) in zip(cases, results):
        lines = err.strip().splitlines()
        assert status == 2 and len(lines) == 1 and lines[0].startswith("clusterformer: error: "), (argv, err)
        assert fragment in lines[0], (argv, lines[0])


def test_max_context_length_for_evaluate_and_from_scratch(trained):
    from transformers import AutoTokenizer

    from hf_clusterformer.qa_training import DataArguments, ModelArguments, load_model

    tokenizer = AutoTokenizer.from_pretrained(trained)
    loaded = load_model(
        ModelArguments(model_name_or_path=str(trained), max_context_length=50_000), DataArguments(), tokenizer
    )
    assert loaded.config.max_context_length == 50_000
    scratch = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, window_size=32,
                   window_stride=24, max_question_length=16, cluster_layers=[1], num_clusters=4)
    from_length = load_model(ModelArguments(**scratch), DataArguments(max_seq_length=4096), tokenizer)
    assert from_length.config.max_context_length == 4096
    given = load_model(ModelArguments(**scratch, max_context_length=70_000), DataArguments(), tokenizer)
    assert given.config.max_context_length == 70_000


def test_convert_missing_source(workdir, capsys):
    assert main(["convert", str(workdir / "nothing"), str(workdir / "out")]) == 2
    assert capsys.readouterr().err.strip() == (
        f"clusterformer: error: source directory {workdir / 'nothing'} does not exist."
    )


def test_model_options_are_the_configs_fields_and_the_layer_kind_shortcuts(capsys):
    """One table of model options (`model_options`): every field `ClusterFormerConfig` adds, with the field's default
    and help (its metadata: no docstring parsing), plus the two constructor shortcuts of ``layer_kinds``; ``convert``
    has a flag for each, its help naming the config's default."""
    from dataclasses import fields

    from hf_clusterformer.configuration_clusterformer import LAYER_KIND_SHORTCUTS
    from hf_clusterformer.conversion import model_options

    options = model_options()
    added = {f.name for f in fields(ClusterFormerConfig)} - {f.name for f in fields(RobertaConfig)}
    assert set(options) == added | {"cluster_layers", "global_layer_type"}
    assert set(options) - added <= set(LAYER_KIND_SHORTCUTS)
    defaults = {f.name: f.default for f in fields(ClusterFormerConfig)}
    assert all(options[name].default == defaults[name] for name in added)
    assert all(
        options[name].help == f.metadata["help"] for f in fields(ClusterFormerConfig) if (name := f.name) in added
    )
    assert all(option.help and "``" not in option.help for option in options.values())
    with pytest.raises(SystemExit):
        main(["convert", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    for option in options.values():
        assert "--" + option.name.replace("_", "-") in out
    assert "(default: 224)" in out and "(default: 131072)" in out


def test_a_quoted_home_folder_and_a_folder_meant_by_a_trailing_slash(roberta_qa, model_dir, context, tmp_path,
                                                                     monkeypatch, capsys):
    """Rows: ``convert SRC "~/cfhome"`` (quoted, as in a script) wrote a literal ``./~/cfhome``; ``export MODEL out/``
    wrote an ONNX file named ``out``; ``card --out cards/`` wrote a file named ``cards``. A leading ``~`` is expanded
    as the shell would, a path ending in / is a folder."""
    from hf_clusterformer_cli_support import expand_home_options

    home, cwd = tmp_path / "home", tmp_path / "cwd"
    home.mkdir()
    cwd.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(cwd)
    small = ["--cluster-layers", "1", "--num-clusters", "4", "--window-size", "32", "--window-stride", "24",
             "--max-question-length", "16"]
    assert main(["convert", str(roberta_qa), "~/cfhome", *small]) == 0
    assert capsys.readouterr().out.startswith(f"wrote {home / 'cfhome'}, ")
    assert (home / "cfhome" / "config.json").is_file() and not (cwd / "~").exists()
    assert main(["predict", "~/cfhome", "--question", QUESTION, "--context-file", str(context[0])]) == 0
    assert main(["card", "~/cfhome", "--out", "~/cards/"]) == 0
    assert (home / "cards" / "README.md").is_file()
    capsys.readouterr()
    assert main(["export", str(model_dir), "out/"]) == 2
    line = capsys.readouterr().err.strip()
    assert line == ("clusterformer: error: out/ ends in /, so it names a folder; give the file to write, e.g. "
                    "out/model.onnx or out/model.pt2.")
    assert not (cwd / "out").exists()
    assert main(["convert", str(roberta_qa), "~nosuchuser-cf/out"]) == 2
    assert "there is no home folder ~nosuchuser-cf; give the full path" in capsys.readouterr().err
    assert expand_home_options(["--output_dir", "~/run", "--train-file=~/t.json", "--question", "~/q"]) == [
        "--output_dir", f"{home}/run", f"--train-file={home}/t.json", "--question", "~/q"]


def test_convert_and_the_pipeline_take_a_heads_key_as_its_task(roberta_qa, model_dir, workdir, capsys):
    """Row: ``clusterformer convert --task qa`` was refused although conversion takes either name (the pipeline task
    or the library's key)."""
    small = ["--cluster-layers", "1", "--num-clusters", "4", "--window-size", "32", "--window-stride", "24",
             "--max-question-length", "16"]
    assert main(["convert", str(roberta_qa), str(workdir / "by-key-qa"), "--task", "qa", *small]) == 0
    assert ", a question-answering model, " in capsys.readouterr().out
    assert main(["convert", str(roberta_qa), str(workdir / "by-key-mlm"), "--task", "mlm", "--allow-untrained",
                 *small]) == 0
    assert ", a fill-mask model, " in capsys.readouterr().out
    assert type(hf_clusterformer.pipeline(model=str(model_dir), task="qa")).__name__ == (
        "ClusterFormerQuestionAnsweringPipeline")
