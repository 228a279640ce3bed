"""The fine-tuning comparison (`clusterformer_research.experiment`) and the GPU machine's one command, at tiny
sizes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from clusterformer_research.experiment import compare, make_preset

ROOT = Path(__file__).resolve().parents[2]


def test_smoke_recipe_trains_every_variant_and_writes_its_report(tmp_path):
    preset = make_preset("smoke")
    result = compare(preset, tmp_path, name="smoke", device="cpu", workers=1, threads=1, save_models=True)
    runs = {run["variant"]: run for run in result["runs"]}
    assert set(runs) == {"clusterformer", "sliding", "lsh", "sparse"}
    for run in runs.values():
        assert set(run["scores"]) == {"twin", "longrange", "local"}
        assert all(0 <= score["exact_match"] <= 100 and score["n"] == preset.eval_samples
                   for score in run["scores"].values())
        assert [entry["step"] for entry in run["log"] if entry["stage"] == "far"][-1] == preset.stages[-1].steps
    assert 0 <= runs["clusterformer"]["scores"]["twin"]["twin_shared_chunk"] <= 100
    for run in runs.values():  # a learning curve every curve_every steps and at the end: near EM, then far EM too
        steps = [point["global_step"] for point in run["curve"]]
        assert steps == sorted(steps) and steps[-1] == sum(stage.steps for stage in preset.stages)
        assert all(0 <= point["near_twin_em"] <= 100 for point in run["curve"])
        assert all(("twin_em" in point) == (point["stage"] == "far") for point in run["curve"])  # near: far_curve off
        assert all(0 <= point["twin_em"] <= 100 for point in run["curve"] if point["stage"] == "far")
    assert all(p["twin_shared_chunk"] is not None for p in runs["clusterformer"]["curve"] if p["stage"] == "far")
    assert all(p.get("twin_shared_chunk") is None for p in runs["sliding"]["curve"])
    assert set(result["meta"]["positional_shortcuts"]) == {"first_fact", "last_fact", "best_fact_slot", "chance",
                                                           "random_mention"}
    assert "Learning curves" in (tmp_path / "results.md").read_text() and (tmp_path / "curves.png").stat().st_size > 0
    assert result["meta"]["device"] == "cpu" and result["meta"]["skipped"] == []
    table = (tmp_path / "results.md").read_text()
    assert "| clusterformer | 1 |" in table and "one-hop far (twin) EM" in table
    assert (tmp_path / "results.png").stat().st_size > 0
    saved = json.loads((tmp_path / "clusterformer" / "config.json").read_text())
    assert saved["model_type"] == "clusterformer" and saved["pair_token_types"] is True


def test_far_twin_mentions_lie_beyond_the_sliding_stacks_reach():
    """Every recipe's far questions keep their two mentions further apart than its windows can relay."""
    for name in ("demo", "gain", "gain-gpu", "study", "cpu", "gpu"):
        preset = make_preset(name)
        sliding_layers = preset.num_hidden_layers or 6  # MiniLM has 6 layers
        for kind, options in [*preset.stages[-1].data.items(), *preset.eval.items()]:
            if kind in ("twin", "longrange"):
                assert options["min_gap_tokens"] > sliding_layers * preset.window_size, (name, kind)


