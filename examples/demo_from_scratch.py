#!/usr/bin/env python
"""The main job on the embedded default data: Cluster-Former vs. a sliding-window baseline, from scratch, on CPU.

1. Generate the long-range QA data (two-hop, facts more than a window apart) and its local control split.
2. Build a byte-level BPE tokenizer on the generated text.
3. Train a small Cluster-Former (its cluster layers fitted by `CentroidUpdateCallback`) and the same model
   with its cluster layers as sliding-window layers, side by side, with the same data, budget and seeds, in
   two stages: a warm-up on short contexts (a window or two, where name matching and the one-sentence hop
   are learnable from scratch; the stand-in for the pretrained RoBERTa a real run starts from), then the
   long contexts.
4. Evaluate both on both splits, print the EM/F1 table and how often far-apart repeats of a token share a
   chunk of the cluster layer, save models, tokenizer, centroids, model card and results under
   ``--output_dir``, and answer one question over a long context with the pipeline.

``python examples/demo_from_scratch.py --output_dir outputs`` (or ``python examples/demo.py --from_scratch``);
``--quick`` is a smoke run. ``make demo`` runs the pretrained demo, ``examples/demo.py``.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import datasets
import torch
from transformers import TrainingArguments, set_seed

from clusterformer_research.longrange import build_longrange_tokenizer, generate_longrange_dataset
from hf_clusterformer import CentroidUpdateCallback, ClusterFormerConfig, ClusterFormerForQuestionAnswering
from hf_clusterformer import pipeline as qa_pipeline
from hf_clusterformer.configuration_clusterformer import required_position_embeddings
from hf_clusterformer.conversion import model_options
from hf_clusterformer.data import squad_features
from hf_clusterformer.features import prepare_train_features
from hf_clusterformer.hub import save_for_hub
from hf_clusterformer.inspection import inspect_clusters
from hf_clusterformer.qa_training import (
    DataArguments,
    centroid_arguments,
    centroid_flag_options,
    make_trainer,
    predict_answers,
)
from hf_clusterformer_cli_support import add_option_flags


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output_dir", default="outputs")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--train_samples", type=int, default=3000,
                        help="per question kind (long-range, local, mention)")
    parser.add_argument("--eval_samples", type=int, default=200, help="per split")
    parser.add_argument("--context_tokens", type=int, nargs=2, default=(150, 250), help="min max (approximate tokens)")
    parser.add_argument("--min_gap_tokens", type=int, default=60, help="least distance between link and place facts")
    parser.add_argument("--max_chains", type=int, default=3, help="chains (candidate answers) per context")
    parser.add_argument("--hidden_size", type=int, default=64)
    parser.add_argument("--num_hidden_layers", type=int, default=4)
    model = model_options()
    recipe = {"cluster_layers": [2], "num_clusters": 32, "window_size": 48, "window_stride": 40}
    add_option_flags(parser, [model[name] for name in recipe], defaults=recipe, dashes=False)
    parser.add_argument("--initializer_range", type=float, default=0.1)
    parser.add_argument("--learning_rate", type=float, default=1e-3)
    parser.add_argument("--batch_size", type=int, default=16)
    parser.add_argument("--max_steps", type=int, default=1200, help="long-context optimizer steps of each model")
    centroids = centroid_flag_options()  # the small models' settings (qa_training.SMALL_MODEL_CENTROIDS)
    add_option_flags(parser, centroids, defaults={option.name: option.default for option in centroids}, dashes=False)
    warmup = parser.add_argument_group("warm-up (stage 1: short contexts of a window or two)")
    warmup.add_argument("--warmup_steps", type=int, default=3000, help="0 skips the warm-up")
    warmup.add_argument("--warmup_context_tokens", type=int, nargs=2, default=(45, 70))
    warmup.add_argument("--warmup_min_gap_tokens", type=int, default=5)
    warmup.add_argument("--warmup_fact_fraction", type=float, default=0.6)
    warmup.add_argument("--warmup_learning_rate", type=float, default=2e-3)
    parser.add_argument("--quick", action="store_true", help="a smoke run of about a minute")
    return parser.parse_args()


def make_config(args: argparse.Namespace, tokenizer, cluster_layers: list[int]) -> ClusterFormerConfig:
    question_tokens = 16
    return ClusterFormerConfig(
        vocab_size=len(tokenizer),
        hidden_size=args.hidden_size,
        num_hidden_layers=args.num_hidden_layers,
        num_attention_heads=4,
        intermediate_size=4 * args.hidden_size,
        max_position_embeddings=required_position_embeddings(
            question_tokens, args.window_size, tokenizer.pad_token_id
        ),
        type_vocab_size=1,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        initializer_range=args.initializer_range,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        cluster_layers=cluster_layers,
        num_clusters=args.num_clusters,
        window_size=args.window_size,
        window_stride=args.window_stride,
        max_question_length=question_tokens,
        max_context_length=16384,
    )


def generate(args: argparse.Namespace, kinds, samples: int, split: str, warmup: bool = False) -> datasets.Dataset:
    """Questions of ``kinds`` over the long contexts, or over the warm-up's short ones; deterministic by seed."""
    if warmup:
        options = dict(context_tokens=tuple(args.warmup_context_tokens), min_gap_tokens=args.warmup_min_gap_tokens,
                       fact_fraction=args.warmup_fact_fraction, max_chains=args.max_chains)
    else:
        options = dict(
            context_tokens=tuple(args.context_tokens), min_gap_tokens=args.min_gap_tokens, max_chains=args.max_chains
        )
    records = []
    for kind in kinds:
        records += generate_longrange_dataset(samples, args.seed, kind=kind, split=split, **options)
    return datasets.Dataset.from_list(records, features=squad_features()).shuffle(seed=args.seed)


