#!/usr/bin/env python
"""The variant screen before the real-text study's long runs: which cluster layer to train, chosen on validation data.

Every model starts from the study's stage A (``--study_dir``: its ``init/`` and ``seed<N>/A/model``; run
``bench/realtext.py --stop_after A`` first), gets a short stage B (``--steps`` steps of the study's multi-passage
data, its schedule, centroid refits and gradient checkpointing) and is scored on ``--questions`` questions of the
validation articles (``--validation_articles`` of the study: held out of training and of the test cells), with
distractors from those articles: ``other`` at ``--other_length`` and ``same`` at ``--same_length`` tokens. The
sliding-window model is scored before and after its B; a variant is the study's Cluster-Former with one change
(`VARIANTS`), scored after its B, and also at its start when its start is not the sliding one by construction.

Each model's outputs go to ``--output_dir/<model>/`` (its start, B checkpoint and model, cells), finished parts are
skipped and B resumes from its checkpoint, so the same command resumes; run two commands side by side (one core
each) to screen two models at once. ``--report`` writes ``results.md`` and ``screen.json`` into ``--record_dir`` from
every model found: F1 per cell, each variant's F1 minus the sliding model's paired over the questions (95 % bootstrap
interval), the routing measures and B's training loss::

    nohup .venv/bin/python bench/realtext_screen.py sliding window-states > outputs/screen-1.log 2>&1 &
    nohup .venv/bin/python bench/realtext_screen.py window-keys > outputs/screen-2.log 2>&1 &
    .venv/bin/python bench/realtext_screen.py --report
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("realtext", Path(__file__).with_name("realtext.py"))
realtext = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(realtext)

#: Each variant: the study's Cluster-Former settings it changes (one change against ``window-states``, the study's
#: default; ``cluster`` is the paper's replacing layer, the previous study's model).
VARIANTS = {
    "window-states": {},
    "window-keys": {"route_by": "keys"},
    "window-128": {"num_clusters": 128},
    "window-128-fast": {"num_clusters": 128, "b_routed_lr_scale": 30.0},
    "window-layer5": {"cluster_layer": 5},
    "cluster": {"cluster_kind": "cluster"},
}
SLIDING = "sliding"
#: Kinds whose start is the sliding model's exactly (tested), so their start cells are the sliding start's.
EQUAL_AT_START = ("window_cluster",)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add = parser.add_argument
    add("models", nargs="*", help=f"models to screen, one after the other: {', '.join([SLIDING, *VARIANTS])}")
    add("--study_dir", default=str(ROOT / "outputs" / "realtext" / "cpu"), help="the study's outputs (stage A)")
    add("--output_dir", default=str(ROOT / "outputs" / "realtext" / "screen"))
    add("--record_dir", default=str(ROOT / "bench" / "measured" / "realtext" / "screen"))
    add("--seed", type=int, default=0)
    add("--steps", type=int, default=24, help="stage B steps of every model")
    add("--questions", type=int, default=100, help="validation questions per cell")
    add("--other_length", type=int, default=2000)
    add("--same_length", type=int, default=4000)
    add("--threads", type=int, default=1)
    add("--report", action="store_true", help="write the record from every model found and stop")
    args, rest = parser.parse_known_args(argv)
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    unknown = [m for m in args.models if m not in (SLIDING, *VARIANTS)]
    if unknown:
        parser.error(f"unknown model {unknown[0]!r}; choose from {', '.join([SLIDING, *VARIANTS])}")
    return args


def study_args(args, changes: dict) -> argparse.Namespace:
    """The study's settings (its ``config.json``) with a variant's changes, B sized to the screen."""
    saved = realtext.read_json(Path(args.study_dir) / "config.json")
    study = realtext.parse_args(["--preset", saved["preset"], "--output_dir", args.study_dir])
    for key, value in {**saved, **changes}.items():
        setattr(study, key, value)
    study.b_steps = study.b_min_steps = args.steps
    study.threads = study.threads_a = args.threads
    study.eval_batch = 1
    return study


class ScreenStudy(realtext.Study):
    """The study's data and stage A; one model's start, B and validation cells under ``<output_dir>/<model>``."""

    def __init__(self, study: argparse.Namespace, screen: argparse.Namespace, model: str):
        super().__init__(study)
        self.screen, self.model = screen, model
        self.folder = Path(screen.output_dir) / model
        self.validation = tuple(study.validation_articles)

    def seed_dir(self, seed: int) -> Path:
        return self.folder

    def start_path(self, seed: int, model: str) -> Path:
        if model == SLIDING:
            return self.out / f"seed{seed}" / "A" / "model"
        return self.folder / "start"

    def cell_path(self, seed: int, stage: str, model: str, kind: str, length: int) -> Path:
        return self.folder / "cells" / f"{stage}-{realtext.cell_name(kind, length)}.json"

    def questions(self) -> tuple[list, list]:
        if self._questions is None:
            self._questions = (self.validation_questions(self.screen.questions), [])
        return self._questions

    def cell_records(self, kind: str, length: int, questions: list | None = None, articles=None) -> list[dict]:
        return super().cell_records(kind, length, questions, self.validation)


def cells(args) -> list[tuple[str, int]]:
    return [("other", args.other_length), ("same", args.same_length)]


def screen_model(args, name: str) -> None:
    """One model's start (a variant's fitted cluster layer), start cells where needed, B and the cells after B."""
    changes = VARIANTS.get(name, {})
    study = ScreenStudy(study_args(args, changes), args, name)
    a, seed = study.args, args.seed
    if not (study.start_path(seed, SLIDING) / "record.json").is_file():
        raise SystemExit(f"no stage A model in {args.study_dir}; run bench/realtext.py --stop_after A first")
    torch.set_num_threads(args.threads)
    study.folder.mkdir(parents=True, exist_ok=True)
    realtext.write_json(study.folder / "settings.json", {"model": name, "changes": changes, "steps": args.steps,
                                                         "questions": args.questions, "cells": cells(args),
                                                         "study": {k: getattr(a, k) for k in (
                                                             "cluster_kind", "route_by", "cluster_layer",
                                                             "num_clusters", "b_lr", "b_routed_lr_scale",
                                                             "b_batch", "b_tokens")}})
    if name != SLIDING:
        realtext.fit_start(study, seed)
    if name == SLIDING or a.cluster_kind not in EQUAL_AT_START:
        model = realtext.load_model(study.start_path(seed, name), study)
        realtext.score_cells(study, seed, "start", {name: model}, cells(args))
        del model
    began = time.time()
    model = realtext.train_b(study, seed, name, args.steps)
    realtext.say(f"[screen {name}] B: {args.steps} steps, {(time.time() - began) / 60:.1f} min in this process")
    realtext.score_cells(study, seed, "B", {name: model}, cells(args))


def collect(args) -> dict:
    """{model: {"settings", "cells": {(stage, cell): cell}, "B": B's record}} of every model found."""
    found = {}
    for folder in sorted(Path(args.output_dir).glob("*/settings.json")):
        folder = folder.parent
        entry = {"settings": realtext.read_json(folder / "settings.json"), "cells": {}}
        for path in sorted(folder.glob("cells/*.json")):
            if not path.name.endswith(".partial.json"):
                stage, cell = path.stem.split("-", 1)
                entry["cells"][(stage, cell)] = realtext.read_json(path)
        record = folder / "B" / folder.name / "model" / "record.json"
        entry["B"] = realtext.read_json(record) if record.is_file() else None
        found[folder.name] = entry
    return found


def report(args) -> Path:
    """``results.md`` and ``screen.json``: per model and cell F1 at the start and after B, the paired difference to
    the sliding model after B, the routing measures after B, B's loss."""
    found = collect(args)
    if SLIDING not in found:
        raise SystemExit(f"no sliding-model results under {args.output_dir}")
    names = [c for c in (f"{k}-{n}" for k, n in cells(args))]
    sliding = found[SLIDING]["cells"]
    rows, summary = [], {}
    for name, entry in found.items():
        settings, own = entry["settings"], entry["cells"]
        start_from = own if name == SLIDING or settings["study"]["cluster_kind"] not in EQUAL_AT_START else sliding
        for cell in names:
            after, start = own.get(("B", cell)), start_from.get(("start", cell))
            base = sliding.get(("B", cell))
            line = {"model": name, "cell": cell, "start_f1": start and start["f1"], "f1": after and after["f1"],
                    "em": after and after["em"]}
            if after and base and name != SLIDING:
                line.update(realtext.paired_bootstrap([e["f1"] for e in after["per_question"]],
                                                      [e["f1"] for e in base["per_question"]]))
            for key in realtext.COLUMNS:
                line[key] = after.get(key) if after else None
            rows.append(line)
        losses = [(e["step"], e["loss"]) for e in (entry["B"] or {}).get("log", [])]
        summary[name] = {"settings": settings, "B_loss": losses,
                         "B_seconds": (entry["B"] or {}).get("seconds")}
    fmt = realtext._fmt
    lines = ["# Variant screen (validation articles; `bench/realtext_screen.py`)", "",
             f"Stage A of `{Path(args.study_dir).name}`, then {args.steps} steps of stage B per model; "
             f"{args.questions} questions of the validation articles per cell (distractors from them too). "
             "Start: before B (a window_cluster start is the sliding start exactly). Difference: after B, minus "
             "the sliding model after B, paired over the questions (95 % bootstrap interval).", "",
             "| model | changes | cell | F1 start | F1 after B | EM after B | minus sliding | 95 % interval | gold "
             "passage shares a chunk with the question (%) | a distractor does (%) | gold tokens in a question chunk "
             "(%) | context tokens in a question chunk (%) |", "|" + "---|" * 12]
    for r in rows:
        changes = found[r["model"]]["settings"]["changes"]
        interval = f"[{r['low']:+.1f}, {r['high']:+.1f}]" if "low" in r else "–"
        lines.append(f"| {r['model']} | {', '.join(f'{k}={v}' for k, v in changes.items()) or '–'} | {r['cell']} | "
                     f"{fmt(r['start_f1'])} | {fmt(r['f1'])} | {fmt(r['em'])} | "
                     f"{'–' if 'difference' not in r else format(r['difference'], '+.1f')} | {interval} | "
                     f"{fmt(r['gold_passage_colocated'])} | {fmt(r['distractor_colocated'])} | "
                     f"{fmt(r['gold_tokens_with_question'])} | {fmt(r['context_tokens_with_question'])} |")
    baselines = realtext.shortcut_baselines(ScreenStudy(study_args(args, {}), args, SLIDING),
                                            [c for (stage, _), c in sliding.items() if stage == "B"])
    lines += ["", "Shortcut baselines on the same cells (no model): position or question-word overlap alone.", "",
              *realtext.baseline_table(baselines)]
    steps = sorted({s for entry in summary.values() for s, _ in entry["B_loss"]})
    if steps:
        lines += ["", "Stage B training loss:", "", "| step | " + " | ".join(summary) + " |",
                  "|---|" + "---|" * len(summary)]
        for step in steps:
            lines.append(f"| {step} | " + " | ".join(fmt(dict(e["B_loss"]).get(step), 3) for e in summary.values())
                         + " |")
    record = Path(args.record_dir)
    record.mkdir(parents=True, exist_ok=True)
    (record / "results.md").write_text("\n".join(lines) + "\n")
    realtext.write_json(record / "screen.json", {"rows": rows, "models": summary, "shortcut_baselines": baselines})
    print("\n".join(lines))
    return record / "results.md"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.report:
        report(args)
        return 0
    if not args.models:
        raise SystemExit("name the models to screen (sliding and/or variants), or give --report")
    for name in args.models:
        screen_model(args, name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
