"""run_qa end to end on tiny real data: the script on the generated long-range set (SQuAD-format files written by the
research package's command), evaluation of its checkpoint, the SQuAD-based multi-passage set, local SQuAD-format files
(flat records and the official nested layout), and the errors for bad data files and data sets."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForQuestionAnswering, AutoTokenizer, TrainingArguments

import hf_clusterformer  # noqa: F401  (registers the Auto classes)
from clusterformer_research.longrange import generate_longrange_dataset
from hf_clusterformer import qa_training
from hf_clusterformer.data import default_squad_path

ROOT = Path(__file__).resolve().parents[1]

#: A tiny from-scratch model: 32 wide, 3 layers, 32-token windows with stride 24, one cluster layer.
TINY_MODEL = [
    "--hidden_size", "32", "--num_hidden_layers", "3", "--num_attention_heads", "2", "--intermediate_size", "64",
    "--window_size", "32", "--window_stride", "24", "--max_question_length", "16",
    "--cluster_layers", "2", "--num_clusters", "8", "--vocab_size", "400",
]
#: Short generated contexts (`generated_files`) and a few optimizer steps on the CPU.
TINY_RUN = [
    "--train_samples", "16", "--eval_samples", "8", "--max_steps", "4",
    "--per_device_train_batch_size", "4", "--per_device_eval_batch_size", "8",
    "--centroid_update_steps", "2", "--save_strategy", "no", "--report_to", "none", "--use_cpu", "--seed", "0",
]


def _tiny_args(output_dir: Path, **data) -> tuple:
    """Argument dataclasses for an in-process `qa_training.run` of the tiny model (2 steps)."""
    model = qa_training.ModelArguments(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, window_size=32,
        window_stride=24, max_question_length=24, cluster_layers=[1], num_clusters=4, vocab_size=400,
    )
    data_args = qa_training.DataArguments(**data)
    centroids = qa_training.CentroidArguments(centroid_update_steps=1)
    training = TrainingArguments(
        output_dir=str(output_dir), do_train=True, do_eval=True, max_steps=2, per_device_train_batch_size=4,
        per_device_eval_batch_size=8, save_strategy="no", report_to="none", use_cpu=True, seed=0,
    )
    return model, data_args, centroids, training


def _write_jsonl(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def _nested_squad(records: list[dict], per_paragraph: int = 2) -> dict:
    """The official SQuAD v1.1 layout ({"data": [{"title", "paragraphs": [{"context", "qas"}]}]}) of records."""
    articles = []
    for start in range(0, len(records), per_paragraph):
        group = records[start : start + per_paragraph]
        qas = [
            {
                "id": r["id"],
                "question": r["question"],
                "answers": [
                    {"text": t, "answer_start": s} for t, s in zip(r["answers"]["text"], r["answers"]["answer_start"])
                ],
            }
            for r in group
        ]
        # One paragraph per group: every question of the group is asked about the group's first context.
        context = group[0]["context"]
        for qa, r in zip(qas, group):
            if r["context"] != context:
                offset = len(context) + 1
                context = context + " " + r["context"]
                for answer in qa["answers"]:
                    answer["answer_start"] += offset
        articles.append({"title": f"article {start}", "paragraphs": [{"context": context, "qas": qas}]})
    return {"version": "1.1", "data": articles}


@pytest.fixture(scope="module")
def generated_files(tmp_path_factory) -> dict[str, Path]:
    """Generated long-range training (16) and validation (8) files and their tokenizer, as the README says to make
    them: ``python -m clusterformer_research.longrange``."""
    folder = tmp_path_factory.mktemp("generated")
    common = ["--kind", "longrange", "--context_tokens", "200", "400", "--min_gap_tokens", "40", "--seed", "0"]
    env = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    for split, count, extra in (("train", "16", ["--tokenizer_dir", str(folder / "tokenizer"), "--vocab_size", "400"]),
                                ("validation", "8", [])):
        command = [sys.executable, "-m", "clusterformer_research.longrange", *common, "--split", split,
                   "--num_examples", count, "--out", str(folder / f"{split}.json"), *extra]
        result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
        assert result.returncode == 0, result.stderr[-3000:]
    return {
        "train": folder / "train.json", "validation": folder / "validation.json", "tokenizer": folder / "tokenizer"
    }


@pytest.fixture(scope="module")
def script_run(tmp_path_factory, generated_files) -> Path:
    """examples/run_qa.py trained 4 steps from scratch on the generated long-range files, in a subprocess."""
    output_dir = tmp_path_factory.mktemp("run_qa")
    command = [sys.executable, str(ROOT / "examples" / "run_qa.py"), "--train_file", str(generated_files["train"]),
               "--validation_file", str(generated_files["validation"]), "--tokenizer_name",
               str(generated_files["tokenizer"]), "--do_train", "--do_eval", "--output_dir", str(output_dir),
               *TINY_MODEL, *TINY_RUN]
    env = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return output_dir


def test_script_writes_metrics_in_range(script_run):
    results = json.loads((script_run / "all_results.json").read_text())
    metrics = results["metrics"]
    assert 0.0 <= metrics["eval_exact_match"] <= 100.0
    assert 0.0 <= metrics["eval_f1"] <= 100.0
    assert metrics["eval_f1"] >= metrics["eval_exact_match"]
    assert metrics["eval_samples"] == 8
    assert metrics["train_answers_truncated"] == 0
    assert metrics["train_loss"] > 0 and metrics["epoch"] == 1.0  # 16 examples / batch 4 = 4 steps
    assert results["data"]["train_file"].endswith("train.json") and results["model"]["window_size"] == 32
    predictions = json.loads((script_run / "eval_predictions.json").read_text())
    validation = generate_longrange_dataset(8, 0, (200, 400), "longrange", min_gap_tokens=40, split="validation")
    assert set(predictions) == {r["id"] for r in validation}
    for record in validation:
        assert predictions[record["id"]] in record["context"]


def test_script_checkpoint_reloads_with_fitted_centroids(script_run):
    model = AutoModelForQuestionAnswering.from_pretrained(script_run)
    assert type(model).__name__ == "ClusterFormerForQuestionAnswering"
    config = model.config
    assert (config.hidden_size, config.num_hidden_layers, config.window_size, config.window_stride) == (32, 3, 32, 24)
    assert config.layer_kinds == ["sliding", "sliding", "cluster"]
    router = model.cluster_routers()[2]
    assert bool(router.fitted), "CentroidUpdateCallback did not fit the centroids during training"
    assert torch.allclose(router.centroids.norm(dim=-1), torch.ones(8), atol=1e-5)

    tokenizer = AutoTokenizer.from_pretrained(script_run)
    assert len(tokenizer) == config.vocab_size
    encoding = tokenizer("Where does Zorvan live?", "Zorvan lives with Melka. Melka lives in Tarsk.",
                         return_tensors="pt")
    assert encoding["input_ids"][0, 0].item() == tokenizer.bos_token_id
    with torch.no_grad():
        out = model(**encoding)
    assert out.start_logits.shape == encoding["input_ids"].shape


def test_evaluating_the_checkpoint_reproduces_the_training_run_scores(script_run, generated_files, tmp_path):
    trained = json.loads((script_run / "all_results.json").read_text())["metrics"]
    argv = ["--model_name_or_path", str(script_run), "--validation_file", str(generated_files["validation"]),
            "--do_eval", "--output_dir", str(tmp_path), *TINY_RUN]
    metrics = qa_training.main(argv)
    assert "train_loss" not in metrics
    assert metrics["eval_exact_match"] == trained["eval_exact_match"]
    assert metrics["eval_f1"] == pytest.approx(trained["eval_f1"])
    assert json.loads((tmp_path / "eval_predictions.json").read_text()) == json.loads(
        (script_run / "eval_predictions.json").read_text()
    )


@pytest.mark.skipif(not default_squad_path().exists(), reason=f"SQuAD v1.1 dev not found at {default_squad_path()}")
def test_squad_multipassage_subset(tmp_path):
    model, data, centroids, training = _tiny_args(
        tmp_path, dataset="squad-multipassage", squad_path=str(default_squad_path()), train_samples=6, eval_samples=4,
        context_tokens_min=200, context_tokens_max=300,
    )
    model.max_question_length, model.vocab_size = 64, 1000  # SQuAD questions are long in a small BPE vocabulary
    metrics = qa_training.run(model, data, centroids, training)
    assert metrics["eval_samples"] == 4
    assert 0.0 <= metrics["eval_exact_match"] <= metrics["eval_f1"] <= 100.0
    raw = qa_training.load_raw_datasets(data)
    assert (len(raw["train"]), len(raw["validation"])) == (6, 4)
    assert not set(raw["train"]["id"]) & set(raw["validation"]["id"])
    predictions = json.loads((tmp_path / "eval_predictions.json").read_text())
    for row in raw["validation"]:
        assert row["context"].startswith("<p> ") and predictions[row["id"]] in row["context"]


def test_local_jsonl_train_and_nested_squad_json_validation(tmp_path):
    train = generate_longrange_dataset(8, 3, (60, 90), "local", min_gap_tokens=10, split="train")
    validation = generate_longrange_dataset(6, 3, (60, 90), "local", min_gap_tokens=10, split="validation")
    train_file = _write_jsonl(tmp_path / "train.jsonl", train)
    nested = _nested_squad(validation)
    validation_file = tmp_path / "dev.json"
    validation_file.write_text(json.dumps(nested), encoding="utf-8")

    data_args = qa_training.DataArguments(validation_file=str(validation_file))
    flattened = qa_training.load_raw_datasets(data_args)["validation"]
    assert len(flattened) == 6 and flattened[0]["title"] == "article 0"
    for row in flattened:  # the nested answers still point at their text in the merged paragraphs
        for text, start in zip(row["answers"]["text"], row["answers"]["answer_start"]):
            assert row["context"][start : start + len(text)] == text

    model, data, centroids, training = _tiny_args(
        tmp_path / "out", train_file=str(train_file), validation_file=str(validation_file)
    )
    metrics = qa_training.run(model, data, centroids, training)
    assert metrics["eval_samples"] == 6
    assert 0.0 <= metrics["eval_exact_match"] <= metrics["eval_f1"] <= 100.0
    predictions = json.loads((tmp_path / "out" / "eval_predictions.json").read_text())
    assert set(predictions) == {r["id"] for r in validation}
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "out")  # built on the training file's texts and saved
    assert len(tokenizer) <= 400


def test_local_json_list_of_records(tmp_path):
    records = generate_longrange_dataset(5, 4, (60, 90), "local", min_gap_tokens=10)
    path = tmp_path / "records.json"
    path.write_text(json.dumps(records), encoding="utf-8")
    raw = qa_training.load_raw_datasets(qa_training.DataArguments(train_file=str(path), validation_file=str(path)))
    assert raw["train"]["id"] == [r["id"] for r in records]
    assert raw["validation"][2]["answers"] == records[2]["answers"]


def _records(count: int = 6) -> list[dict]:
    return generate_longrange_dataset(count, 5, (60, 90), "local", min_gap_tokens=10)


def test_missing_columns_are_named(tmp_path):
    rows = [{k: v for k, v in r.items() if k != "question"} for r in _records()]
    without_question = _write_jsonl(tmp_path / "a.jsonl", rows)
    model, data, centroids, training = _tiny_args(tmp_path / "out", train_file=str(without_question))
    training.do_eval = False
    with pytest.raises(ValueError, match=r"train data \(6 rows\) lack column\(s\) \['question'\]"):
        qa_training.run(model, data, centroids, training)

    rows = [{k: v for k, v in r.items() if k != "answers"} for r in _records(4)]
    without_answers = _write_jsonl(tmp_path / "b.jsonl", rows)
    data = qa_training.DataArguments(validation_file=str(without_answers))
    with pytest.raises(ValueError, match=r"validation data \(4 rows\) lack column\(s\) \['answers'\]"):
        qa_training.load_raw_datasets(data)
    # flat records under "data" load as those records: test_data_files_in_two_near_layouts_load_or_say_the_fix


def test_answers_not_in_context_are_counted(tmp_path):
    records = _records(6)
    records[1]["answers"] = {"text": ["Paris"], "answer_start": [3]}
    records[4]["answers"] = {"text": [records[4]["answers"]["text"][0]], "answer_start": [0]}
    path = _write_jsonl(tmp_path / "bad.jsonl", records)
    model, data, centroids, training = _tiny_args(tmp_path / "out", train_file=str(path))
    training.do_eval = False
    with pytest.raises(
        ValueError, match=r"2 of 6 train examples have an answer text not found at its answer_start \(rows \[1, 4\]\)"
    ):
        qa_training.run(model, data, centroids, training)


def test_answer_offset_errors_count_the_whole_dataset(tmp_path):
    """Counts and row numbers cover every row, not one tokenisation batch of 1,000."""
    rows = [{"id": str(i), "title": "t", "question": "Where?", "context": f"Row {i} is in Paris.",
             "answers": {"text": ["Paris"], "answer_start": [len(f"Row {i} is in ")]}} for i in range(2500)]
    for row in (5, 2100):
        rows[row]["answers"]["answer_start"] = [0]
    path = _write_jsonl(tmp_path / "many.jsonl", rows)
    with pytest.raises(
        ValueError,
        match=r"2 of 2500 validation examples .* \(rows \[5, 2100\]\); answer_start is the character offset",
    ):
        qa_training.load_raw_datasets(qa_training.DataArguments(validation_file=str(path), eval_samples=0))
    rows[5]["answers"]["answer_start"] = [len("Row 5 is in ")]
    rows[2100]["answers"]["answer_start"] = [len("Row 2100 is in ")]
    path = _write_jsonl(tmp_path / "fixed.jsonl", rows)
    raw = qa_training.load_raw_datasets(qa_training.DataArguments(validation_file=str(path), eval_samples=0))
    assert len(raw["validation"]) == 2500


def test_missing_and_unsupported_files(tmp_path):
    missing = tmp_path / "nowhere.jsonl"
    with pytest.raises(FileNotFoundError, match=f"data file {missing} does not exist"):
        qa_training.load_raw_datasets(qa_training.DataArguments(train_file=str(missing)))
    csv = tmp_path / "data.csv"
    csv.write_text("question,context\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"must be \.json or \.jsonl"):
        qa_training.load_raw_datasets(qa_training.DataArguments(validation_file=str(csv)))
    with pytest.raises(FileNotFoundError, match="SQuAD file not found"):
        qa_training.load_raw_datasets(
            qa_training.DataArguments(dataset="squad-multipassage", squad_path=str(tmp_path / "squad.zip"))
        )


def test_no_data_and_the_former_generated_sets_are_refused_with_the_way_to_files():
    """The library reads SQuAD-format data only; the generated sets come as files from the research package."""
    with pytest.raises(ValueError, match=r"^no data: give --validation_file \(SQuAD-format json/jsonl\) to evaluate "
                                         r"and --train_file to train"):
        qa_training.load_raw_datasets(qa_training.DataArguments())
    for name in ("longrange", "local"):
        with pytest.raises(ValueError, match=rf"--dataset {name}: .* clusterformer_research.longrange --kind {name}"):
            qa_training.load_raw_datasets(qa_training.DataArguments(dataset=name))
    with pytest.raises(ValueError, match="invalid choice|unrecognized|min_gap_tokens"):
        qa_training.parse_args(["--min_gap_tokens", "30", "--output_dir", "out"], usage_errors_raise=True)


def test_train_without_training_data_is_refused(tmp_path):
    path = _write_jsonl(tmp_path / "dev.jsonl", _records(3))
    model, data, centroids, training = _tiny_args(tmp_path / "out", validation_file=str(path))
    with pytest.raises(ValueError, match="--do_train needs training data"):
        qa_training.run(model, data, centroids, training)


def test_runs_are_reproducible_by_seed(tmp_path):
    """The from-scratch initialisation, batches and centroids follow --seed: equal seeds, equal runs."""
    path = _write_jsonl(tmp_path / "train.jsonl", _records(8))
    runs = []
    for index, seed in enumerate((0, 0, 1)):
        model, data, centroids, training = _tiny_args(tmp_path / f"out{index}", train_file=str(path))
        centroids.centroid_backend = "torch"
        training.do_eval, training.seed = False, seed
        loss = qa_training.run(model, data, centroids, training)["train_loss"]
        runs.append((loss, load_file(tmp_path / f"out{index}" / "model.safetensors")))
    (loss_a, weights_a), (loss_b, weights_b), (loss_c, _) = runs
    assert loss_a == loss_b != loss_c
    assert all(torch.equal(weights_a[name], weights_b[name]) for name in weights_a)


def test_questions_longer_than_the_model_allows_fail_before_training(tmp_path):
    from transformers import TrainingArguments

    from hf_clusterformer.qa_training import CentroidArguments, DataArguments, ModelArguments, run

    model = ModelArguments(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                           cluster_layers=[1], num_clusters=4, window_size=32, window_stride=24, max_question_length=3)
    path = _write_jsonl(tmp_path / "train.jsonl", _records(8))
    data = DataArguments(train_file=str(path))
    training = TrainingArguments(
        output_dir=str(tmp_path), do_train=True, max_steps=1, report_to="none", save_strategy="no"
    )
    with pytest.raises(ValueError, match=r"8 of 8 training questions have more than max_question_length=3"):
        run(model, data, CentroidArguments(), training)


def test_model_flags_are_the_model_options():
    """Every model option (`model_options`) is a run_qa flag, unset by default (a checkpoint keeps its own value);
    ``--cluster_layers`` alone is the sliding-window baseline, as for ``clusterformer convert``."""
    from dataclasses import fields

    from hf_clusterformer.conversion import model_options

    defaults = {f.name: f.default for f in fields(qa_training.ModelArguments)}
    assert all(defaults[name] is None for name in model_options())
    model, *_ = qa_training.parse_args(["--cluster_layers", "--num_clusters", "8", "--output_dir", "out"])
    assert model.cluster_options() == {"cluster_layers": [], "num_clusters": 8}
    model, *_ = qa_training.parse_args(["--layer_kinds", "sliding", "lsh", "--output_dir", "out"])
    assert model.cluster_options() == {"layer_kinds": ["sliding", "lsh"]}


def test_window_cluster_layers_get_their_centroids_fitted(tmp_path):
    """The centroid callback is attached for every kind with centroids, not only the paper's cluster layers."""
    import dataclasses

    records = generate_longrange_dataset(8, 3, (60, 90), "local", min_gap_tokens=10, split="train")
    train_file = _write_jsonl(tmp_path / "train.jsonl", records)
    model, data, centroids, training = _tiny_args(tmp_path / "out", train_file=str(train_file))
    model = dataclasses.replace(model, global_layer_type="window_cluster")
    training.do_eval = False
    qa_training.run(model, data, centroids, training)
    trained = AutoModelForQuestionAnswering.from_pretrained(tmp_path / "out")
    assert trained.config.layer_kinds == ["sliding", "window_cluster"]
    assert bool(trained.cluster_routers()[1].fitted), "a window_cluster layer's centroids were never fitted"


