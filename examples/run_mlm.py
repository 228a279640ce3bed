#!/usr/bin/env python
"""Continued masked-language-model pretraining of Cluster-Former on long documents.

Like transformers' ``run_mlm.py`` (``--model_name_or_path``, ``--train_file``, ``--validation_file``,
``--max_seq_length``, ``--mlm_probability``, ``--max_train_samples``, ``--max_eval_samples`` and every
``TrainingArguments`` flag), but each document is cut into blocks of ``--max_seq_length`` tokens that the model reads
whole (one forward pass per block, however long), and the cluster centroids are refitted during training by
``CentroidUpdateCallback`` (and fitted once on ``--initial_centroid_blocks`` training blocks before the first
evaluation). Without data files, the SQuAD v1.1 dev articles (``../shared/data``) are the data: every article's
paragraphs joined into one long document, articles split into training and held-out ones.

Evaluation masks the held-out blocks once with a fixed seed (``--eval_mask_seed``), so losses before and after
training are on the same masked tokens; it reports the loss over all masked tokens, and over the masked tokens whose
token occurs (unmasked) in the block outside every window that holds them (``eval_outside_*``), where a global layer
can help and a sliding window alone cannot see the other occurrence directly.

Examples:
    # MiniLM (BERT-family) converted on the fly, windows 128/112, a cluster layer at layer 4
    python examples/run_mlm.py --model_name_or_path ~/.cache/hf_clusterformer/all-MiniLM-L6-v2 \
        --window_size 128 --window_stride 112 --cluster_layers 4 --num_clusters 32 --max_seq_length 2048 \
        --output_dir out-mlm --do_train --do_eval --max_steps 100 --centroid_update_steps 25
    # its sliding-window baseline: --cluster_layers with no value
    # from scratch on your own text (documents separated by blank lines; or .json/.jsonl with a "text" field)
    python examples/run_mlm.py --train_file docs.txt --validation_file held_out.txt --output_dir out --do_train

A bad input (an output folder that holds a model or an earlier run's ``all_results.json`` without ``--overwrite``, a
data file, an option) stops it with one line on stderr, exit status 2. With ``--overwrite`` the new model replaces the
old one's own files (config, weights, tokenizer, card, code, records, checkpoints); other files in the folder are kept.
"""

from __future__ import annotations

import json
import math
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import datasets
import torch
from safetensors import SafetensorError
from transformers import (
    AutoTokenizer,
    DataCollatorForLanguageModeling,
    DataCollatorForTokenClassification,
    Trainer,
    TrainingArguments,
    set_seed,
)

from hf_clusterformer import CentroidUpdateCallback, ClusterFormerConfig, ClusterFormerForMaskedLM
from hf_clusterformer.callback import FiniteTrainingCallback
from hf_clusterformer.centroid_updates import CentroidUpdater
from hf_clusterformer.configuration_clusterformer import required_position_embeddings
from hf_clusterformer.conversion import checkpoint_model_type, convert_checkpoint, model_options
from hf_clusterformer.data import build_tokenizer
from hf_clusterformer.data.multipassage import default_squad_path, read_squad
from hf_clusterformer.qa_training import CentroidArguments, ModelArguments, _argument_parser
from hf_clusterformer_writing import run_output_dir