def tokenize(examples: datasets.Dataset, tokenizer) -> datasets.Dataset:
    return examples.map(
        prepare_train_features,
        batched=True,
        remove_columns=examples.column_names,
        fn_kwargs={"tokenizer": tokenizer, "max_length": 16384},
        desc="Tokenizing",
    ).remove_columns(["answer_truncated"])


def validation_sets(args: argparse.Namespace) -> dict[str, datasets.Dataset]:
    return {kind: generate(args, [kind], args.eval_samples, "validation") for kind in ("longrange", "local")}


def training_arguments(
    args: argparse.Namespace, output_dir: Path, steps: int, learning_rate: float, show_progress: bool
):
    return TrainingArguments(
        output_dir=str(output_dir),
        per_device_train_batch_size=args.batch_size,
        per_device_eval_batch_size=32,
        learning_rate=learning_rate,
        max_steps=steps,
        warmup_steps=0.05,
        lr_scheduler_type="linear",
        weight_decay=0.01,
        max_grad_norm=1.0,
        logging_steps=100,
        save_strategy="no",
        report_to="none",
        seed=args.seed,
        dataloader_num_workers=0,
        disable_tqdm=not show_progress,
    )


def train_in_process(name: str, layers: list[int], args: argparse.Namespace, show_progress: bool) -> dict:
    """Train one model on one thread (the two models train side by side): warm-up, then long contexts; evaluate,
    save."""
    torch.set_num_threads(1)
    datasets.disable_progress_bars()
    tokenizer = build_longrange_tokenizer(seed=args.seed)
    set_seed(args.seed)
    model = ClusterFormerForQuestionAnswering(make_config(args, tokenizer, layers))
    output_dir = Path(args.output_dir)
    stages = [  # (data, steps, learning rate)
        (generate(args, ("mention", "local"), args.train_samples, "warmup", warmup=True),
         args.warmup_steps, args.warmup_learning_rate),
        (generate(args, ("longrange", "local", "mention"), args.train_samples, "train"),
         args.max_steps, args.learning_rate),
    ]
    start = time.time()
    for examples, steps, learning_rate in stages:
        if steps <= 0:
            continue
        callbacks = []
        if layers:
            callbacks.append(CentroidUpdateCallback(centroid_arguments(args).settings(), seed=args.seed))
        training_args = training_arguments(args, output_dir / name, steps, learning_rate, show_progress)
        trainer = make_trainer(model, training_args, tokenize(examples, tokenizer), tokenizer, callbacks)
        trainer.train()
    train_seconds = time.time() - start
    data_args = DataArguments(max_seq_length=16384, max_answer_length=5)
    validation = validation_sets(args)
    scores = {
        split: predict_answers(trainer, examples, tokenizer, data_args)[1] for split, examples in validation.items()
    }
    model = trainer.model
    path = output_dir / name
    colocation = repeated_token_colocation(model, tokenizer, validation["longrange"]) if layers else None
    card = {
        "model_id": "clusterformer-demo" if layers else f"{name}-demo",
        "training_data": "Generated two-hop long-range QA (`clusterformer_research.longrange`) with its local "
                         "control and mention questions, after a warm-up on short contexts.",
        "results": [
            {"task": "question-answering",
             "dataset": {"name": f"Long-range QA (generated, {split} split)",
                         "type": "longrange" if split == "longrange" else "longrange-local", "split": "validation"},
             "metrics": {"exact_match": scores[split]["exact_match"], "f1": scores[split]["f1"]}}
            for split in ("longrange", "local")
        ],
    }
    if layers:
        card["centroid_fitting"] = (
            f"spherical K-Means every {args.centroid_update_steps} steps on a bank of {args.memory_size:,} states"
        )
    # weights, code, tokenizer and card: `clusterformer push` takes it
    save_for_hub(model, tokenizer, path, card_data=card)
    return {"scores": scores, "train_seconds": round(train_seconds, 1), "path": str(path), "colocation": colocation}


