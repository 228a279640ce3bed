"""The one training loop of the research studies: stages, a gate, learning curves, checkpoints that resume.

Every study (the twin study, the fine-tuning experiments behind ``make demo``, the real-text study) trains a QA
model through `train_stages`:

* a list of `TrainStage`s run in order, each with its own features, steps, batch size, learning rate, warm-up and
  schedule, data order, an optional rehearsal batch (features of an earlier stage kept in every step) and an optional
  `Gate` that ends the stage early once a held-out metric is reached;
* ``evaluate(model) -> {metric: value}`` every ``eval_every`` steps and at the end of every stage (the learning
  curve, which the gate reads);
* `CentroidUpdater.step` after every optimizer step (the centroid refits);
* one progress line per ``log_every`` steps with the stage, step, loss, seconds per step and an ETA;
* with ``checkpoint_dir``, the whole state (weights and centroids, optimizer, schedule, updater and its memory
  banks, random states, data order, the curve) saved every ``checkpoint_every`` steps and at every stage's end, in
  one file replaced at once; the same call with the same folder resumes from it and gives the same numbers as a
  run that never stopped.

Features are dicts with ``input_ids`` (list of ids), ``start_positions`` and ``end_positions`` (ints).
"""

from __future__ import annotations

import json
import math
import os
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

__all__ = ["CHECKPOINT_NAME", "Gate", "TrainStage", "learning_rate_factor", "pad_batch", "qa_loss", "scaled_groups",
           "train_stages", "zero_started"]

#: The checkpoint file inside ``checkpoint_dir``.
CHECKPOINT_NAME = "training-state.pt"

Feature = dict[str, Any]
Evaluate = Callable[[torch.nn.Module], dict[str, float]]


@dataclass
class Gate:
    """End a stage at the first evaluation where the mean of ``metric`` over this stage's last ``evaluations``
    evaluations reaches ``threshold`` (1: that evaluation alone; 2: it and the one before)."""

    metric: str
    threshold: float
    evaluations: int = 1

    def passed(self, points: list[dict]) -> bool:
        """Whether the stage's curve ``points`` (oldest first) pass the gate."""
        recent = [p[self.metric] for p in points[-self.evaluations:]]
        return len(recent) == self.evaluations and float(np.mean(recent)) >= self.threshold


@dataclass
class TrainStage:
    """One stage of training.

    ``order``: ``sequential`` takes features in order, wrapping around (step s takes rows (s-1) B ... s B - 1 modulo
    the count); ``epochs`` draws a permutation of the features from the loop's generator per pass and drops the last
    partial batch. ``rehearsal``: features (e.g. an earlier stage's) of which ``rehearsal_batch`` more, in order, go
    through their own forward pass in every step; the step's loss is the mean over both batches' examples.
    ``schedule``: ``constant`` (linear warm-up over ``warmup`` steps, then flat) or ``linear`` (warm-up, then linear
    decay to 0). ``max_seconds``: after timing steps 10-30, train fewer steps when all of them would take longer.
    ``param_groups``: optimizer groups of the model (default: every trainable parameter at ``learning_rate``).
    ``evaluate``: this stage's own curve evaluation (default: the loop's), e.g. only the metric its gate reads.
    """

    name: str
    data: Sequence[Feature]
    steps: int
    batch_size: int
    learning_rate: float
    warmup: int = 30
    schedule: str = "constant"
    order: str = "sequential"
    weight_decay: float = 0.01
    gate: Gate | None = None
    rehearsal: Sequence[Feature] = ()
    rehearsal_batch: int = 0
    max_seconds: float | None = None
    param_groups: Callable[[torch.nn.Module, float], list[dict]] | None = None
    evaluate: Evaluate | None = None

    def __post_init__(self) -> None:
        if self.order not in ("sequential", "epochs"):
            raise ValueError(f"order must be 'sequential' or 'epochs', got {self.order!r}")
        learning_rate_factor(self.schedule, self.warmup, self.steps)  # checks the schedule's name
        if self.rehearsal_batch and not self.rehearsal:
            raise ValueError(f"stage {self.name!r}: rehearsal_batch={self.rehearsal_batch} needs rehearsal features")


