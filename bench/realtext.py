#!/usr/bin/env python
"""Real text: fine-tune Cluster-Former and the sliding-window model from all-MiniLM-L6-v2 on SQuAD v1.1 dev and score
both on held-out articles, with the gold paragraph alone and inside multi-passage contexts of 2k to 16k tokens.

Both variants start from the same converted MiniLM (BERT-family, 6 layers, 512 positions): ``clusterformer`` has one
cluster layer (``--cluster_layer``, default 3) whose centroids `CentroidUpdater` refits during training; ``sliding``
has none. Same data, seeds, steps and learning rate for both.

Data (``../shared/data/squad-v1.1-dev.json.zip`` from the repository root, or ``$CLUSTERFORMER_SQUAD_PATH``; 48
articles) is split by article:

* training: questions of articles 0-39 with their gold paragraph as context (``--train_questions`` of them, drawn
  with the run's seed; 8,981 in all), truncated to ``--max_length`` tokens; optionally ``--mp_steps`` more steps on
  multi-passage contexts of ``--mp_tokens`` tokens (gold among distractors from other training articles);
* evaluation: ``--eval_questions`` questions of articles 40-47, drawn once with ``--question_seed`` (the same
  questions in every cell, for every model and seed), each scored (a) with its gold paragraph alone (the oracle) and
  (b) inside contexts of about ``--lengths`` tokens where the gold paragraph sits at a random place among distractor
  paragraphs: ``other`` draws them from other articles, ``same`` from the gold's own article first, then from others.
  Distractors come from the evaluation articles (``--distractor_pool all`` allows training articles too).

For every model x length x kind it records SQuAD EM / F1 (`hf_clusterformer.metrics`), seconds per question, and for
the cluster layer how often the gold passage / the answer span shares a chunk with a question token (and, for
reference, how often a distractor passage does). Per-seed JSON, ``results.md`` and ``f1_vs_length.png`` go to
``--output_dir``.

Before it starts, it times ``--budget_steps`` training steps of batch ``--budget_batch`` at ``--budget_tokens`` tokens
on one thread plus one evaluation forward pass, and prints the estimated time of the configured run::

    python bench/realtext.py --output_dir bench/measured/realtext/full --parallel          # the full run
    python bench/realtext.py --tiny --output_dir /tmp/realtext-tiny                         # a smoke run (< 1 min)
    python bench/realtext.py --budget_only                                                  # the estimate alone
    python bench/realtext.py --report_only --output_dir DIR                                 # table + plot again

``--parallel`` runs each variant in its own process with one thread (``--threads``), side by side.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from hf_clusterformer import CentroidUpdater, ClusterFormerForQuestionAnswering
from hf_clusterformer.centroid_updates import CentroidUpdateSettings
from hf_clusterformer.conversion import convert_checkpoint
from hf_clusterformer.data.multipassage import SQUAD_PATH_ENV, read_squad
from hf_clusterformer.features import postprocess_predictions, prepare_train_features, prepare_validation_features
from hf_clusterformer.hub import quiet_loading
from hf_clusterformer.metrics import compute_squad
from hf_clusterformer.modeling_clusterformer import count_windows, locate_question_prefix
from hf_clusterformer.pretrained import fetch_pretrained

ROOT = Path(__file__).resolve().parents[1]
VARIANTS = ("clusterformer", "sliding")
KINDS = ("other", "same")
ORACLE = "oracle"

TINY = dict(
    steps=3, batch_size=2, train_questions=16, eval_questions=3, lengths=[400, 800], seeds=[0], window_size=64,
    window_stride=56, num_clusters=8, min_states=32, update_every_steps=2, memory_size=2000, budget_steps=1,
    budget_batch=2, budget_tokens=128, budget_eval_tokens=400, mp_tokens=[200, 300], log_every=1,
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add = parser.add_argument
    add("--output_dir", default=str(ROOT / "bench/measured/realtext/run"))
    add("--squad_path", default=None,
        help=f"SQuAD v1.1 dev JSON or zip (default ${SQUAD_PATH_ENV}, else ../shared/data/squad-v1.1-dev.json.zip)")
    add("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    add("--seeds", nargs="+", type=int, default=[0])
    add("--parallel", action="store_true", help="one process per variant, side by side, --threads threads each")
    add("--threads", type=int, default=1, help="torch threads per process")
    add("--tiny", action="store_true", help="a smoke run: a few steps, a few questions, short contexts")
    # model
    add("--cluster_layer", type=int, default=3)
    add("--num_clusters", type=int, default=64)
    add("--window_size", type=int, default=256)
    add("--window_stride", type=int, default=224)
    add("--max_question_length", type=int, default=64, help="longer questions are left out of both splits")
    # training
    add("--train_articles", type=int, nargs=2, default=[0, 40], metavar=("FIRST", "END"))
    add("--eval_articles", type=int, nargs=2, default=[40, 48], metavar=("FIRST", "END"))
    add("--train_questions", type=int, default=8981, help="questions of the training articles used (at most 8,981)")
    add("--steps", type=int, default=600, help="optimizer steps on gold-paragraph contexts")
    add("--batch_size", type=int, default=16)
    add("--max_length", type=int, default=384, help="tokens per training feature (question + gold paragraph)")
    add("--lr", type=float, default=1e-4)
    add("--warmup", type=float, default=0.1, help="share of all steps with a linear warm-up (then linear decay)")
    add("--weight_decay", type=float, default=0.01)
    add("--mp_steps", type=int, default=0, help="extra steps on multi-passage training contexts (0: none)")
    add("--mp_batch_size", type=int, default=4)
    add("--mp_tokens", type=int, nargs=2, default=[1000, 2000], help="context length range of --mp_steps")
    add("--log_every", type=int, default=50)
    # centroids
    add("--update_every_steps", type=int, default=50)
    add("--memory_size", type=int, default=20000)
    add("--min_states", type=int, default=None)
    add("--max_capture_per_forward", type=int, default=2048)
    add("--no_final_refit", action="store_true", help="skip the centroid refit on the bank after the last step")
    # evaluation
    add("--eval_questions", type=int, default=300)
    add("--question_seed", type=int, default=0, help="draws the evaluation questions and their contexts")
    add("--lengths", type=int, nargs="+", default=[2000, 4000, 8000, 16000], help="context tokens (0: oracle only)")
    add("--kinds", nargs="+", choices=KINDS, default=list(KINDS))
    add("--distractor_pool", choices=["eval", "all"], default="eval",
        help="eval: distractors from the evaluation articles only; all: from every other article")
    add("--passage_marker", default="", help="text put before every passage of a multi-passage context")
    add("--max_answer_length", type=int, default=30)
    # budget
    add("--budget_steps", type=int, default=20)
    add("--budget_batch", type=int, default=16)
    add("--budget_tokens", type=int, default=384)
    add("--budget_eval_tokens", type=int, default=2000)
    add("--no_budget", action="store_true")
    add("--budget_only", action="store_true", help="time, print the estimate and stop")
    add("--report_only", action="store_true", help="rebuild results.md and the plot from the JSON in --output_dir")
    add("--child_config", default=None, help=argparse.SUPPRESS)
    if argv is None:
        argv = sys.argv[1:]
    if "--tiny" in argv:
        parser.set_defaults(**TINY)
    args = parser.parse_args(argv)
    if args.child_config:  # a --parallel worker: the parent's settings, one variant
        variant = args.variants
        args = argparse.Namespace(**json.loads(Path(args.child_config).read_text()))
        args.variants, args.parallel, args.child_config = variant, False, "child"
    return args


# ----------------------------------------------------------------------------------------------------------------
# Data
# ----------------------------------------------------------------------------------------------------------------


class Corpus:
    """SQuAD's paragraphs (text, article) and questions (paragraph index, qa), with cached token counts."""

    def __init__(self, path: str | None, tokenizer):
        squad = read_squad(path or os.environ.get(SQUAD_PATH_ENV) or ROOT.parent / "shared/data/squad-v1.1-dev.json.zip")
        self.tokenizer = tokenizer
        self.texts: list[str] = []
        self.article: list[int] = []
        self.questions: list[tuple[int, dict]] = []
        for a, article in enumerate(squad["data"]):
            for paragraph in article["paragraphs"]:
                self.questions += [(len(self.texts), qa) for qa in paragraph["qas"]]
                self.texts.append(paragraph["context"])
                self.article.append(a)
        self.num_articles = len(squad["data"])
        self._lengths: dict[int, int] = {}

    def lengths(self, paragraphs) -> list[int]:
        """Tokens of each paragraph (without special tokens)."""
        todo = sorted({int(p) for p in paragraphs} - self._lengths.keys())
        if todo:
            counts = self.tokenizer([self.texts[p] for p in todo], add_special_tokens=False)["input_ids"]
            self._lengths.update({p: len(c) for p, c in zip(todo, counts)})
        return [self._lengths[int(p)] for p in paragraphs]

    def question_pool(self, articles: tuple[int, int], max_question_length: int) -> list[tuple[int, dict]]:
        """Questions of articles [first, end) with at most ``max_question_length`` tokens."""
        pool = [(p, qa) for p, qa in self.questions if articles[0] <= self.article[p] < articles[1]]
        counts = self.tokenizer([qa["question"].lstrip() for _, qa in pool], add_special_tokens=False)["input_ids"]
        return [item for item, c in zip(pool, counts) if len(c) <= max_question_length]


