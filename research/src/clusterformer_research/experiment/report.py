"""Reports of the fine-tuning experiments: the results table, positional shortcuts, learning curves, PNGs."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np

__all__ = ["plot_curves", "positional_shortcuts", "summarise", "write_report"]


def positional_shortcuts(records: list[dict]) -> dict[str, float]:
    """EM of answering ``twin`` questions by fact position alone, on ``records``: always the first fact's place, the
    last fact's, and the best single fact slot (looked up on these very records, so an upper bound), beside chance
    (``1 / distinct places``) and a uniformly drawn mention (``2 / facts``: the twin is named twice)."""
    hits = []
    for record in records:
        places = re.findall(r"\w+ lives in (\w+)\.", record["context"])
        hits.append([place == record["answers"]["text"][0] for place in places])
    width = min(len(h) for h in hits)
    rate = 100.0 * np.array([h[:width] for h in hits], dtype=float).mean(axis=0)
    return {"first_fact": round(float(rate[0]), 1), "last_fact": round(float(rate[-1]), 1),
            "best_fact_slot": round(float(rate.max()), 1), "chance": round(100.0 / (width - 1), 1),
            "random_mention": round(200.0 / width, 1)}



def summarise(runs: list[dict], kinds: list[str]) -> dict[str, dict[str, dict]]:
    """Mean, spread and per-seed EM of each variant on each split."""
    table: dict[str, dict[str, dict]] = {}
    for run in runs:
        for kind in kinds:
            entry = table.setdefault(run["variant"], {}).setdefault(kind, {"seeds": []})
            entry["seeds"].append(run["scores"][kind]["exact_match"])
    for variant in table.values():
        for entry in variant.values():
            values = np.array(entry["seeds"], dtype=float)
            entry["mean"] = round(float(values.mean()), 1)
            entry["min"], entry["max"] = float(values.min()), float(values.max())
    return table


def write_report(output: Path, runs: list[dict], meta: dict, kinds: list[str]) -> str:
    table = summarise(runs, kinds)
    names = {"twin": "one-hop far (twin)", "longrange": "two-hop far (longrange)", "local": "local control"}
    lines = ["| model | seeds | " + " | ".join(f"{names.get(k, k)} EM" for k in kinds)
             + " | twin mentions share a chunk |",
             "|---|---|" + "---|" * len(kinds) + "---|"]
    for variant, entry in table.items():
        shared = [r["scores"].get("twin", {}).get("twin_shared_chunk") for r in runs if r["variant"] == variant]
        shared = [s for s in shared if s is not None]
        cells = []
        for k in kinds:
            e = entry[k]
            per_seed = f" ({', '.join(f'{v:.1f}' for v in e['seeds'])})" if len(e["seeds"]) > 1 else ""
            cells.append(f"{e['mean']:.1f}" + per_seed)
        lines.append(f"| {variant} | {len(entry[kinds[0]]['seeds'])} | " + " | ".join(cells) + " | "
                     + (f"{np.mean(shared):.0f}%" if shared else "–") + " |")
    markdown = "\n".join(lines) + "\n"
    shortcuts = meta.get("positional_shortcuts")
    if shortcuts:
        markdown += (f"\nPositional shortcuts on the same twin questions: first fact {shortcuts['first_fact']:.1f}, "
                     f"last fact {shortcuts['last_fact']:.1f}, "
                     f"best single fact slot {shortcuts['best_fact_slot']:.1f} "
                     f"(chance {shortcuts['chance']:.1f} over places, {shortcuts.get('random_mention', 0):.1f} for a "
                     "uniformly drawn mention).\n")
    curves = [run for run in runs if run.get("curve")]
    if curves:
        markdown += ("\nLearning curves (one-hop far EM on held-out questions, and on the first stage's near ones; "
                     "global step: EM):\n\n")
        for run in curves:
            points = ", ".join(f"{p['global_step']}: " + (f"{p['twin_em']:.0f}" if "twin_em" in p else "-")
                               + (f" (near {p['near_twin_em']:.0f})" if "near_twin_em" in p else "")
                               for p in run["curve"])
            markdown += f"- {run['variant']} / seed {run['seed']}: {points}\n"
    header = (f"Preset `{meta['preset']}` on {meta['device_name']} ({meta['dtype']}), {meta['wall_seconds']:.0f} s; "
              f"steps {meta['steps']}; EM in %, mean over seeds (per seed in brackets).\n\n")
    (output / "results.md").write_text(header + markdown)
    (output / "results.json").write_text(json.dumps({"meta": meta, "summary": table, "runs": runs}, indent=1))
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        figure, axis = plt.subplots(figsize=(7, 3.5))
        width = 0.8 / max(1, len(table))
        for n, (variant, entry) in enumerate(table.items()):
            xs = np.arange(len(kinds)) + n * width
            axis.bar(xs, [entry[k]["mean"] for k in kinds], width, label=variant)
            for x, k in zip(xs, kinds):
                axis.scatter([x] * len(entry[k]["seeds"]), entry[k]["seeds"], s=8, c="black", zorder=3)
        axis.set_xticks(np.arange(len(kinds)) + width * (len(table) - 1) / 2, [names.get(k, k) for k in kinds])
        axis.set_ylabel("exact match (%)")
        axis.set_ylim(0, 100)
        axis.legend(fontsize=8)
        axis.set_title(f"{meta['preset']} preset, {meta['device_name']}")
        figure.savefig(output / "results.png", dpi=110, bbox_inches="tight")
        plt.close(figure)
        if curves:
            plot_curves(plt, output / "curves.png", curves, meta)
    except ImportError:
        pass
    return header + markdown



def plot_curves(plt, path: Path, runs: list[dict], meta: dict) -> None:
    """One-hop far EM (near EM faint) against the global step, a line per (variant, seed)."""
    figure, axis = plt.subplots(figsize=(7, 4))
    colours = {}
    for run in runs:
        colour = colours.setdefault(run["variant"], f"C{len(colours)}")
        style = ("-", "--", "-.", ":")[run["seed"] % 4]
        far = [p for p in run["curve"] if "twin_em" in p]  # a stage without far_curve scores only the near questions
        axis.plot([p["global_step"] for p in far], [p["twin_em"] for p in far], color=colour, marker=".",
                  label=f"{run['variant']} seed {run['seed']}", linestyle=style)
        near = [p for p in run["curve"] if "near_twin_em" in p]
        if near:
            axis.plot([p["global_step"] for p in near], [p["near_twin_em"] for p in near], color=colour,
                      linestyle=style, alpha=0.35)
    shortcuts = meta.get("positional_shortcuts") or {}
    if shortcuts:
        axis.axhline(shortcuts["best_fact_slot"], color="grey", linewidth=0.8, linestyle=":")
        axis.axhline(shortcuts["chance"], color="black", linewidth=0.8, linestyle=":")
    axis.set_xlabel("training step (all stages)")
    axis.set_ylabel("one-hop far EM (%)")
    axis.set_ylim(0, 100)
    axis.legend(fontsize=7)
    axis.set_title(f"{meta['preset']}: far twin EM (faint: near twin EM; dotted: best positional shortcut, chance)",
                   fontsize=9)
    figure.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(figure)

