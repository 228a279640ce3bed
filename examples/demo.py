#!/usr/bin/env python
"""The main job on the embedded default data: Cluster-Former vs. a sliding-window baseline, from scratch, on CPU.

1. Generate the long-range QA data (two-hop, facts more than a window apart) and its local control split.
2. Build a byte-level BPE tokenizer on the generated text.
3. Train a small sliding-window reader (a windowed RoBERTa, no cluster layers) on short contexts, where
   every question kind fits a window or two: the stand-in for the pretrained RoBERTa checkpoint that
   Cluster-Former starts from, which cannot be downloaded here.
4. Start a Cluster-Former (its cluster layers fitted by `CentroidUpdateCallback`) and a sliding-window
   baseline from that checkpoint and train both on long contexts, on the same data, budget and seeds.
5. Evaluate both on both splits, print the EM/F1 table, save models, tokenizer, centroids, model card and
   results under ``--output_dir``, and answer one question over a long context with the pipeline.

``python examples/demo.py --output_dir outputs`` (what ``make demo`` runs); ``--quick`` is a smoke run.
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

from hf_clusterformer import CentroidUpdateCallback, ClusterFormerConfig, ClusterFormerForQuestionAnswering
from hf_clusterformer import pipeline as qa_pipeline
from hf_clusterformer.data import build_longrange_tokenizer, generate_longrange_dataset, squad_features
from hf_clusterformer.features import prepare_train_features
from hf_clusterformer.hub import save_for_hub
from hf_clusterformer.qa_training import DataArguments, make_trainer, predict_answers


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output_dir", default="outputs")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--train_samples", type=int, default=3000, help="per question kind (long-range, local, mention)")
    parser.add_argument("--eval_samples", type=int, default=200, help="per split")
    parser.add_argument("--context_tokens", type=int, nargs=2, default=(150, 250), help="min max (approximate tokens)")
    parser.add_argument("--min_gap_tokens", type=int, default=60, help="least distance between the facts of a chain")
    parser.add_argument("--max_chains", type=int, default=3, help="chains (candidate answers) per context")
    parser.add_argument("--hidden_size", type=int, default=64)
    parser.add_argument("--num_hidden_layers", type=int, default=4)
    parser.add_argument("--cluster_layers", type=int, nargs="+", default=[2])
    parser.add_argument("--num_clusters", type=int, default=32)
    parser.add_argument("--window_size", type=int, default=48)
    parser.add_argument("--window_stride", type=int, default=40)
    parser.add_argument("--initializer_range", type=float, default=0.1)
    parser.add_argument("--learning_rate", type=float, default=1e-3)
    parser.add_argument("--epochs", type=float, default=2.0)
    parser.add_argument("--batch_size", type=int, default=16)
    parser.add_argument("--max_steps", type=int, default=1800, help="optimizer steps (overrides --epochs when > 0)")
    parser.add_argument("--centroid_update_steps", type=int, default=50)
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
        max_position_embeddings=args.window_size + question_tokens + 3 + 2,
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


def generate(args: argparse.Namespace) -> tuple[datasets.Dataset, dict[str, datasets.Dataset]]:
    options = dict(context_tokens=tuple(args.context_tokens), min_gap_tokens=args.min_gap_tokens, max_chains=args.max_chains)
    train, validation = [], {}
    for kind in ("longrange", "local", "mention"):  # mention questions teach name matching first
        train += generate_longrange_dataset(args.train_samples, args.seed, kind=kind, split="train", **options)
    for kind in ("longrange", "local"):
        records = generate_longrange_dataset(args.eval_samples, args.seed, kind=kind, split="validation", **options)
        validation[kind] = datasets.Dataset.from_list(records, features=squad_features())
    mixed = datasets.Dataset.from_list(train, features=squad_features()).shuffle(seed=args.seed)
    return mixed, validation


def prepare(args: argparse.Namespace):
    """Data, tokenizer and training features; deterministic, so every process builds the same."""
    train, validation = generate(args)
    tokenizer = build_longrange_tokenizer(seed=args.seed)
    train_features = train.map(
        prepare_train_features,
        batched=True,
        remove_columns=train.column_names,
        fn_kwargs={"tokenizer": tokenizer, "max_length": 16384},
        desc="Tokenizing",
    ).remove_columns(["answer_truncated"])
    return train, validation, tokenizer, train_features


def train_in_process(name: str, layers: list[int], args: argparse.Namespace, show_progress: bool) -> dict:
    """Train and evaluate one model on one thread (the two models train side by side); save it."""
    torch.set_num_threads(1)
    datasets.disable_progress_bars()
    _, validation, tokenizer, train_features = prepare(args)
    run = train_and_evaluate(
        name, make_config(args, tokenizer, layers), train_features, validation, tokenizer, args, Path(args.output_dir), show_progress
    )
    model = run["model"]
    path = Path(args.output_dir) / name
    if layers:
        card = {
            "model_id": "clusterformer-demo",
            "training_data": "Generated two-hop long-range QA (`hf_clusterformer.data.longrange`) with its local control and mention questions.",
            "results": [
                {"task": "question-answering",
                 "dataset": {"name": f"Long-range QA (generated, {split} split)", "type": "longrange" if split == "longrange" else "longrange-local", "split": "validation"},
                 "metrics": {"exact_match": run["scores"][split]["exact_match"], "f1": run["scores"][split]["f1"]}}
                for split in ("longrange", "local")
            ],
            "centroids_fitted": {i: bool(r.fitted) for i, r in model.cluster_routers().items()},
            "centroid_fitting": f"spherical K-Means every {args.centroid_update_steps} steps on a bank of 20k states",
        }
        save_for_hub(model, tokenizer, path, card_data=card)
    else:
        model.save_pretrained(path)
        tokenizer.save_pretrained(path)
    return {"scores": run["scores"], "train_seconds": round(run["train_seconds"], 1), "path": str(path)}


def train_and_evaluate(name, config, train_features, validation, tokenizer, args, output_dir: Path, show_progress=True) -> dict:
    set_seed(args.seed)
    model = ClusterFormerForQuestionAnswering(config)
    callbacks = []
    if config.cluster_layers:
        callbacks.append(
            CentroidUpdateCallback(update_every_steps=args.centroid_update_steps, update_every_epochs=None,
                                   memory_size=20_000, max_capture_per_forward=2048, seed=args.seed)
        )
    training_args = TrainingArguments(
        output_dir=str(output_dir / name),
        per_device_train_batch_size=args.batch_size,
        per_device_eval_batch_size=32,
        learning_rate=args.learning_rate,
        num_train_epochs=args.epochs,
        max_steps=args.max_steps,
        warmup_steps=0.1,
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
    trainer = make_trainer(model, training_args, train_features, tokenizer, callbacks)
    start = time.time()
    trainer.train()
    train_seconds = time.time() - start
    data_args = DataArguments(max_seq_length=16384, max_answer_length=5)
    scores = {}
    for split, examples in validation.items():
        _, scores[split] = predict_answers(trainer, examples, tokenizer, data_args)
    return {"model": trainer.model, "scores": scores, "train_seconds": train_seconds}


def main() -> None:
    args = parse_args()
    if args.quick:
        args.train_samples, args.eval_samples, args.epochs, args.max_steps = 200, 40, 1.0, -1
    output_dir = Path(args.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    started = time.time()

    print("1/4 generating data and tokenizer", flush=True)
    train, _, tokenizer, train_features = prepare(args)
    lengths = [len(ids) for ids in train_features["input_ids"]]
    print(f"   {len(train)} training questions, {min(lengths)}-{max(lengths)} tokens each", flush=True)

    runs = {"clusterformer": args.cluster_layers, "sliding-window": []}
    print("2/4 training Cluster-Former (progress below) and the sliding-window baseline side by side", flush=True)
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