def gold_record(corpus: Corpus, paragraph: int, qa: dict) -> dict:
    """A SQuAD-format record with the gold paragraph alone as context."""
    text = corpus.texts[paragraph]
    return {"id": qa["id"], "question": qa["question"], "context": text,
            "answers": {"text": [a["text"] for a in qa["answers"]], "answer_start": [a["answer_start"] for a in qa["answers"]]},
            "passages": [[0, len(text)]], "gold": 0, "article": corpus.article[paragraph]}


def distractor_order(corpus: Corpus, gold: int, kind: str, articles: tuple[int, int], rng: np.random.Generator) -> list[int]:
    """Candidate distractor paragraphs in the order they are taken: shuffled paragraphs of other articles within
    ``articles`` (``other``), or of the gold's article first, then of the other articles (``same``)."""
    candidates = np.array([p for p in range(len(corpus.texts)) if articles[0] <= corpus.article[p] < articles[1] and p != gold])
    own = np.array([corpus.article[p] == corpus.article[gold] for p in candidates], dtype=bool)
    others = candidates[~own][rng.permutation(int((~own).sum()))]
    if kind == "other":
        return others.tolist()
    return candidates[own][rng.permutation(int(own.sum()))].tolist() + others.tolist()


def multipassage_record(corpus: Corpus, paragraph: int, qa: dict, kind: str, target: int, articles: tuple[int, int],
                        rng: np.random.Generator, marker: str = "") -> dict:
    """The gold paragraph at a random place among distractors, taken in `distractor_order` while each one brings the
    context closer to ``target`` tokens (so it ends within half a paragraph of it; the pool running out stops short). Answer offsets are
    moved to the gold paragraph's place; ``passages`` holds every passage's character span."""
    marker_tokens = len(corpus.tokenizer(marker, add_special_tokens=False)["input_ids"]) if marker else 0
    order = distractor_order(corpus, paragraph, kind, articles, rng)
    total = corpus.lengths([paragraph])[0] + marker_tokens
    chosen: list[int] = []
    for p, n in zip(order, corpus.lengths(order)):
        if total + n + marker_tokens - target > target - total:  # stop where the length is closest to the target
            break
        chosen.append(p)
        total += n + marker_tokens
    place = int(rng.integers(len(chosen) + 1))
    chosen.insert(place, paragraph)
    prefix = marker + " " if marker else ""
    pieces, spans, offset = [], [], 0
    for p in chosen:
        start = offset + len(prefix)
        spans.append([start, start + len(corpus.texts[p])])
        pieces.append(prefix + corpus.texts[p])
        offset += len(pieces[-1]) + 1
    context = " ".join(pieces)
    shift = spans[place][0]
    record = gold_record(corpus, paragraph, qa)
    record.update(context=context, passages=spans, gold=place,
                  answers={"text": record["answers"]["text"], "answer_start": [s + shift for s in record["answers"]["answer_start"]]})
    assert all(context[s: s + len(t)] == t for t, s in zip(record["answers"]["text"], record["answers"]["answer_start"]))
    return record