def test_routed_learning_rate_scale_trains_the_zero_started_projection_at_its_own_rate(tmp_path, caplog):
    """``--routed_learning_rate_scale``: the window_cluster layer's ``routed_output`` gets its own optimizer groups at
    that factor of the rate (with and without weight decay), the scheduler scales them alike; 1 keeps Trainer's
    groups; a model without such a layer is warned about; a factor that is not positive is refused before anything
    loads."""
    from helpers import sentence_tokenizer, tiny_config

    from hf_clusterformer import ClusterFormerForQuestionAnswering

    model = ClusterFormerForQuestionAnswering(tiny_config(cluster_layers=[1], global_layer_type="window_cluster"))
    routed = {id(p) for p in model.roberta.encoder.layer[1].routed_output.parameters()}
    args = TrainingArguments(output_dir=str(tmp_path), learning_rate=1e-3, warmup_steps=2, report_to="none",
                             use_cpu=True, weight_decay=0.01)
    rates = {}
    for scale in (1.0, 30.0):
        trainer = qa_training.make_trainer(model, args, None, sentence_tokenizer(), [], scale)
        trainer.create_optimizer_and_scheduler(num_training_steps=10)
        groups = trainer.optimizer.param_groups
        assert sum(len(g["params"]) for g in groups) == sum(1 for p in model.parameters() if p.requires_grad)
        rates[scale] = sorted((g["initial_lr"] / 1e-3, g["weight_decay"],
                               {id(p) in routed for p in g["params"]} == {True}) for g in groups)
        trainer.optimizer.step()  # no gradients yet: nothing moves; the schedule takes its first step
        trainer.lr_scheduler.step()
        assert [g["lr"] for g in groups] == pytest.approx([r / 2 for r in trainer.lr_scheduler.base_lrs])
        assert trainer.create_optimizer() is trainer.optimizer and len(trainer.optimizer.param_groups) == len(groups)
    assert rates[1.0] == [(pytest.approx(1.0), 0.0, False), (pytest.approx(1.0), 0.01, False)]  # Trainer's own
    assert rates[30.0] == [(pytest.approx(1.0), 0.0, False), (pytest.approx(1.0), 0.01, False),
                           (pytest.approx(30.0), 0.0, True), (pytest.approx(30.0), 0.01, True)]
    plain = ClusterFormerForQuestionAnswering(tiny_config(cluster_layers=[1]))  # the paper's layer: nothing to scale
    with caplog.at_level("WARNING", logger="hf_clusterformer.qa_training"):
        qa_training.make_trainer(plain, args, None, sentence_tokenizer(), [], 30.0).create_optimizer()
    assert "routed_learning_rate_scale 30.0 changes nothing: the model has no window_cluster layer" in caplog.text
    own = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(ValueError, match="applies to the optimizer the Trainer creates"):
        qa_training.RoutedRateTrainer(model=model, args=args, optimizers=(own, None), routed_learning_rate_scale=30)
    with pytest.raises(ValueError, match="--routed_learning_rate_scale must be positive, got 0.0"):
        qa_training.parse_args(["--routed_learning_rate_scale", "0", "--output_dir", "out"])


