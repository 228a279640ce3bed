"""Print the Markdown tables of run.sh: the head-only start, then per model and seed the held-out MLM loss before and
after continued pretraining, split by masked tokens with a visible copy outside their windows or not."""

import json
import statistics
from pathlib import Path

HERE = Path(__file__).parent
head = json.loads((HERE / "head.json").read_text())["results"]
print(f"MLM head trained with the encoder frozen ({head['train_steps']} steps, {head['train_seconds']:.0f} s): held-out "
      f"loss on 128-token blocks {head['eval_loss_before']:.3f} -> {head['eval_loss']:.3f} "
      f"({head['eval_masked_tokens']} masked tokens).\n")
print("| model | seed | loss before | loss after | outside: share of masked | outside loss before / after "
      "| inside loss before / after | train loss | train s |")
print("|---|---|---|---|---|---|---|---|---|")
after = {}
for path in sorted(HERE.glob("*-seed*.json")):
    r = json.loads(path.read_text())["results"]
    model, seed = path.stem.rsplit("-seed", 1)
    after.setdefault(model, []).append((r["eval_outside_loss"], r["eval_inside_loss"], r["eval_loss"]))
    print(f"| {model} | {seed} | {r['eval_loss_before']:.3f} | {r['eval_loss']:.3f} | {r['eval_outside_fraction']:.3f} "
          f"({r['eval_masked_tokens']} masked) | {r['eval_outside_loss_before']:.3f} / {r['eval_outside_loss']:.3f} "
          f"| {r['eval_inside_loss_before']:.3f} / {r['eval_inside_loss']:.3f} | {r['train_loss']:.3f} "
          f"| {r['train_seconds']:.0f} |")
print()
for model, rows in after.items():
    outside, inside, total = (statistics.mean(values) for values in zip(*rows))
    print(f"{model}: mean over {len(rows)} seeds after: all {total:.3f}, outside {outside:.3f}, inside {inside:.3f}")