def repeated_token_colocation(model, tokenizer, examples: datasets.Dataset, count: int = 50) -> dict[str, float]:
    """Over ``count`` validation contexts: how often two occurrences of one token, a chunk or more apart, share a
    chunk in the first cluster layer (what the layer needs to carry a fact across windows), against chance."""
    shared = pairs = chance = 0.0
    rows = examples.select(range(min(count, len(examples))))
    for row in rows:
        report = inspect_clusters(model, tokenizer, row["question"], row["context"])
        s, p, c = report.repeated_token_colocation()
        shared, pairs, chance = shared + s, pairs + p, chance + c
    return {
        "shared_chunk": round(shared / max(pairs, 1), 4),
        "chance": round(chance / max(len(rows), 1), 4),
        "pairs": int(pairs),
    }


def main() -> None:
    args = parse_args()
    if args.quick:
        args.train_samples, args.eval_samples, args.max_steps, args.warmup_steps = 200, 40, 30, 30
    output_dir = Path(args.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    started = time.time()

    print("1/4 generating the tokenizer", flush=True)
    tokenizer = build_longrange_tokenizer(seed=args.seed)

    runs = {"clusterformer": args.cluster_layers, "sliding-window": []}
    print(f"2/4 training Cluster-Former (progress below) and the sliding-window baseline side by side: "
          f"{args.warmup_steps} warm-up steps on short contexts, then {args.max_steps} on long ones", flush=True)
    with ProcessPoolExecutor(max_workers=2, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = {
            name: pool.submit(train_in_process, name, layers, args, index == 0)
            for index, (name, layers) in enumerate(runs.items())
        }
        results = {name: future.result() for name, future in futures.items()}
    print("3/4 evaluated both models on the long-range and local validation splits", flush=True)

    table = ["| model | long-range EM | long-range F1 | local EM | local F1 | train s |", "|---|---|---|---|---|---|"]
    for name, result in results.items():
        s = result["scores"]
        table.append(
            f"| {name} | {s['longrange']['exact_match']:.1f} | {s['longrange']['f1']:.1f} | "
            f"{s['local']['exact_match']:.1f} | {s['local']['f1']:.1f} | {result['train_seconds']:.0f} |"
        )
    print("\n" + "\n".join(table) + "\n", flush=True)
    colocation = results["clusterformer"]["colocation"]
    print(f"Cluster layer {args.cluster_layers[0]}: occurrences of one token a chunk or more apart share a chunk "
          f"{colocation['shared_chunk']:.1%} of the time ({colocation['pairs']} pairs; "
          f"{colocation['chance']:.1%} by chance)", flush=True)

    print("4/4 answering one question over a long context", flush=True)
    (output_dir / "results.json").write_text(json.dumps({"args": vars(args), "results": results}, indent=1))
    (output_dir / "results.md").write_text("\n".join(table) + "\n")
    cluster_model = ClusterFormerForQuestionAnswering.from_pretrained(results["clusterformer"]["path"])
    example = generate_longrange_dataset(1, args.seed + 1, context_tokens=(2000, 3000), kind="longrange", split="test",
                                         min_gap_tokens=args.min_gap_tokens)[0]
    qa = qa_pipeline(model=cluster_model.eval(), tokenizer=tokenizer)
    start = time.perf_counter()
    answer = qa(question=example["question"], context=example["context"], max_answer_len=5)
    seconds = time.perf_counter() - start
    tokens = len(tokenizer(example["question"], example["context"])["input_ids"])
    print(f"Q: {example['question']}  ({tokens} tokens of context, one forward pass, {seconds:.2f} s)")
    print(f"A: {answer['answer']!r} (score {answer['score']:.3f}); gold: {example['answers']['text'][0]!r}")
    print(f"saved to {output_dir.resolve()} in {time.time() - started:.0f} s")


if __name__ == "__main__":
    main()
