#!/usr/bin/env python
"""Learning curves of the gated twin study from its logs (``bench/twin_swaps.py`` prints one JSON line per evaluation):
a Markdown table per seed, Cluster-Former and the sliding-window model side by side, with the held-out sets'
positional shortcuts.

    python bench/measured/gain/summarize.py bench/measured/gain > bench/measured/gain/results.md
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def read_log(path: Path) -> tuple[dict, list[dict]]:
    """(shortcuts, curve points) of one run's log."""
    shortcuts, points = {}, []
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.startswith("{"):
            continue
        record = json.loads(line)
        if "shortcuts" in record:
            shortcuts = record["shortcuts"]
        elif "stage" in record:
            points.append(record)
    latest = {p["global_step"]: p for p in points}  # a resumed run may print a point again: the last one counts
    return shortcuts, [latest[step] for step in sorted(latest)]


def margins(seed: str, runs: dict[str, list[dict]]) -> list[str]:
    """Far start EM of both models at equal far-stage steps, and Cluster-Former's margin."""
    far = {variant: {p["step"]: p["far_start_em"] for p in points if p["stage"] == "far"}
           for variant, points in runs.items()}
    steps = sorted(set(far.get("clusterformer", {})) & set(far.get("sliding", {})))
    if not steps:
        return []
    lines = [f"far start EM at equal far steps, seed {seed}:", "",
             "| far step | " + " | ".join(str(s) for s in steps) + " |", "|---|" + "---|" * len(steps)]
    for variant in ("clusterformer", "sliding"):
        lines.append(f"| {variant} | " + " | ".join(str(far[variant][s]) for s in steps) + " |")
    lines.append("| margin | " + " | ".join(f"{far['clusterformer'][s] - far['sliding'][s]:+.1f}" for s in steps) + " |")
    return lines + [""]


def table(seed: str, runs: dict[str, list[dict]]) -> list[str]:
    """One seed's curves: a row per training step (both stages counted), each model's stage, step, near and far start
    EM (far text EM) at it; the near stage of each model ends at its own gate, so the stages may differ in a row."""
    steps = sorted({p["global_step"] for points in runs.values() for p in points})
    lines = [f"### seed {seed}", "", "| training step | Cluster-Former: stage step, near / far start EM (far text EM) | "
             "sliding-window: stage step, near / far start EM (far text EM) |", "|---|---|---|"]
    for global_step in steps:
        cells = []
        for variant in ("clusterformer", "sliding"):
            point = next((p for p in runs.get(variant, []) if p["global_step"] == global_step), None)
            cells.append("–" if point is None else f"{point['stage']} {point['step']}: {point['near_start_em']} / "
                         f"{point['far_start_em']} ({point.get('far_text_em', '–')})")
        lines.append(f"| {global_step} | {cells[0]} | {cells[1]} |")
    return lines + [""]


def main(folder: str) -> None:
    runs: dict[str, dict[str, list[dict]]] = {}
    shortcuts = {}
    for path in sorted(Path(folder).glob("*-seed*.log")):
        variant, seed = path.stem.split("-seed")
        shortcuts[seed], runs.setdefault(seed, {})[variant] = read_log(path)
    out = ["# Gated twin study: learning curves", ""]
    for seed in sorted(runs):
        out += table(seed, runs[seed])
        out += margins(seed, runs[seed])
        for name, values in shortcuts[seed].items():
            out.append(f"- {name} held-out shortcuts (text EM of answering by fact position): "
                       + ", ".join(f"{key} {value}" for key, value in values.items()))
        out.append("")
    print("\n".join(out))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else str(Path(__file__).parent))