def eval_cells(corpus: Corpus, args) -> dict[tuple[str, int], list[dict]]:
    """Every evaluation cell's records: the same questions (drawn once with ``--question_seed``) in each."""
    pool = corpus.question_pool(tuple(args.eval_articles), args.max_question_length)
    if args.eval_questions > len(pool):
        raise ValueError(f"--eval_questions {args.eval_questions} exceeds the {len(pool)} questions of the evaluation articles")
    picked = np.random.default_rng([args.question_seed, 0]).permutation(len(pool))[: args.eval_questions]
    questions = [pool[i] for i in sorted(picked)]
    articles = (0, corpus.num_articles) if args.distractor_pool == "all" else tuple(args.eval_articles)
    cells = {(ORACLE, 0): [gold_record(corpus, p, qa) for p, qa in questions]}
    for length in sorted(length for length in args.lengths if length > 0):
        for k, kind in enumerate(args.kinds):
            cells[(kind, length)] = [
                multipassage_record(corpus, p, qa, kind, length, articles,
                                    np.random.default_rng([args.question_seed, 1, KINDS.index(kind), length, i]),
                                    args.passage_marker)
                for i, (p, qa) in enumerate(questions)]
    return cells


def cell_digest(records: list[dict]) -> str:
    """Hash of a cell's questions and contexts: equal digests mean the same inputs."""
    digest = hashlib.sha256()
    for r in records:
        digest.update(json.dumps([r["id"], r["question"], r["context"]]).encode())
    return digest.hexdigest()[:16]


def to_features(records: list[dict], tokenizer, max_length: int) -> list[dict]:
    """Training features (ids, start, end); answers cut off by truncation are dropped."""
    columns = {key: [r[key] for r in records] for key in ("id", "question", "context", "answers")}
    features = prepare_train_features(columns, tokenizer, max_length=max_length, drop_truncated=True)
    return [{"ids": ids, "start": s, "end": e}
            for ids, s, e in zip(features["input_ids"], features["start_positions"], features["end_positions"])]


