#!/usr/bin/env python
"""Long-document classification with Cluster-Former: which SQuAD article an excerpt of several of its paragraphs
(2k-8k tokens) comes from.

The classes are the ``--num_classes`` SQuAD v1.1 dev articles with the most text (``../shared/data``). Each article's
paragraphs are split once, every ``--test_every``-th paragraph held out, so no text is shared between training and
test excerpts; an excerpt is a run of consecutive paragraphs of one side of the split, as many as reach a length drawn
from ``--excerpt_tokens_min``..``--excerpt_tokens_max``. `ClusterFormerForSequenceClassification` reads every
excerpt whole (one forward pass) and is trained with the ``Trainer`` and ``CentroidUpdateCallback``; the script
reports test accuracy (``--cluster_layers`` with no value gives the sliding-window model).

Example:
    python examples/run_classification.py --model_name_or_path ~/.cache/hf_clusterformer/all-MiniLM-L6-v2 \
        --window_size 128 --window_stride 112 --cluster_layers 3 --num_clusters 16 --output_dir out-cls \
        --do_train --do_eval --num_train_epochs 2 --learning_rate 5e-5

A bad input (an output folder that holds a model or an earlier run's ``all_results.json`` without ``--overwrite``, an
option) stops it with one line on stderr, exit status 2. With ``--overwrite`` the new model replaces the old one's own
files (config, weights, tokenizer, card, code, records, checkpoints); other files in the folder are kept.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import datasets
import numpy as np
from safetensors import SafetensorError
from transformers import AutoTokenizer, DataCollatorWithPadding, Trainer, TrainingArguments, set_seed

from hf_clusterformer import CentroidUpdateCallback, ClusterFormerConfig, ClusterFormerForSequenceClassification
from hf_clusterformer.callback import FiniteTrainingCallback
from hf_clusterformer.configuration_clusterformer import required_position_embeddings
from hf_clusterformer.conversion import checkpoint_model_type, convert_checkpoint, model_options
from hf_clusterformer.data import build_tokenizer
from hf_clusterformer.data.multipassage import default_squad_path, read_squad
from hf_clusterformer.qa_training import CentroidArguments, ModelArguments, _argument_parser
from hf_clusterformer_writing import run_output_dir


@dataclass
class ClassificationDataArguments:
    """Which articles, how they are split, and how long the excerpts are."""

    squad_path: str | None = field(default=None, metadata={"help": "SQuAD v1.1 json/zip (default ../shared/data)."})
    num_classes: int = field(default=8, metadata={"help": "Articles to tell apart (those with the most text)."})
    test_every: int = field(default=3, metadata={"help": "Every N-th paragraph of an article is held out for test."})
    train_per_class: int = field(default=12, metadata={"help": "Training excerpts per article."})
    test_per_class: int = field(default=4, metadata={"help": "Test excerpts per article."})
    excerpt_tokens_min: int = field(
        default=2000, metadata={"help": "Shortest excerpt (tokens, as far as one side holds)."}
    )
    excerpt_tokens_max: int = field(default=8000, metadata={"help": "Longest excerpt (tokens)."})
    excerpt_seed: int = field(default=0, metadata={"help": "Seed of the excerpts."})


def split_articles(
    path: str | None, num_classes: int, test_every: int
) -> tuple[list[str], list[list[str]], list[list[str]]]:
    """The ``num_classes`` longest SQuAD articles (by characters): titles, and per article its training and its
    held-out paragraphs (every ``test_every``-th, starting with the second)."""
    articles = read_squad(path or default_squad_path())["data"]
    if not 1 < num_classes <= len(articles):
        raise ValueError(f"--num_classes must be in [2, {len(articles)}], got {num_classes}.")
    if test_every < 2:
        raise ValueError(f"--test_every must be at least 2, got {test_every}.")
    longest = sorted(articles, key=lambda a: -sum(len(p["context"]) for p in a["paragraphs"]))[:num_classes]
    titles = [a["title"] for a in longest]
    paragraphs = [[p["context"].strip() for p in a["paragraphs"]] for a in longest]
    train = [[p for i, p in enumerate(ps) if i % test_every != 1] for ps in paragraphs]
    test = [[p for i, p in enumerate(ps) if i % test_every == 1] for ps in paragraphs]
    return titles, train, test


def draw_excerpts(paragraphs: list[list[str]], tokenizer, count: int, low: int, high: int, rng: np.random.Generator
                  ) -> datasets.Dataset:
    """``count`` excerpts per class: from a random paragraph on, consecutive paragraphs (wrapping around) until a
    length drawn from ``low..high`` tokens is reached or the class's paragraphs run out; ``text`` and ``label``."""
    rows = {"text": [], "label": []}
    for label, ps in enumerate(paragraphs):
        lengths = [len(ids) for ids in tokenizer(ps, add_special_tokens=False)["input_ids"]]
        for _ in range(count):
            target, start = int(rng.integers(low, high + 1)), int(rng.integers(len(ps)))
            picked, total = [], 0
            for step in range(len(ps)):
                index = (start + step) % len(ps)
                picked.append(ps[index])
                total += lengths[index]
                if total >= target:
                    break
            rows["text"].append("\n\n".join(picked))
            rows["label"].append(label)
    return datasets.Dataset.from_dict(rows)