@dataclass
class MlmDataArguments:
    """Which documents, how they are cut into blocks, and how tokens are masked."""

    train_file: str | None = field(default=None, metadata={
        "help": "Training documents: .txt (separated by blank lines) or .json/.jsonl records with a 'text' field. "
                "Default: the SQuAD v1.1 dev articles, one document each."})
    validation_file: str | None = field(default=None, metadata={"help": "Held-out documents, as --train_file."})
    squad_path: str | None = field(default=None, metadata={"help": "SQuAD v1.1 json/zip (default ../shared/data)."})
    validation_articles: int = field(default=6, metadata={"help": "SQuAD articles held out for evaluation."})
    max_seq_length: int = field(default=4096, metadata={"help": "Tokens per block (with <s> and </s>)."})
    min_block_length: int = field(
        default=64, metadata={"help": "A document's last, shorter block is kept from this length."}
    )
    mlm_probability: float = field(default=0.15, metadata={"help": "Share of tokens masked."})
    max_train_samples: int | None = field(default=None, metadata={"help": "Keep at most this many training blocks."})
    max_eval_samples: int | None = field(default=None, metadata={"help": "Keep at most this many held-out blocks."})
    eval_mask_seed: int = field(default=0, metadata={"help": "Seed of the held-out blocks' one masking."})
    initial_centroid_blocks: int = field(default=8, metadata={
        "help": "Fit the centroids on this many training blocks before the first evaluation (0: keep them)."})
    train_head_only: bool = field(default=False, metadata={
        "help": "Train only the MLM head's own weights (dense, LayerNorm, bias; the decoder stays tied to the frozen "
                "word embeddings), the encoder frozen: a start for a checkpoint without an MLM head."})


# -- data ---------------------------------------------------------------------------------------------------------


def read_documents(path: str) -> list[str]:
    """The documents of a .txt (separated by blank lines) or .json/.jsonl file (records with a ``text`` field)."""
    file = Path(path)
    if not file.is_file():
        raise FileNotFoundError(f"data file {path} does not exist.")
    if file.suffix not in (".txt", ".json", ".jsonl"):
        raise ValueError(f"data file {path} must be .txt, .json or .jsonl.")
    try:
        text = file.read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise ValueError(f"data file {path} is not UTF-8 text (byte {error.start}: {error.reason}); "
                         "save it as UTF-8.") from None
    if file.suffix == ".txt":
        return [doc.strip() for doc in text.split("\n\n") if doc.strip()]
    if file.suffix == ".jsonl":
        records = [json.loads(line) for line in text.splitlines() if line.strip()]
    else:
        records = json.loads(text)
    if not isinstance(records, list) or not all(
        isinstance(r, dict) and isinstance(r.get("text"), str) for r in records
    ):
        raise ValueError(f"data file {path} must hold records with a 'text' field.")
    return [r["text"] for r in records if r["text"].strip()]


def squad_articles(path: str | None, held_out: int) -> tuple[list[str], list[str]]:
    """The SQuAD dev articles as documents (paragraphs joined), split by article: (training, held-out last ones)."""
    squad = read_squad(path or default_squad_path())
    articles = [" ".join(p["context"].strip() for p in a["paragraphs"]) for a in squad["data"]]
    if not 0 < held_out < len(articles):
        raise ValueError(f"--validation_articles must be in [1, {len(articles) - 1}], got {held_out}.")
    return articles[:-held_out], articles[-held_out:]


def cut_blocks(documents: list[str], tokenizer, length: int, min_length: int, limit: int | None) -> datasets.Dataset:
    """Every document cut into blocks ``<s> tokens </s>`` of at most ``length`` tokens (a document's shorter last
    block kept from ``min_length``), in document order; at most ``limit`` blocks."""
    if length < 3:
        raise ValueError(f"--max_seq_length must be at least 3, got {length}.")
    body = length - 2
    blocks = []
    for ids in tokenizer(documents, add_special_tokens=False)["input_ids"]:
        for start in range(0, len(ids), body):
            piece = ids[start : start + body]
            if len(piece) == body or len(piece) + 2 >= min_length:
                blocks.append([tokenizer.cls_token_id, *piece, tokenizer.sep_token_id])
        if limit is not None and len(blocks) >= limit:
            break
    blocks = blocks[:limit]
    if not blocks:
        raise ValueError("the documents give no block; give longer documents or a lower --min_block_length.")
    return datasets.Dataset.from_dict({"input_ids": blocks, "attention_mask": [[1] * len(b) for b in blocks]})


