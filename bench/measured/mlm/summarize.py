"""Print the Markdown table of the run.sh results (held-out MLM loss before/after, the outside-window split)."""

import json
from pathlib import Path

HERE = Path(__file__).parent
print("| model | seed | loss before | loss after | outside: share of masked | outside loss before / after "
      "| inside loss before / after | train loss | train s |")
print("|---|---|---|---|---|---|---|---|---|")
for path in sorted(HERE.glob("*-seed*.json")):
    r = json.loads(path.read_text())["results"]
    model, seed = path.stem.rsplit("-seed", 1)
    print(f"| {model} | {seed} | {r['eval_loss_before']:.3f} | {r['eval_loss']:.3f} | {r['eval_outside_fraction']:.3f} "
          f"({r['eval_masked_tokens']} masked) | {r['eval_outside_loss_before']:.3f} / {r['eval_outside_loss']:.3f} "
          f"| {r['eval_inside_loss_before']:.3f} / {r['eval_inside_loss']:.3f} | {r['train_loss']:.3f} "
          f"| {r['train_seconds']:.0f} |")