def pad(rows: list[dict], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, T) right-padded ids and mask."""
    width = max(len(r["ids"]) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, r in enumerate(rows):
        ids[i, : len(r["ids"])] = torch.tensor(r["ids"])
        mask[i, : len(r["ids"])] = 1
    return ids, mask


# ----------------------------------------------------------------------------------------------------------------
# Model and training
# ----------------------------------------------------------------------------------------------------------------


def convert(variant: str, args, work: Path) -> Path:
    """The converted MiniLM for ``variant`` (the same source and head seed for both)."""
    out = work / variant
    if not (out / "config.json").is_file():
        with quiet_loading():
            convert_checkpoint(fetch_pretrained(), out, cluster_layers=[args.cluster_layer] if variant == "clusterformer" else [],
                               num_clusters=args.num_clusters, window_size=args.window_size,
                               window_stride=args.window_stride, max_question_length=args.max_question_length,
                               max_context_length=1 << 17, seed=0)
    return out


def load(path: Path, seed: int):
    from transformers import AutoTokenizer

    with quiet_loading():
        tokenizer = AutoTokenizer.from_pretrained(path)
        torch.manual_seed(seed)
        model = ClusterFormerForQuestionAnswering.from_pretrained(path).train()
    return model, tokenizer


def make_updater(model, args, seed: int):
    if not model.config.global_layers:
        return None
    settings = CentroidUpdateSettings.build(
        update_every_epochs=None, update_every_steps=args.update_every_steps, memory_size=args.memory_size,
        min_states=args.min_states, max_capture_per_forward=args.max_capture_per_forward, backend="torch", seed=seed)
    return CentroidUpdater(model, settings)


def train(model, updater, stages: list[tuple[str, list[dict], int, int]], args, seed: int, pad_id: int,
          log=print) -> list[dict]:
    """AdamW with linear warm-up and decay over every stage's steps; ``stages``: (name, features, steps, batch)."""
    total = sum(steps for _, _, steps, _ in stages)
    if not total:
        return []
    trained = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trained, lr=args.lr, weight_decay=args.weight_decay)
    warmup = max(1, int(args.warmup * total))
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min((s + 1) / warmup, max(0.0, (total - s) / max(1, total - warmup))))
    rng = np.random.default_rng([seed, 2])
    curve, step, started = [], 0, time.time()
    model.train()
    for name, data, steps, batch_size in stages:
        order, cursor, losses = rng.permutation(len(data)), 0, []
        for _ in range(steps):
            if cursor + batch_size > len(order):
                order, cursor = rng.permutation(len(data)), 0
            picked = [data[i] for i in order[cursor: cursor + batch_size]]
            cursor += batch_size
            ids, mask = pad(picked, pad_id)
            loss = model(input_ids=ids, attention_mask=mask, start_positions=torch.tensor([r["start"] for r in picked]),
                         end_positions=torch.tensor([r["end"] for r in picked])).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(trained, 1.0)
            optimizer.step()
            schedule.step()
            optimizer.zero_grad(set_to_none=True)
            if updater is not None:
                updater.step()
            losses.append(loss.item())
            step += 1
            if step % args.log_every == 0 or step == total:
                point = {"stage": name, "step": step, "loss": round(float(np.mean(losses[-args.log_every:])), 3),
                         "lr": float(schedule.get_last_lr()[0]), "seconds": round(time.time() - started, 1)}
                curve.append(point)
                log(json.dumps(point))
    return curve


# ----------------------------------------------------------------------------------------------------------------
# Evaluation
# ----------------------------------------------------------------------------------------------------------------


def colocation(assignments: torch.Tensor, token_index: torch.Tensor, question: range, offsets: list,
               record: dict, stride: int) -> dict:
    """Where the question's states land among the chunks of the cluster layer, for one input.

    The layer sorts its routed slots by cluster id (stable, so by slot within a cluster) and cuts them into chunks of
    ``stride`` states (as `hf_clusterformer.inspection.inspect_clusters` numbers them); a question token takes part
    through its copy in every window. Returns whether the gold passage, the answer span and each distractor passage
    share a chunk with some question token, and which share of the gold passage's and of the whole context's tokens
    do (the latter is the level a passage would reach by chance).
    """
    ids = assignments.cpu()
    routed = ids >= 0
    order = torch.sort(ids.masked_fill(~routed, torch.iinfo(ids.dtype).max), stable=True).indices
    chunk = torch.empty_like(ids)
    chunk[order] = torch.arange(len(ids)) // stride
    position = token_index.cpu()
    question_chunks = chunk[routed & (position >= question.start) & (position < question.stop)].unique()

    starts = np.array([s for s, _ in record["passages"]])
    token_passage = np.full(len(offsets), -1)  # passage of each context token, -1 elsewhere
    for t, o in enumerate(offsets):
        if o is not None and o[1] > o[0]:
            token_passage[t] = int(np.searchsorted(starts, o[0], side="right")) - 1
    answer_start = record["answers"]["answer_start"][0]
    answer_end = answer_start + len(record["answers"]["text"][0])
    is_answer = np.array([o is not None and o[0] < answer_end and o[1] > answer_start for o in offsets])

    slots = routed & (position >= 0)
    slot_position = position[slots].numpy()
    slot_passage = token_passage[slot_position]
    with_question = torch.isin(chunk[slots], question_chunks).numpy()  # the slot's chunk holds a question token
    context = slot_passage >= 0
    passages = np.unique(slot_passage[context])
    shares = {int(p): bool(with_question[slot_passage == p].any()) for p in passages}
    gold = record["gold"]
    distractors = [shared for p, shared in shares.items() if p != gold]
    in_gold = slot_passage == gold
    return {"passage": shares.get(gold, False),
            "answer": bool(with_question[is_answer[slot_position]].any()),
            "distractor": float(np.mean(distractors)) if distractors else None,
            "gold_tokens": float(with_question[in_gold].mean()) if in_gold.any() else 0.0,
            "context_tokens": float(with_question[context].mean()) if context.any() else 0.0}


