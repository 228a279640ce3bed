"""The research studies' one training loop (`clusterformer_research.training.train_stages`) on a tiny model: stages,
the gate, rehearsal, the learning curve, and a resume that gives the numbers of a run that never stopped."""

from __future__ import annotations

import pytest
import torch
from helpers import PAD, random_example, tiny_config

from clusterformer_research.training import CHECKPOINT_NAME, Gate, TrainStage, learning_rate_factor, train_stages
from hf_clusterformer import CentroidUpdater, ClusterFormerForQuestionAnswering
from hf_clusterformer.centroid_updates import CentroidUpdateSettings


def features(count: int, context: int, seed: int) -> list[dict]:
    generator = torch.Generator().manual_seed(seed)
    rows = []
    for _ in range(count):
        ids = random_example(generator, 3, context)
        start = int(torch.randint(6, len(ids) - 2, (1,), generator=generator))
        rows.append({"input_ids": ids, "start_positions": start, "end_positions": start + 1})
    return rows


def build(seed: int = 0):
    torch.manual_seed(seed)
    model = ClusterFormerForQuestionAnswering(tiny_config(hidden_dropout_prob=0.1)).train()
    settings = CentroidUpdateSettings.build(update_every_steps=3, memory_size=500, min_states=16, backend="torch",
                                            seed=seed)
    return model, CentroidUpdater(model, settings)


def stages(gate: Gate | None = None, order: str = "sequential") -> list[TrainStage]:
    near, far = features(24, 20, 1), features(24, 60, 2)
    return [TrainStage("near", near, 6, 4, 1e-3, warmup=2, gate=gate, order=order),
            TrainStage("far", far, 6, 2, 5e-4, warmup=2, rehearsal=near, rehearsal_batch=2, order=order)]


def held_out(model) -> dict:
    """A deterministic metric of the weights (the mean start logit on fixed inputs) and the router's centroids."""
    ids = torch.tensor([random_example(torch.Generator().manual_seed(9), 3, 40)])
    logits = model(input_ids=ids, attention_mask=torch.ones_like(ids)).start_logits
    routers = model.cluster_routers()
    return {"score": round(float(logits.mean()) * 1e3, 6),
            "centroids": round(float(sum(r.centroids.abs().sum() for r in routers.values())), 6)}


def run(checkpoint_dir=None, stop_after: int | None = None, **options):
    model, updater = build()
    printed: list[str] = []

    def stop(point):
        if stop_after is not None and point["global_step"] >= stop_after:
            raise KeyboardInterrupt

    try:
        result = train_stages(model, stages(**options), pad_id=PAD, evaluate=held_out, eval_every=2, updater=updater,
                              seed=3, checkpoint_dir=checkpoint_dir, checkpoint_every=2, log_every=2,
                              print_fn=printed.append, on_point=stop)
    except KeyboardInterrupt:
        return None, printed
    return result, printed


@pytest.mark.parametrize("order", ["sequential", "epochs"])
def test_a_resumed_run_gives_the_numbers_of_one_that_never_stopped(tmp_path, order):
    whole, _ = run(order=order)
    assert [p["global_step"] for p in whole["curve"]] == [2, 4, 6, 8, 10, 12]
    assert whole["stages"] == {"near": 6, "far": 6}
    assert len({p["score"] for p in whole["curve"]}) == 6  # training moves the weights
    assert whole["curve"][-1]["centroids"] != whole["curve"][0]["centroids"]  # and the refits the centroids
    for stop_after in (4, 8):  # inside the near stage, and inside the far one (dropout, order, optimizer, banks)
        folder = tmp_path / f"{order}-{stop_after}"
        stopped, _ = run(folder, stop_after=stop_after, order=order)
        assert stopped is None and (folder / CHECKPOINT_NAME).is_file()
        resumed, printed = run(folder, order=order)
        assert any("resumed from" in line for line in printed)
        assert same_curve(resumed["curve"], whole["curve"])
    again, printed = run(folder, order=order)  # a finished run returns its record at once
    assert same_curve(again["curve"], whole["curve"]) and not any("s/step" in line for line in printed)