def load_model(model_args, texts: list[str], labels: list[str], seed: int):
    """`ClusterFormerForSequenceClassification` with a new ``len(labels)``-way head, and its tokenizer: from a
    Cluster-Former or RoBERTa checkpoint, a converted BERT-family one (its pooler kept as the head's dense layer), or
    from scratch with a BPE built on ``texts``."""
    options = {name: getattr(model_args, name) for name in model_options() if getattr(model_args, name) is not None}
    head = dict(
        num_labels=len(labels), id2label=dict(enumerate(labels)), label2id={t: i for i, t in enumerate(labels)}
    )
    if model_args.dropout is not None:
        head.update(hidden_dropout_prob=model_args.dropout, attention_probs_dropout_prob=model_args.dropout)
    path = model_args.model_name_or_path
    if path is None:
        tokenizer = build_tokenizer(texts, vocab_size=model_args.vocab_size)
        config = ClusterFormerConfig(vocab_size=len(tokenizer), hidden_size=model_args.hidden_size,
                                     num_hidden_layers=model_args.num_hidden_layers,
                                     num_attention_heads=model_args.num_attention_heads,
                                     intermediate_size=model_args.intermediate_size, **options, **head)
        config.max_position_embeddings = required_position_embeddings(config.max_question_length, config.window_size)
        return ClusterFormerForSequenceClassification(config), tokenizer
    with tempfile.TemporaryDirectory() as folder:
        if checkpoint_model_type(path) == "bert":
            path = convert_checkpoint(path, Path(folder) / "model", task="sequence-classification", seed=seed,
                                      **options).path
            options = {}
        model = ClusterFormerForSequenceClassification.from_pretrained(path, ignore_mismatched_sizes=True, **options,
                                                                       **head)
        tokenizer = AutoTokenizer.from_pretrained(model_args.tokenizer_name or path)
    tokenizer.model_max_length = max(tokenizer.model_max_length or 0, model.config.max_input_length)
    return model, tokenizer


def main(argv: list[str] | None = None) -> dict:
    parser = _argument_parser((ModelArguments, ClassificationDataArguments, CentroidArguments, TrainingArguments))
    model_args, data_args, centroid_args, training_args = parser.parse_args_into_dataclasses(args=argv)
    with run_output_dir(training_args, model_args.overwrite):  # the write rule of `clusterformer train`
        return _run(model_args, data_args, centroid_args, training_args)


def _run(model_args, data_args, centroid_args, training_args):
    """`main` once the output folder is settled: ``training_args.output_dir`` is where this run writes."""
    if not 0 < data_args.excerpt_tokens_min <= data_args.excerpt_tokens_max:
        raise ValueError("--excerpt_tokens_min must be positive and at most --excerpt_tokens_max.")
    set_seed(training_args.seed)
    titles, train_paragraphs, test_paragraphs = split_articles(data_args.squad_path, data_args.num_classes,
                                                               data_args.test_every)
    model, tokenizer = load_model(model_args, [p for ps in train_paragraphs for p in ps], titles, training_args.seed)
    rng = np.random.default_rng(data_args.excerpt_seed)
    span = (data_args.excerpt_tokens_min, data_args.excerpt_tokens_max)
    train = draw_excerpts(train_paragraphs, tokenizer, data_args.train_per_class, *span, rng)
    test = draw_excerpts(test_paragraphs, tokenizer, data_args.test_per_class, *span, rng)

    def encode(batch):
        return tokenizer(batch["text"])

    train, test = (split.map(encode, batched=True, remove_columns=["text"]) for split in (train, test))
    callbacks = [CentroidUpdateCallback(centroid_args.settings(), seed=training_args.seed)] \
        if model.cluster_routers() else []
    callbacks.append(FiniteTrainingCallback())  # one line at the first NaN/inf, nothing saved
    trainer = Trainer(model=model, args=training_args, train_dataset=train, processing_class=tokenizer,
                      data_collator=DataCollatorWithPadding(tokenizer), callbacks=callbacks)
    lengths = [len(ids) for ids in test["input_ids"]]
    results = {"layer_kinds": ",".join(model.config.layer_kinds), "classes": titles, "train_excerpts": len(train),
               "test_excerpts": len(test), "test_tokens_min": min(lengths), "test_tokens_max": max(lengths)}
    if training_args.do_train:
        started = time.perf_counter()
        outcome = trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
        results.update(train_loss=outcome.training_loss, train_steps=outcome.global_step,
                       train_seconds=round(time.perf_counter() - started, 1))
        trainer.save_model()
    if training_args.do_eval:
        prediction = trainer.predict(test)
        results["test_accuracy"] = float((prediction.predictions.argmax(-1) == np.array(test["label"])).mean())
        results["test_loss"] = prediction.metrics.get("test_loss")
    Path(training_args.output_dir).mkdir(parents=True, exist_ok=True)
    (Path(training_args.output_dir) / "all_results.json").write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results))
    return results


if __name__ == "__main__":
    try:
        main()
    except (OSError, ValueError, SafetensorError) as error:  # an output folder that holds a model, data, options
        print(f"run_classification.py: error: {' '.join(str(error).split())}", file=sys.stderr)
        sys.exit(2)