def mask_once(blocks: datasets.Dataset, tokenizer, probability: float, seed: int) -> datasets.Dataset:
    """The blocks masked once, reproducibly (BERT's 80/10/10 rule): ``input_ids`` with masks, ``labels`` -100 but at
    the masked positions."""
    collator = DataCollatorForLanguageModeling(tokenizer, mlm_probability=probability, seed=seed)
    rows = {"input_ids": [], "attention_mask": [], "labels": []}
    generator = torch.Generator().manual_seed(seed)
    for example in blocks:
        masked = no_special_draws(collator([{"input_ids": example["input_ids"]}]), tokenizer, generator)
        rows["input_ids"].append(masked["input_ids"][0].tolist())
        rows["labels"].append(masked["labels"][0].tolist())
        rows["attention_mask"].append(example["attention_mask"])
    return datasets.Dataset.from_dict(rows)


def no_special_draws(batch: dict, tokenizer, generator: torch.Generator | None = None) -> dict:
    """``batch`` (a masking collator's) with every masked position that BERT's 10% random replacement filled with a
    special token (the pad id among them, which reads as padding) redrawn from the ordinary tokens."""
    special = torch.tensor(sorted(set(tokenizer.all_special_ids) - {tokenizer.mask_token_id}))
    ids, labels = batch["input_ids"], batch["labels"]
    drawn = (labels != -100) & torch.isin(ids, special)
    if drawn.any():
        ordinary = torch.tensor([i for i in range(len(tokenizer)) if i not in set(special.tolist())])
        ids[drawn] = ordinary[torch.randint(len(ordinary), (int(drawn.sum()),), generator=generator)]
    return batch


class MlmCollator:
    """Training blocks get fresh masks every batch (never a special token drawn as a random replacement);
    pre-masked (held-out) blocks are only padded."""

    def __init__(self, tokenizer, probability: float):
        self.tokenizer = tokenizer
        self.masking = DataCollatorForLanguageModeling(tokenizer, mlm_probability=probability)
        self.padding = DataCollatorForTokenClassification(tokenizer)

    def __call__(self, examples: list[dict]) -> dict[str, torch.Tensor]:
        if "labels" in examples[0]:
            return self.padding(examples)
        return no_special_draws(self.masking(examples), self.tokenizer)


# -- model --------------------------------------------------------------------------------------------------------


def load_model(
    model_args, data_args, train_documents: list[str], seed: int = 0
) -> tuple[ClusterFormerForMaskedLM, object]:
    """The MLM model and tokenizer: a Cluster-Former or RoBERTa checkpoint as it is, a BERT-family one converted
    (``cls.predictions`` to ``lm_head``, or a new head drawn with ``seed``), or a model from scratch with a BPE built
    on the data."""
    options = {name: getattr(model_args, name) for name in model_options() if getattr(model_args, name) is not None}
    extra = {}
    if model_args.dropout is not None:
        extra = dict(hidden_dropout_prob=model_args.dropout, attention_probs_dropout_prob=model_args.dropout)
    path = model_args.model_name_or_path
    if path is None:
        tokenizer = build_tokenizer(train_documents, vocab_size=model_args.vocab_size)
        values = dict(vocab_size=len(tokenizer), hidden_size=model_args.hidden_size,
                      num_hidden_layers=model_args.num_hidden_layers,
                      num_attention_heads=model_args.num_attention_heads,
                      intermediate_size=model_args.intermediate_size, **options, **extra)
        config = ClusterFormerConfig(**values)
        config.max_position_embeddings = required_position_embeddings(config.max_question_length, config.window_size)
        return ClusterFormerForMaskedLM(config), tokenizer
    if checkpoint_model_type(path) == "bert":
        with tempfile.TemporaryDirectory() as folder:
            converted = convert_checkpoint(path, Path(folder) / "model", task="mlm", seed=seed, **options)
            if converted.newly_initialized:
                print(f"run_mlm.py: new weights (not in {path}): {', '.join(converted.newly_initialized)}",
                      file=sys.stderr)
            model = ClusterFormerForMaskedLM.from_pretrained(converted.path, **extra)
            tokenizer = AutoTokenizer.from_pretrained(converted.path)
    else:
        model = ClusterFormerForMaskedLM.from_pretrained(path, **options, **extra)
        tokenizer = AutoTokenizer.from_pretrained(model_args.tokenizer_name or path)
    # the saved tokenizer reads up to the model's limit (pipelines would cut at RoBERTa's 512)
    tokenizer.model_max_length = max(tokenizer.model_max_length or 0, data_args.max_seq_length,
                                     model.config.max_input_length)
    return model, tokenizer


