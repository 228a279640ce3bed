#!/usr/bin/env python
"""Global layer types compared at equal budget and seeds (the paper's Table 2 and Table 4, at small scale).

Every variant is the same small model trained from scratch with ``hf_clusterformer.qa_training.run`` on the same
generated data (the long-range two-hop split mixed with its local one-hop control split, as in examples/demo.py)
and evaluated on both validation splits:

  Sliding window              no global layers
  Sparse Attention            the global layers attend across windows at equal in-window position
  Locality-Sensitive Hashing  the global layers bucket states by random hyperplanes (#buckets = 64 / scale)
  Cluster-Former (#C=...)     the global layers cluster states with K-Means, #C = 64, 256, 512 / --cluster_scale
  Cluster-Former (a, b)       placement sweep: a cluster layer at every layer l with l % a == 0 and l >= b (l >= 1)

For a seed, every variant starts from the same initial weights (the routers are buffers, not parameters), sees the
same batches and gets the same number of optimizer steps. Prints an EM/F1 table (mean ± std over seeds) and writes
it as Markdown (``compare_layers.md``), a bar chart (``compare_layers.png``) and every run's scores
(``compare_layers.json``) to --results_dir.

    python bench/compare_layers.py                      # defaults mirror examples/demo.py, 3 seeds: hours on CPU
    python bench/compare_layers.py --quick              # smoke run of a few seconds per variant
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import statistics
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import datasets
import torch
import transformers
from safetensors.torch import load_file
from transformers import TrainingArguments, set_seed

from clusterformer_research.longrange import build_longrange_tokenizer, generate_longrange_dataset
from hf_clusterformer import ClusterFormerConfig, ClusterFormerForQuestionAnswering
from hf_clusterformer.configuration_clusterformer import required_position_embeddings
from hf_clusterformer.conversion import model_options
from hf_clusterformer.qa_training import (
    SMALL_MODEL_CENTROIDS,
    DataArguments,
    ModelArguments,
    centroid_arguments,
    centroid_flag_options,
    run,
)
from hf_clusterformer_cli_support import add_option_flags

SPLITS = ("longrange", "local")
PAPER_CLUSTERS = (64, 256, 512)
QUESTION_TOKENS = 16
#: --quick: tiny data, model and budget (seconds per run).
QUICK = dict(
    seeds=[0, 1], train_samples=12, eval_samples=6, max_steps=3, context_tokens_min=120, context_tokens_max=200,
    min_gap_tokens=30, hidden_size=32, num_attention_heads=2, window_size=32, window_stride=24, vocab_size=400,
    batch_size=4, centroid_update_steps=1, cluster_scale=16, memory_size=4000,
)


@dataclass
class Variant:
    """One row of the table: a layer type at given layers, sliding-window layers elsewhere."""

    name: str
    layer_type: str  # "cluster", "lsh" or "sparse" at ``layers``; "sliding" (no layers) for the sliding-window model
    layers: list[int]
    num_clusters: int
    runs: list[dict] = field(default_factory=list)

    def layer_types(self, depth: int) -> list[str]:
        """``config.layer_kinds`` of this row's model of ``depth`` layers."""
        return [self.layer_type if layer in self.layers else "sliding" for layer in range(depth)]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add = parser.add_argument
    add("--seeds", type=int, nargs="+", default=[0, 1, 2], help="training seeds (initial weights, batches, centroids)")
    add("--data_seed", type=int, default=0, help="seed of the generated data and tokenizer (the same for all runs)")
    add("--train_samples", type=int, default=3000, help="training examples per split (long-range and local)")
    add("--eval_samples", type=int, default=200, help="validation examples per split")
    add("--context_tokens_min", type=int, default=300, help="shortest context (approximate tokens)")
    add("--context_tokens_max", type=int, default=600, help="longest context (approximate tokens)")
    add("--min_gap_tokens", type=int, default=80, help="least distance between the two facts of a chain")
    add("--hidden_size", type=int, default=64)
    add("--num_hidden_layers", type=int, default=4)
    add("--num_attention_heads", type=int, default=4)
    model = model_options()
    # the global layers of the type comparison
    recipe = {"cluster_layers": [2], "window_size": 48, "window_stride": 40}
    add_option_flags(parser, [model[name] for name in recipe], defaults=recipe, dashes=False)
    add("--initializer_range", type=float, default=0.1)
    add("--vocab_size", type=int, default=1300)
    add("--cluster_scale", type=int, default=2, help="#C and LSH buckets are the paper's 64/256/512 divided by this")
    add("--placements", nargs="*", default=["1:1", "1:2", "3:3"],
        help="a:b pairs of the placement sweep: cluster layers l with l %% a == 0 and l >= b")
    add("--learning_rate", type=float, default=1e-3)
    add("--batch_size", type=int, default=16)
    add("--epochs", type=float, default=2.0)
    add("--max_steps", type=int, default=-1, help="optimizer steps (overrides --epochs when > 0)")
    # torch: bit-reproducible on CPU
    centroids = centroid_flag_options(replace(SMALL_MODEL_CENTROIDS, backend="torch"))
    add_option_flags(parser, centroids, defaults={option.name: option.default for option in centroids}, dashes=False)
    add("--max_answer_length", type=int, default=5)
    add("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    add("--results_dir", default=None, help="default bench/results (bench/results/quick with --quick)")
    add("--quick", action="store_true", help="tiny data, model and budget, 2 seeds: a smoke run (given options win)")
    args = parser.parse_args(argv)
    if args.quick:
        parser.set_defaults(**QUICK)
        args = parser.parse_args(argv)
    if args.results_dir is None:
        args.results_dir = str(Path(__file__).resolve().parent / "results" / ("quick" if args.quick else ""))
    return args


def make_variants(args: argparse.Namespace) -> list[Variant]:
    """The rows: sliding window, sparse, LSH, Cluster-Former at three #C, then the placement sweep."""
    depth, layers = args.num_hidden_layers, sorted(set(args.cluster_layers))
    c64, c256, c512 = (max(2, c // args.cluster_scale) for c in PAPER_CLUSTERS)
    lsh_buckets = c64 + c64 % 2  # LSH needs an even number of buckets (±projections)
    variants = [
        Variant("Sliding window", "sliding", [], c64),
        Variant("Sparse Attention", "sparse", layers, c64),
        Variant(f"Locality-Sensitive Hashing (#B={lsh_buckets})", "lsh", layers, lsh_buckets),
        *(Variant(f"Cluster-Former (#C={c})", "cluster", layers, c) for c in (c64, c256, c512)),
    ]
    seen = {tuple(layers)}
    for pair in args.placements:
        a, b = (int(x) for x in pair.split(":"))
        placed = [layer for layer in range(1, depth) if layer % a == 0 and layer >= b]
        if not placed or tuple(placed) in seen:
            print(f"placement a={a}, b={b} gives cluster layers {placed}: skipped (empty or already in the table)")
            continue
        seen.add(tuple(placed))
        variants.append(Variant(f"Cluster-Former (#C={c64}, a={a}, b={b}: layers {placed})", "cluster", placed, c64))
    return variants


def write_data(args: argparse.Namespace, work: Path) -> dict[str, Path]:
    """Mixed long-range + local training file and one validation file per split, as SQuAD-format jsonl."""
    options = dict(
        seed=args.data_seed, context_tokens=(args.context_tokens_min, args.context_tokens_max),
        min_gap_tokens=args.min_gap_tokens,
    )
    train = []
    paths = {}
    for kind in SPLITS:
        train += generate_longrange_dataset(args.train_samples, kind=kind, split="train", **options)
        records = generate_longrange_dataset(args.eval_samples, kind=kind, split="validation", **options)
        paths[kind] = work / f"{kind}-validation.jsonl"
        paths[kind].write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    mixed = datasets.Dataset.from_list(train).shuffle(seed=args.data_seed)
    paths["train"] = work / "train.jsonl"
    mixed.to_json(str(paths["train"]), lines=True)
    return paths


def initial_checkpoint(args: argparse.Namespace, variant: Variant, seed: int, tokenizer, work: Path) -> Path:
    """The variant's model, initialised under ``seed`` (demo.py's recipe), saved with the tokenizer."""
    config = ClusterFormerConfig(
        vocab_size=len(tokenizer), hidden_size=args.hidden_size, num_hidden_layers=args.num_hidden_layers,
        num_attention_heads=args.num_attention_heads, intermediate_size=4 * args.hidden_size,
        max_position_embeddings=required_position_embeddings(
            QUESTION_TOKENS, args.window_size, tokenizer.pad_token_id
        ),
        type_vocab_size=1,
        pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        initializer_range=args.initializer_range, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
        layer_types=variant.layer_types(args.num_hidden_layers), num_clusters=variant.num_clusters,
        window_size=args.window_size, window_stride=args.window_stride, max_question_length=QUESTION_TOKENS,
        max_context_length=16384,
    )
    set_seed(seed)
    path = work / "init"
    ClusterFormerForQuestionAnswering(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def train_and_evaluate(args, variant: Variant, seed: int, tokenizer, data: dict[str, Path], work: Path, log) -> dict:
    """One seed of one variant: `qa_training.run` trains and scores long-range, a second call scores local."""
    init = initial_checkpoint(args, variant, seed, tokenizer, work)
    model_args = ModelArguments(model_name_or_path=str(init))
    centroid_args = centroid_arguments(args)
    common = dict(
        per_device_train_batch_size=args.batch_size, per_device_eval_batch_size=32, learning_rate=args.learning_rate,
        num_train_epochs=args.epochs, max_steps=args.max_steps, warmup_steps=0.1, lr_scheduler_type="linear",
        weight_decay=0.01, max_grad_norm=1.0, logging_steps=50, save_strategy="no", report_to="none", seed=seed,
        data_seed=seed, disable_tqdm=True, use_cpu=not torch.cuda.is_available(), dataloader_num_workers=0,
    )
    output = work / "trained"
    scores: dict[str, dict[str, float]] = {}
    started = time.time()
    with contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
        for split in SPLITS:
            training = split == SPLITS[0]
            data_args = DataArguments(
                train_file=str(data["train"]) if training else None, validation_file=str(data[split]),
                train_samples=0, eval_samples=0, max_seq_length=16384, max_answer_length=args.max_answer_length,
            )
            if not training:
                model_args = ModelArguments(model_name_or_path=str(output))
            training_args = TrainingArguments(output_dir=str(output), do_train=training, do_eval=True, **common)
            metrics = run(model_args, data_args, centroid_args, training_args)
            scores[split] = {"exact_match": metrics["eval_exact_match"], "f1": metrics["eval_f1"]}
            if training:
                train_seconds = metrics.get("train_runtime", time.time() - started)
                train_loss = metrics["train_loss"]
    weights = load_file(str(output / "model.safetensors"))
    fitted = all(bool(v) for k, v in weights.items() if k.endswith(".fitted"))
    return {
        "seed": seed, "scores": scores, "train_loss": train_loss, "train_seconds": round(train_seconds, 2),
        "centroids_fitted": fitted,
    }


def mean_std(values: list[float]) -> str:
    std = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.mean(values):.1f} ± {std:.1f}"


def table(variants: list[Variant], args: argparse.Namespace) -> str:
    """Markdown table: EM and F1 per split as mean ± std over seeds, plus the global layers and training time."""
    header = ["Model", "global layers"] + [f"{s} {m}" for s in SPLITS for m in ("EM", "F1")] + ["train s"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    unfitted = False
    for variant in variants:
        cells = [variant.name, ", ".join(map(str, variant.layers)) or "none"]
        for split in SPLITS:
            for metric in ("exact_match", "f1"):
                cells.append(mean_std([r["scores"][split][metric] for r in variant.runs]))
        cells.append(f"{statistics.mean(r['train_seconds'] for r in variant.runs):.1f}")
        if variant.layer_type == "cluster" and not all(r["centroids_fitted"] for r in variant.runs):
            cells[0] += " *"
            unfitted = True
        lines.append("| " + " | ".join(cells) + " |")
    budget = f"{args.max_steps} steps" if args.max_steps > 0 else f"{args.epochs:g} epochs"
    notes = [
        "",
        f"EM/F1 (%) on {args.eval_samples} validation questions per split, mean ± std over seeds {args.seeds}; "
        f"{args.num_hidden_layers} layers of width {args.hidden_size}, "
        f"windows {args.window_size}/{args.window_stride}, "
        f"{2 * args.train_samples} training questions (both splits mixed), {budget} at batch {args.batch_size}, "
        f"contexts {args.context_tokens_min}-{args.context_tokens_max} approximate tokens, facts >= "
        f"{args.min_gap_tokens} apart; #C = paper's 64/256/512 / {args.cluster_scale}.",
    ]
    if unfitted:
        notes.append("* some runs ended before the first K-Means fit (too few steps): seeded random centroids.")
    return "\n".join(lines + notes) + "\n"


def plot(variants: list[Variant], path: Path) -> Path | None:
    """Grouped bars of EM and F1 per split with the seed std as error bars."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is missing: no chart (pip install 'hf-clusterformer[plot]')")
        return None
    figure, axes = plt.subplots(1, 2, figsize=(12, 0.45 * len(variants) + 2.5), sharey=True)
    positions = torch.arange(len(variants)).float()
    for axis, metric in zip(axes, ("exact_match", "f1")):
        for offset, split, colour in ((-0.2, "longrange", "tab:blue"), (0.2, "local", "tab:orange")):
            values = [[r["scores"][split][metric] for r in v.runs] for v in variants]
            means = [statistics.mean(v) for v in values]
            stds = [statistics.stdev(v) if len(v) > 1 else 0.0 for v in values]
            axis.barh(positions + offset, means, height=0.4, xerr=stds, color=colour, label=split, capsize=2)
        axis.set_title("EM" if metric == "exact_match" else "F1")
        axis.set_xlim(0, 100)
        axis.grid(axis="x", alpha=0.3)
    axes[0].set_yticks(positions.tolist(), [v.name for v in variants], fontsize=8)
    axes[0].invert_yaxis()
    axes[1].legend(loc="lower right")
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return path


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    datasets.disable_progress_bars()
    logging.getLogger("hf_clusterformer").setLevel(logging.ERROR)
    results = Path(args.results_dir)
    results.mkdir(parents=True, exist_ok=True)
    variants = make_variants(args)
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="compare_layers-") as tmp:
        work = Path(tmp)
        data = write_data(args, work)
        examples = 20 if args.quick else 100
        tokenizer = build_longrange_tokenizer(args.vocab_size, seed=args.data_seed, num_examples=examples)
        with open(results / "compare_layers.log", "w", encoding="utf-8") as log:
            for number, variant in enumerate(variants, 1):
                for seed in args.seeds:
                    print(f"[{number}/{len(variants)}] {variant.name}, seed {seed}", end="", flush=True)
                    run_dir = work / f"run-{number}-{seed}"
                    run_dir.mkdir()
                    result = train_and_evaluate(args, variant, seed, tokenizer, data, run_dir, log)
                    variant.runs.append(result)
                    s = result["scores"]
                    print(f": long-range {s['longrange']['exact_match']:.1f}/{s['longrange']['f1']:.1f}, "
                          f"local {s['local']['exact_match']:.1f}/{s['local']['f1']:.1f} EM/F1, "
                          f"{result['train_seconds']:.1f} s", flush=True)
    markdown = table(variants, args)
    print("\n" + markdown)
    (results / "compare_layers.md").write_text(markdown, encoding="utf-8")
    (results / "compare_layers.json").write_text(
        json.dumps({"args": vars(args), "variants": [vars(v) for v in variants]}, indent=1), encoding="utf-8"
    )
    chart = plot(variants, results / "compare_layers.png")
    written = ", ".join(str(p) for p in (results / "compare_layers.md", results / "compare_layers.json", chart) if p)
    print(f"wrote {written} in {time.time() - started:.0f} s")


if __name__ == "__main__":
    main()