def scaled_groups(model: torch.nn.Module, learning_rate: float, scales: Sequence[tuple[Callable[[str], bool], float]]
                  ) -> list[dict]:
    """AdamW groups: each trainable parameter at ``learning_rate`` times the scale of the first ``(takes(name),
    scale)`` of ``scales`` that takes its name, else at ``learning_rate``; the unscaled group first, empty ones left
    out (but the first)."""
    groups: list[list] = [[] for _ in range(len(scales) + 1)]
    for name, parameter in model.named_parameters():
        if parameter.requires_grad:
            groups[next((i + 1 for i, (takes, _) in enumerate(scales) if takes(name)), 0)].append(parameter)
    rates = [learning_rate, *(learning_rate * scale for _, scale in scales)]
    return [{"params": params, "lr": rate} for i, (params, rate) in enumerate(zip(groups, rates)) if params or not i]


def zero_started(model: torch.nn.Module) -> Callable[[str], bool]:
    """Whether a parameter name belongs to a module that starts at zero (a window_cluster layer's
    ``routed_output``: `hf_clusterformer.callback.zero_started_parameters`)."""
    from hf_clusterformer.callback import zero_started_parameters

    return frozenset(zero_started_parameters(model)).__contains__


def learning_rate_factor(schedule: str, warmup: int, steps: int) -> Callable[[int], float]:
    """Step -> learning-rate factor: linear warm-up over ``warmup`` steps, then constant or linear decay to 0."""
    warmup = max(1, warmup)
    if schedule == "constant":
        return lambda step: min(1.0, (step + 1) / warmup)
    if schedule != "linear":
        raise ValueError(f"schedule must be 'linear' or 'constant', got {schedule!r}")
    return lambda step: min((step + 1) / warmup, max(0.0, (steps - step) / max(1, steps - warmup)))


def pad_batch(rows: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, T) right-padded ids and attention mask of ``rows`` (lists of token ids)."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = torch.as_tensor(r, dtype=torch.long)
        mask[i, : len(r)] = 1
    return ids, mask


def qa_loss(model: torch.nn.Module, batch: Sequence[Feature], pad_id: int, device: torch.device,
            dtype: torch.dtype) -> torch.Tensor:
    """() mean start/end cross-entropy of a QA model on ``batch``."""
    ids, mask = pad_batch([b["input_ids"] for b in batch], pad_id)
    starts = torch.tensor([b["start_positions"] for b in batch], device=device)
    ends = torch.tensor([b["end_positions"] for b in batch], device=device)
    with torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32):
        return model(input_ids=ids.to(device), attention_mask=mask.to(device), start_positions=starts,
                     end_positions=ends).loss


@dataclass
class _Progress:
    """What a checkpoint holds besides the tensors' owners: where the run is and what it has recorded."""

    stage: int = 0
    step: int = 0
    global_step: int = 0
    seconds: float = 0.0  # training and evaluation time before this process
    finished_stages: dict[str, int] = field(default_factory=dict)  # stage -> steps it ran
    curve: list[dict] = field(default_factory=list)
    log: list[dict] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)  # the current stage's
    order: list[int] = field(default_factory=list)  # the current pass's permutation (order "epochs")
    position: int = 0
    planned_steps: int | None = None  # the current stage's steps after max_seconds shortened it
    step_seconds: list[float] = field(default_factory=list)  # the latest training steps' (no evaluation)
    eval_seconds: list[float] = field(default_factory=list)  # every evaluation's