@torch.no_grad()
def evaluate(model, tokenizer, records: list[dict], args) -> dict:
    """EM / F1, seconds per question and (cluster layer) chunk co-location over one cell, one question at a time."""
    model.eval()
    cluster = bool(model.config.global_layers)
    sep = model.config.separator_token_id
    predictions, co, tokens, seconds = {}, [], [], 0.0
    for record in records:
        started = time.perf_counter()
        features = prepare_validation_features(
            {"id": [record["id"]], "question": [record["question"]], "context": [record["context"]]}, tokenizer,
            max_length=1 << 20)
        ids = torch.tensor(features["input_ids"])
        out = model(input_ids=ids, attention_mask=torch.ones_like(ids), output_cluster_assignments=cluster)
        predictions.update(postprocess_predictions([record], features, out.start_logits, out.end_logits,
                                                   max_answer_length=args.max_answer_length))
        seconds += time.perf_counter() - started
        offsets = features["offset_mapping"][0]
        tokens.append(sum(o is not None for o in offsets))
        if cluster:
            _, question_lengths, _ = locate_question_prefix(ids == sep)
            co.append(colocation(out.cluster_assignments[0][0], out.window_token_index[0].reshape(-1),
                                 range(1, 1 + int(question_lengths[0])), offsets, record, model.config.window_stride))
    scores = compute_squad(predictions, {r["id"]: r["answers"]["text"] for r in records})
    result = {"questions": len(records), "em": round(scores["exact_match"], 2), "f1": round(scores["f1"], 2),
              "seconds_per_question": round(seconds / len(records), 4), "context_tokens": round(float(np.mean(tokens)), 1),
              "max_context_tokens": int(max(tokens)), "digest": cell_digest(records)}
    if co:
        result["gold_passage_colocated"] = round(100 * float(np.mean([c["passage"] for c in co])), 1)
        result["answer_colocated"] = round(100 * float(np.mean([c["answer"] for c in co])), 1)
        rates = [c["distractor"] for c in co if c["distractor"] is not None]
        result["distractor_colocated"] = round(100 * float(np.mean(rates)), 1) if rates else None
        result["gold_tokens_with_question"] = round(100 * float(np.mean([c["gold_tokens"] for c in co])), 1)
        result["context_tokens_with_question"] = round(100 * float(np.mean([c["context_tokens"] for c in co])), 1)
    result["predictions"] = predictions
    model.train()
    return result


# ----------------------------------------------------------------------------------------------------------------
# One variant
# ----------------------------------------------------------------------------------------------------------------


def training_stages(corpus: Corpus, tokenizer, args, seed: int) -> list[tuple[str, list[dict], int, int]]:
    pool = corpus.question_pool(tuple(args.train_articles), args.max_question_length)
    picked = np.random.default_rng([seed, 1]).permutation(len(pool))[: args.train_questions]
    gold = to_features([gold_record(corpus, *pool[i]) for i in picked], tokenizer, args.max_length)
    stages = [("gold", gold, args.steps, args.batch_size)]
    if args.mp_steps:
        count = min(len(picked), args.mp_steps * args.mp_batch_size)
        targets = np.random.default_rng([seed, 3]).integers(args.mp_tokens[0], args.mp_tokens[1] + 1, size=count)
        records = [multipassage_record(corpus, *pool[i], "other", int(t), tuple(args.train_articles),
                                       np.random.default_rng([seed, 4, j]), args.passage_marker)
                   for j, (i, t) in enumerate(zip(picked[:count], targets))]
        stages.append(("multipassage", to_features(records, tokenizer, 1 << 20), args.mp_steps, args.mp_batch_size))
    return stages