def same_curve(first: list[dict], second: list[dict]) -> bool:
    """Equal points but the seconds; the centroids to float rounding (a restored memory bank lists its states from
    the oldest, so K-Means sums them in another order)."""
    strip = lambda curve: [{k: v for k, v in p.items() if k not in ("seconds", "centroids")} for p in curve]  # noqa: E731
    return strip(first) == strip(second) and [p["centroids"] for p in first] == pytest.approx(
        [p["centroids"] for p in second], rel=1e-6)


def test_the_gate_ends_a_stage_at_the_mean_of_its_last_evaluations():
    gate = Gate("score", -1e9, evaluations=2)  # passes at the second evaluation of the stage
    result, printed = run(gate=gate)
    assert result["stages"] == {"near": 4, "far": 6}
    assert [(p["stage"], p["step"]) for p in result["curve"]] == [("near", 2), ("near", 4), ("far", 2), ("far", 4),
                                                                    ("far", 6)]
    assert any("gate score" in line and "passed at step 4" in line for line in printed)
    assert Gate("m", 85).passed([{"m": 90.7}]) and not Gate("m", 85, 2).passed([{"m": 66.0}, {"m": 90.7}])
    assert Gate("m", 85, 2).passed([{"m": 50.0}, {"m": 84.0}, {"m": 86.0}])


def test_progress_lines_carry_the_stage_step_and_an_eta():
    _, printed = run()
    lines = [line for line in printed if "s/step" in line]
    assert lines[0].startswith("[run] near step 2/6 loss ") and "ETA" in lines[0]
    assert lines[-1].startswith("[run] far step 6/6") and lines[-1].endswith("ETA 0.0 min")


def test_stage_options_are_checked():
    with pytest.raises(ValueError, match="order"):
        TrainStage("x", [], 1, 1, 1e-3, order="random")
    with pytest.raises(ValueError, match="schedule"):
        TrainStage("x", [], 1, 1, 1e-3, schedule="cosine")
    with pytest.raises(ValueError, match="rehearsal"):
        TrainStage("x", [], 1, 1, 1e-3, rehearsal_batch=2)
    linear = learning_rate_factor("linear", 2, 10)
    assert [round(linear(s), 3) for s in (0, 1, 5, 9)] == [0.5, 1.0, 0.625, 0.125]


def test_a_checkpoint_of_other_stages_is_refused(tmp_path):
    run(tmp_path, stop_after=4)
    model, updater = build()
    other = stages()
    other[1].steps = 7
    with pytest.raises(ValueError, match="other stages or seed"):
        train_stages(model, other, pad_id=PAD, evaluate=held_out, eval_every=2, updater=updater, seed=3,
                     checkpoint_dir=tmp_path, print_fn=lambda line: None)


def test_a_stage_over_its_time_share_trains_fewer_steps():
    model, updater = build()
    plan = stages()
    plan[0].steps, plan[0].max_seconds = 400, 1e-3
    printed: list[str] = []
    result = train_stages(model, plan, pad_id=PAD, updater=updater, log_every=50, print_fn=printed.append)
    assert result["stages"] == {"near": 31, "far": 6}
    assert any("near: " in line and "s projected for 400 steps" in line and ": 31 steps" in line for line in printed)


def test_a_stage_with_its_own_evaluation_uses_it_and_trains_the_same():
    model, updater = build()
    plan = stages()
    plan[0].evaluate = lambda m: {"score_only": held_out(m)["score"]}  # e.g. only the metric a gate reads
    result = train_stages(model, plan, pad_id=PAD, evaluate=held_out, eval_every=2, updater=updater, seed=3,
                          print_fn=lambda line: None)
    baseline, _ = run()
    assert [sorted(p) for p in result["curve"][:3]] == [["global_step", "loss", "score_only", "seconds", "stage",
                                                         "step"]] * 3
    assert [p["score_only"] for p in result["curve"][:3]] == [p["score"] for p in baseline["curve"][:3]]
    assert result["curve"][3:] == [{**p, "seconds": q["seconds"]} for p, q in zip(baseline["curve"][3:],
                                                                                  result["curve"][3:])]