@pytest.mark.skipif(sys.platform == "win32", reason="bash script")
def test_device_script_runs_at_tiny_sizes(tmp_path):
    env = {**os.environ, "SIZE": "tiny", "PYTHON": sys.executable, "OMP_NUM_THREADS": "1",
           "PARTS": "encoder kmeans reproduce study gain"}
    done = subprocess.run(["bash", str(ROOT / "bench" / "device_run.sh"), str(tmp_path)], env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    summary = (tmp_path / "summary.txt").read_text()
    for step in ("encoder", "kmeans", "reproduce", "study", "gain"):
        assert f"== {step}: exit 0" in summary
    gain = json.loads((tmp_path / "gain" / "results.json").read_text())
    assert {run["variant"] for run in gain["runs"]} == {"clusterformer", "sliding"}
    study = json.loads((tmp_path / "study" / "results.json").read_text())
    assert {run["variant"] for run in study["runs"]} == {"clusterformer", "clusterformer-prefix", "sliding"}
    assert all(run["curve"] for run in study["runs"])
    rows = json.loads((tmp_path / "encoder.json").read_text())["rows"]
    assert {row["model"] for row in rows} >= {"clusterformer", "floor", "longformer", "bigbird", "modernbert"}
    assert {row["mode"] for row in rows} == {"forward", "train"}
    assert (tmp_path / "results.md").is_file()


def _setup(tmp_path, preset):
    import torch

    from clusterformer_research.experiment import RunSetup
    from clusterformer_research.experiment.running import resolve_pretrained

    source = resolve_pretrained(preset, None, tmp_path)
    return RunSetup(preset, source, tmp_path, torch.device("cpu"), torch.float32, threads=1)


def test_a_run_over_its_time_share_trains_fewer_steps_and_later_runs_match(tmp_path):
    from clusterformer_research.experiment import run_one

    preset = make_preset("smoke")
    for stage in preset.stages:
        stage.steps = 400
    setup = _setup(tmp_path, preset)
    first = run_one(setup, "clusterformer", 0, train_seconds=0.5)
    assert all(30 <= steps < 400 for steps in first["steps"].values())
    second = run_one(setup, "sliding", 0)
    assert second["steps"] == first["steps"]
    assert [e["step"] for e in second["log"] if e["stage"] == "far"][-1] == first["steps"]["far"]


def test_runs_are_deterministic(tmp_path):
    from clusterformer_research.experiment import run_one

    setup = _setup(tmp_path, make_preset("smoke"))
    runs = [run_one(setup, "clusterformer", 0) for _ in range(2)]
    for run in runs:
        run.pop("train_seconds"), run.pop("eval_seconds")
        for entry in run["log"]:
            entry.pop("seconds")
    assert runs[0] == runs[1]


def test_positional_shortcuts_count_fact_slots():
    from clusterformer_research.experiment import positional_shortcuts

    records = [{"context": "A lives in X. B lives in Y. C lives in X. D lives in Z.", "answers": {"text": ["X"]}},
               {"context": "A lives in Y. B lives in Z. C lives in W. D lives in Z.", "answers": {"text": ["Z"]}}]
    assert positional_shortcuts(records) == {"first_fact": 50.0, "last_fact": 50.0, "best_fact_slot": 50.0,
                                             "chance": 33.3, "random_mention": 50.0}


def test_learning_rate_schedules_and_cluster_layer_groups():
    from clusterformer_research.experiment.running import parameter_groups
    from clusterformer_research.training import learning_rate_factor

    constant, linear = learning_rate_factor("constant", 10, 100), learning_rate_factor("linear", 10, 100)
    assert [round(constant(s), 2) for s in (0, 9, 50, 99)] == [0.1, 1.0, 1.0, 1.0]
    assert [round(linear(s), 2) for s in (0, 9, 55, 99)] == [0.1, 1.0, 0.5, 0.01]
    with pytest.raises(ValueError, match="schedule"):
        learning_rate_factor("cosine", 10, 100)
    from helpers import tiny_config

    from hf_clusterformer import ClusterFormerForQuestionAnswering

    model = ClusterFormerForQuestionAnswering(tiny_config(cluster_layers=[1]))
    preset = make_preset("smoke")
    preset.cluster_lr_scale = 5.0
    rest, fast = parameter_groups(model, preset, 1e-4)
    assert fast["lr"] == 5e-4 and rest["lr"] == 1e-4
    names = {id(p): n for n, p in model.named_parameters()}
    assert all(".layer.1." in names[id(p)] for p in fast["params"])
    assert len(fast["params"]) + len(rest["params"]) == len(list(model.parameters()))

    model = ClusterFormerForQuestionAnswering(tiny_config(cluster_layers=[1], global_layer_type="window_cluster"))
    preset.routed_lr_scale = 30.0
    rest, routed, fast = parameter_groups(model, preset, 1e-4)
    assert (rest["lr"], fast["lr"], routed["lr"]) == (1e-4, 5e-4, 3e-3)
    assert {names_of(model)[id(p)] for p in routed["params"]} == {
        "roberta.encoder.layer.1.routed_output.weight", "roberta.encoder.layer.1.routed_output.bias"}
    assert sum(len(g["params"]) for g in (rest, fast, routed)) == len(list(model.parameters()))


def names_of(model) -> dict[int, str]:
    return {id(p): n for n, p in model.named_parameters()}


def test_the_smoke_vocabulary_and_weights_are_the_same_in_every_process(tmp_path):
    """String hashing differs between processes; the smoke recipe's tokenizer and random BERT must not."""
    script = ("import sys; from pathlib import Path; from clusterformer_research.experiment.running import tiny_bert; "
              "from clusterformer_research.experiment.running import generate; "
              "corpus = [r['context'] for r in generate('twin', {'context_tokens': (70, 90), 'min_gap_tokens': 30}, "
              "20, 'corpus', 0, 4)]; tiny_bert(Path(sys.argv[1]), corpus)")
    folders = []
    for hash_seed in ("1", "2"):
        folder = tmp_path / hash_seed
        env = {**os.environ, "PYTHONHASHSEED": hash_seed}
        subprocess.run([sys.executable, "-c", script, str(folder)], env=env, check=True, capture_output=True)
        folders.append(folder)
    assert (folders[0] / "tokenizer.json").read_text() == (folders[1] / "tokenizer.json").read_text()
    assert (folders[0] / "model.safetensors").read_bytes() == (folders[1] / "model.safetensors").read_bytes()