def run_variant(variant: str, args, work: Path, out_dir: Path) -> list[Path]:
    """Train and score ``variant`` for every seed; one JSON per seed."""
    torch.set_num_threads(args.threads)
    path = convert(variant, args, work)
    written = []
    cells = None
    for seed in args.seeds:
        started = time.time()
        model, tokenizer = load(path, seed)
        if cells is None:
            corpus = Corpus(args.squad_path, tokenizer)
            cells = eval_cells(corpus, args)
        stages = training_stages(corpus, tokenizer, args, seed)
        updater = make_updater(model, args, seed)
        log = lambda line: print(f"[{variant} seed {seed}] {line}", flush=True)  # noqa: E731
        log(f"training on {len(stages[0][1])} gold-paragraph features"
            + (f" and {len(stages[1][1])} multi-passage ones" if len(stages) > 1 else ""))
        curve = train(model, updater, stages, args, seed, tokenizer.pad_token_id, log)
        refit = None
        if updater is not None:
            if not args.no_final_refit:
                stats = updater.update()
                refit = stats is not None
            fitted, updates = updater.fitted, updater.num_updates
            updater.close()
        train_seconds = time.time() - started
        results = []
        for (kind, length), records in cells.items():
            result = {"kind": kind, "length": length, **evaluate(model, tokenizer, records, args)}
            results.append(result)
            shown = {k: v for k, v in result.items() if k not in ("predictions", "digest")}
            log(json.dumps(shown))
            if kind == ORACLE:
                log(f"ORACLE (gold paragraph alone): EM {result['em']:.1f}  F1 {result['f1']:.1f}")
        record = {
            "variant": variant, "seed": seed, "args": {k: v for k, v in vars(args).items() if k != "child_config"},
            "threads": torch.get_num_threads(), "train_features": {name: len(data) for name, data, _, _ in stages},
            "curve": curve, "train_seconds": round(train_seconds, 1), "eval_seconds": round(time.time() - started - train_seconds, 1),
            "question_ids": [r["id"] for r in cells[(ORACLE, 0)]], "cells": results,
        }
        if updater is not None:
            record["centroids"] = {"fitted": fitted, "refits": updates, "final_refit": refit}
        target = out_dir / f"{variant}-seed{seed}.json"
        target.write_text(json.dumps(record, indent=1) + "\n")
        written.append(target)
        log(f"wrote {target}")
    return written


# ----------------------------------------------------------------------------------------------------------------
# Budget
# ----------------------------------------------------------------------------------------------------------------


def window_slots(rows: list[int], questions: list[int], args) -> int:
    """Window slots the model runs for a batch: B x K x S, with K the windows of its longest context
    (`count_windows`) and S the longest question prefix plus ``window_size``; the cost of a step or forward pass grows
    with them (windows are padded to S slots, batches to K windows)."""
    windows = count_windows(max(rows), args.window_size, args.window_stride)
    return len(rows) * windows * (max(questions) + 2 + args.window_size)