@pytest.mark.parametrize("head", [False, True])
def test_unanswerable_validation_questions_use_the_answerability_head_or_are_said(tmp_path, caplog, head):
    """Row: evaluating SQuAD 2.0 data (questions without an answer) never gave the empty answer, even with the
    answerability head, and said nothing. With the head, evaluation scores "no answer" as the pipeline does; without
    it, one warning says how many questions it cannot answer."""
    train = generate_longrange_dataset(8, 3, (60, 90), "local", min_gap_tokens=10, split="train")
    validation = generate_longrange_dataset(4, 3, (60, 90), "local", min_gap_tokens=10, split="validation")
    for row in validation[:2]:
        row["answers"] = {"text": [], "answer_start": []}
    model, data, centroids, training = _tiny_args(
        tmp_path, train_file=str(_write_jsonl(tmp_path / "train.jsonl", train)),
        validation_file=str(_write_jsonl(tmp_path / "dev.jsonl", validation)))
    model.use_answerability_head = head
    with caplog.at_level("WARNING", logger="hf_clusterformer.qa_training"):
        metrics = qa_training.run(model, data, centroids, training)
    said = [r.getMessage() for r in caplog.records if "have no answer (SQuAD 2.0)" in r.getMessage()]
    assert said == ([] if head else ["2 of 4 validation questions have no answer (SQuAD 2.0), which a model without "
                                     "the answerability head (--use_answerability_head) never gives."])
    predictions = json.loads((tmp_path / "eval_predictions.json").read_text())
    assert len(predictions) == 4 and 0.0 <= metrics["eval_f1"] <= 100.0
    if not head:
        assert all(predictions.values())  # a span for every question


def test_data_files_in_two_near_layouts_load_or_say_the_fix(tmp_path):
    """Rows: JSON lines in a .json file said "fix that line" (the fix is the name .jsonl); ``{"data": [flat
    records]}`` said "lack column(s) ... found ['data']"."""
    records = generate_longrange_dataset(3, 3, (60, 90), "local", min_gap_tokens=10, split="validation")
    lines = _write_jsonl(tmp_path / "lines.json", records)
    with pytest.raises(ValueError, match=r"line 2 column 1 \(Extra data\); it holds one JSON value a line: name it "
                                         r"\.jsonl\.$"):
        qa_training.load_raw_datasets(qa_training.DataArguments(validation_file=str(lines)))
    wrapped = tmp_path / "wrapped.json"
    wrapped.write_text(json.dumps({"data": records}), encoding="utf-8")
    loaded = qa_training.load_raw_datasets(qa_training.DataArguments(validation_file=str(wrapped)))["validation"]
    assert [row["id"] for row in loaded] == [r["id"] for r in records]