class _Run:
    """The state of one `train_stages` call: model, optimizer, schedule, updater, generator, progress."""

    def __init__(self, model, stages, updater, seed, device, dtype, pad_id):
        self.model, self.stages, self.updater = model, stages, updater
        self.device, self.dtype, self.pad_id = device, dtype, pad_id
        self.seed, self.generator = seed, torch.Generator().manual_seed(seed)
        self.progress = _Progress()
        self.optimizer = self.schedule = None

    def stage_steps(self, stage: TrainStage) -> int:
        return self.progress.planned_steps or stage.steps

    def start_stage(self, stage: TrainStage) -> None:
        """A fresh optimizer and schedule for ``stage`` (the loop state is in ``progress``)."""
        groups = (stage.param_groups(self.model, stage.learning_rate) if stage.param_groups else
                  [{"params": [p for p in self.model.parameters() if p.requires_grad], "lr": stage.learning_rate}])
        self.optimizer = torch.optim.AdamW(groups, lr=stage.learning_rate, weight_decay=stage.weight_decay)
        factor = learning_rate_factor(stage.schedule, stage.warmup, self.stage_steps(stage))
        self.schedule = torch.optim.lr_scheduler.LambdaLR(self.optimizer, factor)

    def next_batch(self, stage: TrainStage) -> list[Feature]:
        p, size = self.progress, stage.batch_size
        if stage.order == "sequential":
            begin = p.step * size
            return [stage.data[(begin + i) % len(stage.data)] for i in range(size)]
        if not p.order or p.position + size > len(p.order):
            p.order, p.position = torch.randperm(len(stage.data), generator=self.generator).tolist(), 0
        batch = [stage.data[i] for i in p.order[p.position: p.position + size]]
        p.position += size
        return batch

    def rehearsal_batch(self, stage: TrainStage) -> list[Feature]:
        begin = self.progress.step * stage.rehearsal_batch
        return [stage.rehearsal[(begin + i) % len(stage.rehearsal)] for i in range(stage.rehearsal_batch)]

    # -- checkpoints -------------------------------------------------------------------------------------------------

    def state(self, seconds: float) -> dict:
        progress = dict(vars(self.progress), seconds=seconds)
        between_stages = self.optimizer is None
        return {"progress": progress, "plan": self.plan(), "model": self.model.state_dict(),
                "optimizer": None if between_stages else self.optimizer.state_dict(),
                "schedule": None if between_stages else self.schedule.state_dict(),
                "generator": self.generator.get_state(),
                "torch_rng": torch.get_rng_state(), "python_rng": random.getstate(),
                "numpy_rng": np.random.get_state(),
                "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
                "updater": None if self.updater is None else
                {"state": self.updater.state_dict(), "banks": self.updater.banks_state_dict()}}

    def save(self, directory: Path, seconds: float) -> None:
        """Write the checkpoint in one rename (a stop while writing keeps the previous one)."""
        directory.mkdir(parents=True, exist_ok=True)
        partial = directory / f".{CHECKPOINT_NAME}.{os.getpid()}.partial"
        torch.save(self.state(seconds), partial)
        os.replace(partial, directory / CHECKPOINT_NAME)

    def plan(self) -> list[dict]:
        """What a checkpoint must have been made with to resume this run (the stages' settings and the seed)."""
        return [{"name": s.name, "steps": s.steps, "batch_size": s.batch_size, "learning_rate": s.learning_rate,
                 "warmup": s.warmup, "schedule": s.schedule, "order": s.order, "examples": len(s.data),
                 "gate": None if s.gate is None else vars(s.gate), "rehearsal_batch": s.rehearsal_batch,
                 "seed": self.seed} for s in self.stages]

    def restore(self, path: Path) -> None:
        state = torch.load(path, map_location="cpu", weights_only=False)
        if state.get("plan", self.plan()) != self.plan():  # checkpoints of the first layout hold no plan
            raise ValueError(f"{path} was saved by a run with other stages or seed than this one; resume it with its "
                             f"own settings, or remove {path.parent} to start again")
        self.progress = _Progress(**state["progress"])
        self.model.load_state_dict(state["model"])
        if self.progress.stage < len(self.stages) and state["optimizer"] is not None:
            self.start_stage(self.stages[self.progress.stage])
            self.optimizer.load_state_dict(state["optimizer"])
            self.schedule.load_state_dict(state["schedule"])
        self.generator.set_state(state["generator"])
        torch.set_rng_state(state["torch_rng"])
        random.setstate(state["python_rng"])
        np.random.set_state(state["numpy_rng"])
        if state["cuda_rng"] is not None and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state["cuda_rng"])
        if self.updater is not None and state["updater"] is not None:
            self.updater.load_state_dict(state["updater"]["state"])
            self.updater.load_banks_state_dict(state["updater"]["banks"])