@torch.no_grad()
def fit_initial_centroids(model, blocks: datasets.Dataset, count: int, settings) -> int:
    """Fit the cluster layers' centroids on the states of the first ``count`` training blocks (train mode, no
    gradients); returns the number of blocks used (0 when the model has no cluster layer)."""
    if count <= 0 or not model.cluster_routers():
        return 0
    updater = CentroidUpdater(model, settings, min_states=0)
    was_training = model.training
    model.train()
    try:
        for example in blocks.select(range(min(count, len(blocks)))):
            model(input_ids=torch.tensor([example["input_ids"]], device=model.device))
        updater.update()
    finally:
        updater.close()
        model.train(was_training)
    return min(count, len(blocks))


def freeze_all_but_head(model: ClusterFormerForMaskedLM) -> list[str]:
    """Freeze every weight but the MLM head's own (the tied decoder is the word embeddings, so it stays frozen too);
    returns the names of the weights left to train."""
    trainable = []
    for name, parameter in model.named_parameters():  # tied weights are listed once, under the encoder's name
        parameter.requires_grad = name.startswith("lm_head.")
        if parameter.requires_grad:
            trainable.append(name)
    return trainable


# -- evaluation ---------------------------------------------------------------------------------------------------


def outside_window(
    input_ids: torch.Tensor, labels: torch.Tensor, window_size: int, window_stride: int
) -> torch.Tensor:
    """Which masked tokens occur, unmasked, in the block outside every window that holds them.

    A single text ``<s> T </s>`` is windowed over T and its ``</s>``: text index ``j = position - 1`` lies in windows
    ``k`` with ``m k <= j < m k + l``, whose union is ``[m k_first, m k_last + l)``.

    Args:
        input_ids: (T,) the masked block; labels: (T,) original ids at masked positions, -100 elsewhere.
        window_size, window_stride: l and m.

    Returns:
        (n,) bool over the masked positions, in position order.
    """
    positions = torch.nonzero(labels != -100).squeeze(1)  # (n,)
    index = positions - 1
    windows = 1 + max(0, math.ceil((input_ids.shape[0] - 1 - window_size) / window_stride))
    first = ((index - window_size) // window_stride + 1).clamp(min=0)  # (n,)
    last = (index // window_stride).clamp(max=windows - 1)
    start, end = first * window_stride + 1, last * window_stride + window_size + 1  # positions of the union
    same = input_ids.unsqueeze(0) == labels[positions].unsqueeze(1)  # (n, T) visible copies of the masked token
    where = torch.arange(input_ids.shape[0]).unsqueeze(0)
    return (same & ((where < start.unsqueeze(1)) | (where >= end.unsqueeze(1)))).any(1)


@torch.no_grad()
def evaluate_blocks(model, blocks: datasets.Dataset) -> dict[str, float]:
    """Held-out MLM loss over the pre-masked blocks, token-weighted: over all masked tokens and split into those that
    occur outside their windows (`outside_window`) and the rest."""
    model.eval()
    config = model.config
    losses, outside = [], []
    for example in blocks:
        ids = torch.tensor(example["input_ids"])
        labels = torch.tensor(example["labels"])
        mask = torch.tensor(example["attention_mask"]).unsqueeze(0).to(model.device)  # a drawn pad id is a token
        logits = model(input_ids=ids.unsqueeze(0).to(model.device), attention_mask=mask).logits[0].float().cpu()
        masked = labels != -100
        losses.append(torch.nn.functional.cross_entropy(logits[masked], labels[masked], reduction="none"))
        outside.append(outside_window(ids, labels, config.window_size, config.window_stride))
    losses, outside = torch.cat(losses), torch.cat(outside)

    def mean(values: torch.Tensor) -> float:
        return float(values.mean()) if values.numel() else float("nan")

    return {"loss": mean(losses), "masked_tokens": int(losses.numel()), "outside_fraction": mean(outside.float()),
            "outside_loss": mean(losses[outside]), "inside_loss": mean(losses[~outside])}


# -- main ---------------------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = _argument_parser((ModelArguments, MlmDataArguments, CentroidArguments, TrainingArguments))
    model_args, data_args, centroid_args, training_args = parser.parse_args_into_dataclasses(args=argv)
    if not (training_args.do_train or training_args.do_eval):
        raise ValueError("nothing to do: give --do_train, --do_eval or both (nothing was written).")
    with run_output_dir(training_args, model_args.overwrite):  # the write rule of `clusterformer train`
        return _run(model_args, data_args, centroid_args, training_args)


def _run(model_args, data_args, centroid_args, training_args):
    """`main` once the output folder is settled: ``training_args.output_dir`` is where this run writes."""
    set_seed(training_args.seed)
    if data_args.train_file or data_args.validation_file:
        train_docs = read_documents(data_args.train_file) if data_args.train_file else []
        eval_docs = read_documents(data_args.validation_file) if data_args.validation_file else []
    else:
        train_docs, eval_docs = squad_articles(data_args.squad_path, data_args.validation_articles)
    if training_args.do_train and not train_docs:
        raise ValueError("--do_train needs training documents (--train_file).")
    if training_args.do_eval and not eval_docs:
        raise ValueError("--do_eval needs held-out documents (--validation_file).")
    model, tokenizer = load_model(model_args, data_args, train_docs or eval_docs, training_args.seed)
    length, shortest = data_args.max_seq_length, data_args.min_block_length
    train = cut_blocks(train_docs, tokenizer, length, shortest, data_args.max_train_samples) if train_docs else None
    held_out = None
    if training_args.do_eval:
        held_out = cut_blocks(eval_docs, tokenizer, length, shortest, data_args.max_eval_samples)
        held_out = mask_once(held_out, tokenizer, data_args.mlm_probability, data_args.eval_mask_seed)

    metrics: dict[str, float] = {"layer_kinds": ",".join(model.config.layer_kinds)}
    if data_args.train_head_only:
        metrics["trained_weights"] = ",".join(freeze_all_but_head(model))
    if train is not None:
        metrics["initial_centroid_blocks"] = fit_initial_centroids(
            model, train, data_args.initial_centroid_blocks, centroid_args.settings())
        metrics["train_blocks"], metrics["train_tokens"] = len(train), sum(len(ids) for ids in train["input_ids"])
    if held_out is not None:
        metrics.update({f"eval_{k}_before": v for k, v in evaluate_blocks(model, held_out).items()})
    if training_args.do_train:
        callbacks = [CentroidUpdateCallback(centroid_args.settings(), seed=training_args.seed)] \
            if model.cluster_routers() else []
        callbacks.append(FiniteTrainingCallback())  # one line at the first NaN/inf, nothing saved
        trainer = Trainer(model=model, args=training_args, train_dataset=train, processing_class=tokenizer,
                          data_collator=MlmCollator(tokenizer, data_args.mlm_probability), callbacks=callbacks)
        started = time.perf_counter()
        result = trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
        metrics.update(train_loss=result.training_loss, train_steps=result.global_step,
                       train_seconds=round(time.perf_counter() - started, 1))
        trainer.save_model()  # weights, config with auto_map, the model code and the tokenizer
        trainer.save_state()
    if held_out is not None:
        metrics.update({f"eval_{k}": v for k, v in evaluate_blocks(model, held_out).items()})
        metrics["eval_blocks"] = len(held_out)
    Path(training_args.output_dir).mkdir(parents=True, exist_ok=True)
    (Path(training_args.output_dir) / "all_results.json").write_text(json.dumps(metrics, indent=2) + "\n")
    print(json.dumps(metrics))
    return metrics


if __name__ == "__main__":
    try:
        main()
    except (OSError, ValueError, SafetensorError) as error:  # an output folder that holds a model, data, options
        print(f"run_mlm.py: error: {' '.join(str(error).split())}", file=sys.stderr)
        sys.exit(2)