def budget(args, work: Path) -> dict:
    """Time ``--budget_steps`` training steps (batch ``--budget_batch`` of ``--budget_tokens`` real-text tokens) and
    one evaluation forward pass of ``--budget_eval_tokens`` context tokens, on one thread; estimate the configured run
    from them, scaled by window slots (`window_slots`)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    variant = args.variants[0]
    started = time.time()
    path = convert(variant, args, work)
    model, tokenizer = load(path, 0)
    setup = time.time() - started
    corpus = Corpus(args.squad_path, tokenizer)
    pool = corpus.question_pool(tuple(args.train_articles), args.max_question_length)
    rng = np.random.default_rng(12345)
    records = [multipassage_record(corpus, *pool[int(i)], "other", 2 * args.budget_tokens, tuple(args.train_articles),
                                   np.random.default_rng([12345, j]))
               for j, i in enumerate(rng.permutation(len(pool))[: args.budget_batch])]
    columns = {key: [r[key] for r in records] for key in ("id", "question", "context", "answers")}
    quiet = logging.getLogger("hf_clusterformer.features")
    level = quiet.level
    quiet.setLevel(logging.ERROR)  # most of these are cut before their answer: labelled at 0, as good for timing
    features = prepare_train_features(columns, tokenizer, max_length=args.budget_tokens)
    quiet.setLevel(level)
    batch = [{"ids": ids, "start": s, "end": e} for ids, s, e in
             zip(features["input_ids"], features["start_positions"], features["end_positions"])]
    question_tokens = [len(tokenizer(r["question"].lstrip(), add_special_tokens=False)["input_ids"]) for r in records]
    budget_slots = window_slots([len(b["ids"]) - q - 3 for b, q in zip(batch, question_tokens)], question_tokens, args)
    updater = make_updater(model, args, 0)
    timed = argparse.Namespace(**{**vars(args), "log_every": 10**9, "warmup": 0.1})
    started, cpu = time.time(), time.process_time()
    train(model, updater, [("budget", batch, args.budget_steps, args.budget_batch)], timed, 0, tokenizer.pad_token_id,
          log=lambda line: None)
    step_seconds = (time.time() - started) / args.budget_steps
    cpu_share = (time.process_time() - cpu) / (time.time() - started)
    if updater is not None:
        updater.close()
    eval_record = multipassage_record(corpus, *pool[0], "other", args.budget_eval_tokens, tuple(args.eval_articles),
                                      np.random.default_rng(0))
    started = time.time()
    probe = evaluate(model, tokenizer, [eval_record], args)
    eval_seconds = time.time() - started
    probe_q = len(tokenizer(eval_record["question"].lstrip(), add_special_tokens=False)["input_ids"])
    eval_slots = window_slots([int(probe["context_tokens"])], [probe_q], args)
    torch.set_num_threads(threads)

    # the configured run: seconds per window slot from the measurements, times the run's slots
    gold = training_stages(corpus, tokenizer, argparse.Namespace(**{**vars(args), "mp_steps": 0}), args.seeds[0])[0][1]
    first_sep = [f["ids"].index(tokenizer.sep_token_id) for f in gold]  # [CLS] Q [SEP]: the question has sep - 1 tokens
    contexts = [len(f["ids"]) - s - 2 for f, s in zip(gold, first_sep)]
    samples = [rng.choice(len(gold), min(args.batch_size, len(gold)), replace=False) for _ in range(200)]
    gold_slots = float(np.mean([window_slots([contexts[i] for i in b], [first_sep[i] - 1 for i in b], args) for b in samples]))
    mean_q = float(np.mean(first_sep)) - 1
    mp_slots = window_slots([sum(args.mp_tokens) // 2] * args.mp_batch_size, [int(mean_q)] * args.mp_batch_size, args)
    train_seconds = step_seconds / budget_slots * (args.steps * gold_slots + args.mp_steps * mp_slots)
    oracle_tokens = corpus.lengths([p for p, _ in corpus.question_pool(tuple(args.eval_articles), 10**6)])
    per_question = window_slots([int(np.mean(oracle_tokens))], [int(mean_q)], args) + len(args.kinds) * sum(
        window_slots([length], [int(mean_q)], args) for length in args.lengths if length > 0)
    eval_total = eval_seconds / eval_slots * args.eval_questions * per_question
    per_seed = setup + train_seconds + eval_total
    runs = len(args.seeds) * len(args.variants)
    estimate = {
        "variant_timed": variant, "threads": 1, "cpu_share_while_timing": round(cpu_share, 2),
        "setup_seconds": round(setup, 1), "budget_steps": args.budget_steps, "budget_batch": args.budget_batch,
        "budget_tokens": args.budget_tokens, "seconds_per_step": round(step_seconds, 2),
        "seconds_per_eval_forward": round(eval_seconds, 2), "eval_forward_tokens": probe["context_tokens"],
        "train_step_cost_vs_budget_batch": round(gold_slots / budget_slots, 3),
        "train_seconds_per_seed": round(train_seconds), "eval_seconds_per_seed": round(eval_total),
        "seconds_per_variant_seed": round(per_seed), "runs": runs, "sequential_seconds": round(per_seed * runs),
        "parallel_seconds": round(per_seed * len(args.seeds)) if len(args.variants) > 1 else round(per_seed * runs),
    }
    print(f"BUDGET (one thread, {variant}, {cpu_share:.0%} of a core while timing): {step_seconds:.2f} s per step of "
          f"{args.budget_batch} x {args.budget_tokens} tokens ({args.budget_steps} steps); {eval_seconds:.2f} s per "
          f"evaluation forward of {probe['context_tokens']:.0f} context tokens", flush=True)
    print(f"ESTIMATE of the configured run ({runs} variant-seed runs of {args.steps} + {args.mp_steps} steps, "
          f"{args.eval_questions} questions x ({len(args.kinds)} kinds x lengths {args.lengths} + oracle)): "
          f"{per_seed / 60:.1f} min per variant and seed (train {train_seconds / 60:.1f}, eval {eval_total / 60:.1f}); "
          f"{per_seed * runs / 3600:.2f} h one after the other, {estimate['parallel_seconds'] / 3600:.2f} h with "
          "--parallel on free cores (one per process, each getting the CPU share this one got)", flush=True)
    return estimate


# ----------------------------------------------------------------------------------------------------------------
# Report
# ----------------------------------------------------------------------------------------------------------------


def collect(out_dir: Path) -> dict:
    """{variant: {(kind, length): [cell of each seed]}} from the per-seed JSON in ``out_dir``."""
    table: dict = {}
    for path in sorted(out_dir.glob("*-seed*.json")):
        record = json.loads(path.read_text())
        for cell in record["cells"]:
            table.setdefault(record["variant"], {}).setdefault((cell["kind"], cell["length"]), []).append(
                {**cell, "seed": record["seed"]})
    return table


def _mean(cells: list[dict], key: str) -> float | None:
    values = [c[key] for c in cells if c.get(key) is not None]
    return float(np.mean(values)) if values else None


def _fmt(value: float | None, digits: int = 1) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def write_report(out_dir: Path) -> Path:
    table = collect(out_dir)
    if not table:
        raise FileNotFoundError(f"no *-seed*.json in {out_dir}")
    lines = ["| model | context | kind | tokens (mean) | EM | F1 | F1 per seed | s / question | gold passage shares a "
             "chunk with the question (%) | a distractor does (%) | the answer does (%) | gold tokens in a question "
             "chunk (%) | context tokens in a question chunk (%) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for variant, cells in table.items():
        for (kind, length), runs in sorted(cells.items(), key=lambda item: (item[0][1], item[0][0])):
            lines.append(" | ".join([
                f"| {variant}", "gold paragraph" if kind == ORACLE else f"{length}", kind,
                _fmt(_mean(runs, "context_tokens"), 0), _fmt(_mean(runs, "em")), _fmt(_mean(runs, "f1")),
                ", ".join(f"{c['f1']:.1f}" for c in sorted(runs, key=lambda c: c["seed"])),
                _fmt(_mean(runs, "seconds_per_question"), 3), _fmt(_mean(runs, "gold_passage_colocated")),
                _fmt(_mean(runs, "distractor_colocated")), _fmt(_mean(runs, "answer_colocated")),
                _fmt(_mean(runs, "gold_tokens_with_question")), _fmt(_mean(runs, "context_tokens_with_question")) + " |"]))
    oracle = {variant: _mean(cells[(ORACLE, 0)], "f1") for variant, cells in table.items() if (ORACLE, 0) in cells}
    digests = {c["digest"] for cells in table.values() for runs in cells.values() for c in runs}
    questions = {c["questions"] for cells in table.values() for runs in cells.values() for c in runs}
    text = ["# Real text: SQuAD v1.1 dev, articles 40-47", "",
            "Oracle F1 (gold paragraph alone): " + ", ".join(f"{v} {f:.1f}" for v, f in oracle.items()), "",
            f"{', '.join(map(str, sorted(questions)))} questions per cell; {len(digests)} distinct cell inputs "
            "(each cell's questions and contexts are the same for every model and seed).", "", *lines, ""]
    (out_dir / "results.md").write_text("\n".join(text))
    plot(table, out_dir / "f1_vs_length.png")
    for variant, f1 in oracle.items():
        print(f"ORACLE F1 (gold paragraph alone) {variant}: {f1:.1f}", flush=True)
    print("\n".join(lines), flush=True)
    return out_dir / "results.md"


def plot(table: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(7, 4.5))
    colours = {"clusterformer": "tab:blue", "sliding": "tab:orange"}
    for variant, cells in table.items():
        colour = colours.get(variant, None)
        if (ORACLE, 0) in cells:
            axis.axhline(_mean(cells[(ORACLE, 0)], "f1"), color=colour, linestyle=":", linewidth=1,
                         label=f"{variant}, gold paragraph alone")
        for kind, style in (("other", "-o"), ("same", "--s")):
            points = sorted((length, _mean(runs, "f1")) for (k, length), runs in cells.items() if k == kind)
            if points:
                axis.plot([p[0] for p in points], [p[1] for p in points], style, color=colour,
                          label=f"{variant}, distractors: {kind} articles" if kind == "other" else f"{variant}, distractors: same article first")
    axis.set_xscale("log", base=2)
    targets = sorted({length for cells in table.values() for _, length in cells if length})
    if targets:
        axis.set_xticks(targets, [f"{t / 1000:g}k" if t >= 1000 else str(t) for t in targets])
        axis.minorticks_off()
        axis.set_xlim(min(targets) / 1.5, max(targets) * 1.5)
    axis.set_xlabel("context tokens (target; results.md gives each cell's mean)")
    axis.set_ylabel("F1")
    axis.set_title("SQuAD v1.1 dev articles 40-47: F1 vs context length")
    axis.grid(alpha=0.3)
    axis.legend(fontsize=7, loc="best")
    figure.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(figure)


# ----------------------------------------------------------------------------------------------------------------
# Main
# ----------------------------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out_dir = Path(args.output_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if args.report_only:
        write_report(out_dir)
        return 0
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    with tempfile.TemporaryDirectory(prefix="realtext-") as scratch:
        work = Path(scratch)
        estimate = None
        if not (args.no_budget or args.child_config):
            estimate = budget(args, work)
            (out_dir / "budget.json").write_text(json.dumps(estimate, indent=1) + "\n")
            if args.budget_only:
                return 0
        started = time.time()
        if args.parallel and len(args.variants) > 1:
            config = out_dir / "config.json"
            config.write_text(json.dumps({k: v for k, v in vars(args).items() if k != "child_config"}, indent=1))
            workers = [subprocess.Popen([sys.executable, __file__, "--child_config", str(config), "--variants", variant],
                                        env={**os.environ, "OMP_NUM_THREADS": str(args.threads)})
                       for variant in args.variants]
            codes = [w.wait() for w in workers]
            if any(codes):
                print(f"a worker failed: exit codes {codes}", file=sys.stderr)
                return 1
        else:
            for variant in args.variants:
                run_variant(variant, args, work, out_dir)
        if args.child_config:
            return 0
        wall = time.time() - started
        print(f"run wall time: {wall:.0f} s", flush=True)
        if estimate is not None:
            estimate["measured_run_wall_seconds"] = round(wall)
            (out_dir / "budget.json").write_text(json.dumps(estimate, indent=1) + "\n")
        write_report(out_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