def _eta(run: _Run, eval_every: int) -> float:
    """Seconds left if the remaining steps (the current stage's and the later stages' full lengths) and their
    evaluations take as long as the latest ones."""
    p = run.progress
    if not p.step_seconds:
        return math.nan
    left = [run.stage_steps(run.stages[p.stage]) - p.step] + [s.steps for s in run.stages[p.stage + 1:]]
    evaluations = sum(-(-n // eval_every) for n in left) if p.eval_seconds else 0
    return (sum(left) * float(np.mean(p.step_seconds)) +
            evaluations * (float(np.mean(p.eval_seconds)) if p.eval_seconds else 0.0))


def train_stages(
    model: torch.nn.Module,
    stages: Sequence[TrainStage],
    *,
    pad_id: int,
    evaluate: Evaluate | None = None,
    eval_every: int = 50,
    updater: Any | None = None,
    seed: int = 0,
    checkpoint_dir: str | os.PathLike | None = None,
    checkpoint_every: int = 25,
    log_every: int = 25,
    label: str = "run",
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
    print_fn: Callable[[str], None] = lambda line: print(line, flush=True),
    on_point: Callable[[dict], None] | None = None,
) -> dict:
    """Train ``model`` through ``stages``; returns ``{"curve", "log", "stages", "seconds"}``.

    Args:
        model: a QA model in train mode (`qa_loss` is its loss).
        stages: run in order; a gated stage may end early.
        pad_id: the tokenizer's pad id.
        evaluate: ``model -> {metric: value}`` on held-out data, called in eval mode under ``torch.no_grad`` every
            ``eval_every`` steps of a stage and at its last step; each call adds a curve point (stage, step,
            global step, mean loss since the last point, seconds, the metrics).
        updater: a `hf_clusterformer.CentroidUpdater` of the model, stepped after every optimizer step.
        seed: the loop's generator (order ``epochs``).
        checkpoint_dir: where the state is saved every ``checkpoint_every`` steps and at every stage's end; a call
            whose folder holds a checkpoint resumes from it (the model's current weights are replaced by the saved
            ones) and a finished run returns its record at once.
        log_every: steps between progress lines (stage, step, loss, seconds per step, ETA of the whole run).
        device, dtype: where the batches go; a dtype other than float32 trains under autocast.
        print_fn: where progress and curve lines go.
        on_point: called with every new curve point (after it is printed).
    """
    device = torch.device(device)
    run = _Run(model, list(stages), updater, seed, device, dtype, pad_id)
    checkpoint = Path(checkpoint_dir) / CHECKPOINT_NAME if checkpoint_dir is not None else None
    if checkpoint is not None and checkpoint.is_file():
        run.restore(checkpoint)
        p = run.progress
        print_fn(f"[{label}] resumed from {checkpoint} at stage {p.stage} step {p.step} (global step {p.global_step})")
    started = time.time() - run.progress.seconds
    model.train()
    while run.progress.stage < len(run.stages):
        _train_stage(run, run.stages[run.progress.stage], evaluate, eval_every, checkpoint, checkpoint_every,
                     log_every, label, started, print_fn, on_point)
    return {"curve": run.progress.curve, "log": run.progress.log, "stages": dict(run.progress.finished_stages),
            "seconds": round(time.time() - started, 1)}


def _evaluate_point(run: _Run, stage: TrainStage, evaluate: Evaluate, eval_every: int, started: float) -> dict:
    p = run.progress
    since = p.losses[-eval_every:] or [math.nan]
    run.model.eval()
    began = time.time()
    with torch.no_grad():
        metrics = evaluate(run.model)
    p.eval_seconds.append(time.time() - began)
    run.model.train()
    return {"stage": stage.name, "step": p.step, "global_step": p.global_step, "loss": round(float(np.mean(since)), 4),
            "seconds": round(time.time() - started), **metrics}


def _train_stage(run: _Run, stage: TrainStage, evaluate, eval_every, checkpoint, checkpoint_every, log_every, label,
                 started, print_fn, on_point) -> None:
    p = run.progress
    if run.optimizer is None:
        run.start_stage(stage)
    trained = [param for group in run.optimizer.param_groups for param in group["params"]]
    evaluate = stage.evaluate or evaluate
    timed_from = None
    while p.step < run.stage_steps(stage):
        if p.step == 10:  # steps 10-30 are timed: the first ones pay for warm-up (kernels, the first K-Means fit)
            timed_from = time.time()
        if p.step == 30 and stage.max_seconds and timed_from is not None and p.planned_steps is None:
            _plan_steps(run, stage, (time.time() - timed_from) / 20, label, print_fn)
        step_started = time.time()
        batch = run.next_batch(stage)
        loss = qa_loss(run.model, batch, run.pad_id, run.device, run.dtype)
        if stage.rehearsal_batch:
            extra = run.rehearsal_batch(stage)
            extra_loss = qa_loss(run.model, extra, run.pad_id, run.device, run.dtype)
            loss = (loss * len(batch) + extra_loss * len(extra)) / (len(batch) + len(extra))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trained, 1.0)
        run.optimizer.step()
        run.schedule.step()
        run.optimizer.zero_grad(set_to_none=True)
        if run.updater is not None:
            run.updater.step()
        p.losses.append(loss.item())
        p.step_seconds = (p.step_seconds + [time.time() - step_started])[-50:]
        p.step += 1
        p.global_step += 1
        last = p.step == run.stage_steps(stage)
        gated = False
        if evaluate is not None and (p.step % eval_every == 0 or last):
            point = _evaluate_point(run, stage, evaluate, eval_every, started)
            p.curve.append(point)
            print_fn(json.dumps(point))
            if on_point is not None:
                on_point(point)
            stage_points = [q for q in p.curve if q["stage"] == stage.name]
            gated = stage.gate is not None and stage.gate.passed(stage_points)
        if p.step % log_every == 0 or last or gated:
            _log_progress(run, stage, log_every, eval_every, started, label, print_fn)
        if gated or last:
            p.finished_stages[stage.name] = p.step
            p.stage, p.step, p.losses, p.order, p.position, p.planned_steps = p.stage + 1, 0, [], [], 0, None
            if gated:
                print_fn(f"[{label}] {stage.name}: gate {stage.gate.metric} >= {stage.gate.threshold} passed at step "
                         f"{p.finished_stages[stage.name]}")
            run.optimizer = run.schedule = None
            if checkpoint is not None:
                run.save(checkpoint.parent, time.time() - started)
            return
        if checkpoint is not None and p.step % checkpoint_every == 0:
            run.save(checkpoint.parent, time.time() - started)


def _plan_steps(run: _Run, stage: TrainStage, seconds_per_step: float, label: str, print_fn) -> None:
    """Shorten ``stage`` (and its schedule) when its steps would take more than ``max_seconds``."""
    projected = seconds_per_step * stage.steps
    if projected <= stage.max_seconds:
        return
    planned = max(run.progress.step + 1, int(stage.steps * stage.max_seconds / projected))  # at least one more step
    run.progress.planned_steps = planned
    run.schedule.lr_lambdas[0] = learning_rate_factor(stage.schedule, stage.warmup, planned)
    for i in range(1, len(run.schedule.lr_lambdas)):
        run.schedule.lr_lambdas[i] = run.schedule.lr_lambdas[0]
    print_fn(f"[{label}] {stage.name}: {projected:.0f} s projected for {stage.steps} steps, more than "
             f"{stage.max_seconds:.0f} s: {planned} steps")


def _log_progress(run: _Run, stage: TrainStage, log_every: int, eval_every: int, started: float, label: str,
                  print_fn) -> None:
    p = run.progress
    entry = {"stage": stage.name, "step": p.step, "loss": round(float(np.mean(p.losses[-log_every:])), 4),
             "seconds": round(time.time() - started, 1)}
    p.log.append(entry)
    evaluation = f", {np.mean(p.eval_seconds):.1f} s per evaluation" if p.eval_seconds else ""
    print_fn(f"[{label}] {stage.name} step {p.step}/{run.stage_steps(stage)} loss {entry['loss']:.4f} "
             f"{np.mean(p.step_seconds[-log_every:]):.2f} s/step{evaluation}, "
             f"ETA {_eta(run, eval_every) / 60:.1f} min")
