#!/usr/bin/env python
"""Real text, run to the end: Cluster-Former against the sliding-window model on SQuAD v1.1 dev, trained in stages
that persist and resume, scored with the gold paragraph alone and inside multi-passage contexts of 2k to 16k tokens.

Stages (outputs under ``--output_dir``, default ``outputs/realtext/<preset>``; one ``seed<N>/`` folder per seed):

* **A**, the shared start: all-MiniLM-L6-v2 converted with no cluster layer (``init/``) and fine-tuned on paragraph
  QA, the questions of articles 0-39 with their gold paragraph (``A/model``). The sliding-window model *is* this
  start; Cluster-Former is the same weights with a cluster layer (``--cluster_layer``, ``--num_clusters``) whose
  centroids are fitted on the start's states (train-mode forward passes over stage B's first batches, no gradients):
  ``start-clusterformer/``. Both starts are scored on the oracle and on ``other`` contexts of ``--start_lengths``.
* **B**, multi-passage training, per model, the same data, steps and schedule: the gold paragraph among distractors
  from other training articles (even examples) or from its own article first (odd ones), one context length per
  batch drawn from ``--b_tokens``. ``--probe_steps`` steps of each model are timed first (and thrown away); B gets as
  many steps as ``--b_seconds`` allow the slower model, between ``--b_min_steps`` and ``--b_steps``.
* **C**, evaluation cells: ``--eval_questions`` questions of articles 40-47 drawn once (the same in every cell and for
  every model and seed); the oracle paragraph, ``other`` distractors at ``--other_lengths`` and ``same`` distractors
  at ``--same_lengths`` tokens. One file per model and cell: ``cells/<A|B>-<model>/<cell>.json`` (A: the starts,
  B: after stage B).

A rerun of the same command skips every finished stage and cell; a training stage resumes from its checkpoint
(`clusterformer_research.training.train_stages`, every ``--checkpoint_every`` steps) and a cell from its partial file
(every ``--eval_log_every`` questions). A process claims the stage or cell it runs (a ``.claim`` file with its pid):
a second process of the same command waits for a stage another one runs and takes the cells it has not reached, so
``--models clusterformer`` started twice puts both cores on that model's cells once its stage B is done. Stage A
and the centroid fit run on ``--threads_a`` threads, the B probes on ``--threads``; then with ``--parallel`` (the
``cpu`` preset) each model's work (its start's cells, B, C) runs in its own process on ``--threads`` threads, side by
side, and without it one model after the other in the main process.
The plan and its estimated time are printed before anything starts and checked against the first timed steps;
``results.md``, ``f1_vs_length.png``, ``summary.json`` and every cell's JSON go to ``--record_dir`` (default
``bench/measured/realtext/<preset>``)::

    nohup .venv/bin/python bench/realtext.py > outputs/realtext-cpu.log 2>&1 &       # the study (same command resumes)
    python bench/realtext.py --preset tiny --output_dir /tmp/rt --record_dir /tmp/rt/record     # a minute, CPU
    python bench/realtext.py --preset gpu --pretrained .cache/minilm --squad_path .cache/squad-v1.1-dev.json.zip
    python bench/realtext.py --report_only                                    # results.md and the plot again
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

from clusterformer_research.training import TrainStage, pad_batch, scaled_groups, train_stages, zero_started
from hf_clusterformer import CentroidUpdater, ClusterFormerForQuestionAnswering
from hf_clusterformer.centroid_updates import CentroidUpdateSettings
from hf_clusterformer.conversion import convert_checkpoint
from hf_clusterformer.data.multipassage import default_squad_path, read_squad
from hf_clusterformer.features import postprocess_predictions, prepare_train_features, prepare_validation_features
from hf_clusterformer.hub import quiet_loading
from hf_clusterformer.metrics import exact_match_score, f1_score
from hf_clusterformer.modeling_clusterformer import count_windows, locate_question_prefix
from hf_clusterformer.pretrained import fetch_pretrained

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = Path(__file__).resolve()
MODELS = ("sliding", "clusterformer")
KINDS = ("other", "same")
ORACLE = "oracle"
#: Cluster kinds whose model at its start is the sliding-window model exactly (tests/test_window_cluster.py): their
#: start cells would repeat the sliding start's, so they are not scored again.
EQUAL_AT_START = ("window_cluster",)
EVAL_ARTICLES = (40, 48)  #: the test articles: only the study's cells score them
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
#: Test-only: a log line holding this variable's text kills its own process (a stop in the middle of a stage).
STOP_ENV = "REALTEXT_STOP_AT"
#: Settings that do not change a seed's numbers (all others must match the folder's ``config.json`` to resume; seeds
#: may be added to a folder).
RUN_ONLY = ("output_dir", "record_dir", "report_only", "plan_only", "stop_after", "models", "worker_seed",
            "worker_models", "seeds",
            "parallel", "gradient_checkpointing",
            "threads", "threads_a", "time_limit", "squad_path", "pretrained", "log_every", "eval_log_every",
            "bootstrap_samples", "argv")

CPU = dict(
    seeds=[0], device="cpu", dtype="float32", parallel=True, gradient_checkpointing=True, threads=1, threads_a=2,
    time_limit=0, cluster_kind="window_cluster", route_by="states",
    train_articles=[0, 36], validation_articles=[36, 40], layers=0, cluster_layer=3, num_clusters=128,
    window_size=256, window_stride=224, max_question_length=64,
    update_every_steps=50, memory_size=20000, min_states=None, max_capture_per_forward=2048,
    a_questions=0, a_steps=500, a_batch=16, a_max_length=256, a_lr=2e-4, a_warmup=20, a_seconds=0,
    a_eval_questions=64, a_eval_every=50, fit_batches=8,
    b_steps=100, b_min_steps=100, b_batch=4, b_tokens=[1000, 4000], b_lr=1e-4, b_warmup=0.1, b_seconds=2400,
    b_routed_lr_scale=1.0,
    probe_steps=10, eval_questions=200, question_seed=0, other_lengths=[2000, 4000, 8000, 16000],
    same_lengths=[4000, 16000], start_lengths=[2000, 16000], eval_batch=1, max_answer_length=30,
    checkpoint_every=25, log_every=5, eval_log_every=25, bootstrap_samples=10000,
)
PRESETS = {
    "cpu": CPU,
    # one GPU, about 9 minutes: every training question, every held-out one, three seeds (sized, not yet run)
    "gpu": {**CPU, "seeds": [0, 1, 2], "device": "cuda", "dtype": "bfloat16", "parallel": False, "threads": 8,
            "threads_a": 8,
            "a_steps": 560, "a_batch": 32, "a_seconds": 40, "a_eval_questions": 200, "a_eval_every": 280,
            "fit_batches": 4, "b_steps": 300, "b_min_steps": 50, "b_batch": 8, "b_seconds": 30, "eval_questions": 0,
            "eval_batch": 8, "log_every": 50, "eval_log_every": 400, "time_limit": 540},
    # the whole staged path in about a minute of one CPU
    "tiny": {**CPU, "threads_a": 1, "layers": 2, "cluster_layer": 1, "window_size": 32, "window_stride": 28,
             "num_clusters": 4, "min_states": 16, "memory_size": 2000, "update_every_steps": 2, "a_questions": 32,
             "a_steps": 4, "a_batch": 4, "a_max_length": 96, "a_seconds": 0, "a_eval_questions": 2,
             "a_eval_every": 2, "fit_batches": 2, "b_steps": 4, "b_min_steps": 2, "b_batch": 2, "b_tokens": [100, 160],
             "b_seconds": 3600, "probe_steps": 2, "eval_questions": 3, "other_lengths": [250, 400],
             "same_lengths": [400], "start_lengths": [250], "checkpoint_every": 2, "log_every": 1,
             "eval_log_every": 1, "bootstrap_samples": 1000},
}

#: Seconds per window slot (`slots`) on a whole core of this machine (2 logical CPUs): training steps of 16 paragraphs
#: (4,384 slots) and of 4 contexts of 2.4k-3.7k tokens (12k-18k slots), forward passes of 2k and 16k tokens, timed
#: with other jobs running and scaled by the CPU share each got (0.5-0.67). Cluster-Former's steps and forward passes
#: took the sliding model's time within the noise (factors 1.0). ``two_threads``: stage A's speed-up on two free cores,
#: assumed (two threads were slower than one while other jobs ran); the first timed steps of A check it.
#: ``train_slot`` measured again on 2026-11-29: stage A's steps took 8.25-8.6 s on two threads with nothing else
#: running (the earlier 1.35e-3 predicted 3.1 s), bench/measured/realtext/first-timed-steps/. ``eval_slot`` measured
#: again
#: on 2026-11-29 with the cores otherwise idle: the start cells took 0.254-0.258 s per oracle question and 2.0 s per
#: question at 2k tokens (3.3e-4 predicted 0.09 s and 0.81 s), bench/measured/realtext/cpu-seed0/.
COSTS = {"train_slot": 3.6e-3, "eval_slot": 8.5e-4, "cluster_train": 1.0, "cluster_eval": 1.0, "two_threads": 1.6}


#: Every setting's help (the presets give the defaults; ``--help`` prints the preset's values).
HELP = {
    "seeds": "training seeds; each runs every stage in its own seed<N>/ folder",
    "device": "cpu or cuda", "dtype": "float32, or bfloat16 (autocast on a GPU)",
    "threads": "torch threads per process after stage A (and of the B probes)",
    "threads_a": "torch threads of stage A and the centroid fit (shared by both models)",
    "time_limit": "seconds after which no further seed or cell starts (0: none)",
    "train_articles": "articles [first, end) of stages A and B (questions and distractors)",
    "validation_articles": "articles [first, end) held out of training and of the test cells: stage A's curve and the "
    "variant screen (--split validation)",
    "layers": "keep MiniLM's first N layers (0: all 6)", "cluster_layer": "Cluster-Former's cluster layer",
    "cluster_kind": "the kind of that layer: window_cluster (the window's attention plus the cluster chunk's, equal "
    "to the sliding model at its start) or cluster (the paper's: the cluster chunk's attention instead of the "
    "window's)",
    "route_by": "what the cluster layer routes by: its input states or their key projections",
    "num_clusters": "its K-Means centroids", "window_size": "context tokens per window",
    "window_stride": "window stride (and chunk size of the cluster layer)",
    "max_question_length": "longer questions are left out of every split",
    "update_every_steps": "centroid refits every N training steps", "memory_size": "states banked per cluster layer",
    "min_states": "states banked before a fit (default 32 per centroid)",
    "max_capture_per_forward": "states banked per forward pass",
    "a_questions": "stage A: training questions drawn with the seed (0: all of articles 0-39)",
    "a_steps": "stage A: steps (fewer when --a_seconds runs out)", "a_batch": "stage A: batch size",
    "a_max_length": "stage A: tokens per feature (question + paragraph)", "a_lr": "stage A: peak learning rate",
    "a_warmup": "stage A: warm-up steps (then linear decay)",
    "a_seconds": "stage A: after timing steps 10-30, fewer steps when all would take longer (0: no limit)",
    "a_eval_questions": "stage A's curve: validation questions (of --validation_articles)",
    "a_eval_every": "stage A's curve: steps between its points", "fit_batches": "batches of stage B data banked "
    "for Cluster-Former's first centroid fit", "b_steps": "stage B: most steps (the data is built for this many)",
    "b_min_steps": "stage B: fewest steps", "b_batch": "stage B: batch size",
    "b_tokens": "stage B: context length range (one length per batch)", "b_lr": "stage B: peak learning rate",
    "b_routed_lr_scale": "stage B: learning-rate factor of the zero-started routed projection (window_cluster)",
    "b_warmup": "stage B: share of its steps with a linear warm-up (then linear decay)",
    "b_seconds": "stage B: seconds allowed per model, which sizes it after the probe (0: --b_steps)",
    "probe_steps": "stage B: steps timed on each model first (thrown away)",
    "eval_questions": "questions of articles 40-47 in every cell (0: all)",
    "question_seed": "draws the questions and the cells' contexts", "other_lengths": "context tokens of the other-"
    "article cells", "same_lengths": "context tokens of the same-article cells",
    "start_lengths": "context tokens of the other-article cells the two starts are scored on",
    "eval_batch": "questions per forward pass (1: seconds per question as one user sees them)",
    "max_answer_length": "tokens of a predicted span", "checkpoint_every": "training steps between checkpoints",
    "log_every": "training steps between progress lines",
    "eval_log_every": "questions between a cell's partial saves and progress lines",
    "bootstrap_samples": "resamples of the paired bootstrap",
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The preset's settings (``--preset``, default cpu) with the flags given."""
    argv = sys.argv[1:] if argv is None else list(argv)
    first = argparse.ArgumentParser(add_help=False)
    first.add_argument("--preset", choices=PRESETS, default="cpu")
    preset = first.parse_known_args(argv)[0].preset
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add = parser.add_argument
    add("--preset", choices=PRESETS, default="cpu", help="cpu (default), gpu or tiny; the flags below override it")
    add("--output_dir", help="the stages' outputs (default outputs/realtext/<preset>)")
    add("--record_dir", help="results.md, the plot and the cells' JSON (default bench/measured/realtext/<preset>)")
    add("--squad_path", help="SQuAD v1.1 dev JSON or zip (default $CLUSTERFORMER_SQUAD_PATH or ../shared/data)")
    add("--pretrained", help="all-MiniLM-L6-v2 folder (default the verified cache; a packed copy works)")
    add("--parallel", action=argparse.BooleanOptionalAction, help="one process per model after stage A")
    add("--gradient_checkpointing", action=argparse.BooleanOptionalAction,
        help="recompute the layers in the backward pass of stage B (the same numbers in about 40 %% of the memory)")
    for name, default in CPU.items():  # a setting's type is its default's (lists of ints; no default: an int)
        if isinstance(default, list):
            add(f"--{name}", type=int, nargs="+", help=HELP[name] + " (%(default)s)")
        elif not isinstance(default, bool):
            add(f"--{name}", type=int if default is None else type(default), help=HELP[name] + " (%(default)s)")
    add("--report_only", action="store_true", help="rebuild the record from --output_dir and stop")
    add("--plan_only", action="store_true", help="print the plan and its estimated time and stop")
    add("--stop_after", choices=["A"], help="stop when this stage of every seed is done (the same command resumes)")
    add("--models", nargs="+", choices=MODELS, default=list(MODELS),
        help="run only these models' work after stage A (the same command without it does the rest)")
    add("--worker_seed", type=int, help=argparse.SUPPRESS)
    add("--worker_models", nargs="+", choices=MODELS, help=argparse.SUPPRESS)
    parser.set_defaults(**PRESETS[preset])
    args = parser.parse_args(argv)
    args.output_dir = args.output_dir or str(ROOT / "outputs" / "realtext" / preset)
    kind = "" if args.cluster_kind == "cluster" else f"-{args.cluster_kind}"  # the first study's record: cpu/
    args.record_dir = args.record_dir or str(ROOT / "bench" / "measured" / "realtext" / f"{preset}{kind}")
    args.argv = argv
    return args


# ----------------------------------------------------------------------------------------------------------------
# Small helpers
# ----------------------------------------------------------------------------------------------------------------


def say(line: str) -> None:
    """Print a log line with the time of day; the process kills itself when the line holds ``$REALTEXT_STOP_AT``
    (the tests' stop in the middle of a stage)."""
    print(time.strftime("%H:%M:%S ") + line, flush=True)
    stop = os.environ.get(STOP_ENV)
    if stop and stop in line:
        os.kill(os.getpid(), signal.SIGKILL)


def write_json(path: Path, value) -> None:
    """Write ``value`` to ``path`` in one rename (a stop while writing keeps the previous file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    partial.write_text(json.dumps(value, indent=1) + "\n")
    os.replace(partial, path)


def read_json(path: Path):
    return json.loads(Path(path).read_text())


def seed_everything(seed: int) -> None:
    """The global generators a training stage draws from (dropout), the same in every process layout."""
    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed)




def squad_scores(prediction: str, answers: list[str]) -> tuple[float, float]:
    """Per-question SQuAD EM and F1 (0-100), the best over the gold answers (their mean is `compute_squad`'s)."""
    return (100.0 * max(exact_match_score(prediction, a) for a in answers),
            100.0 * max(f1_score(prediction, a) for a in answers))


# ----------------------------------------------------------------------------------------------------------------
# Data
# ----------------------------------------------------------------------------------------------------------------


class Corpus:
    """SQuAD's paragraphs (text, article) and questions (paragraph index, qa), with cached token counts."""

    def __init__(self, path: str | None, tokenizer):
        squad = read_squad(path or default_squad_path())
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
        self._pools: dict[tuple, list] = {}

    def lengths(self, paragraphs) -> list[int]:
        """Tokens of each paragraph (without special tokens)."""
        todo = sorted({int(p) for p in paragraphs} - self._lengths.keys())
        if todo:
            counts = self.tokenizer([self.texts[p] for p in todo], add_special_tokens=False)["input_ids"]
            self._lengths.update({p: len(c) for p, c in zip(todo, counts)})
        return [self._lengths[int(p)] for p in paragraphs]

    def question_pool(self, articles: tuple[int, int], max_question_length: int) -> list[tuple[int, dict]]:
        """Questions of articles [first, end) with at most ``max_question_length`` tokens (kept once drawn)."""
        key = (tuple(articles), max_question_length)
        if key not in self._pools:
            pool = [(p, qa) for p, qa in self.questions if articles[0] <= self.article[p] < articles[1]]
            counts = self.tokenizer([qa["question"].lstrip() for _, qa in pool], add_special_tokens=False)["input_ids"]
            self._pools[key] = [item for item, c in zip(pool, counts) if len(c) <= max_question_length]
        return self._pools[key]


def gold_record(corpus: Corpus, paragraph: int, qa: dict) -> dict:
    """A SQuAD-format record with the gold paragraph alone as context."""
    text = corpus.texts[paragraph]
    return {"id": qa["id"], "question": qa["question"], "context": text,
            "answers": {"text": [a["text"] for a in qa["answers"]],
                        "answer_start": [a["answer_start"] for a in qa["answers"]]},
            "passages": [[0, len(text)]], "gold": 0, "article": corpus.article[paragraph]}


def distractor_order(corpus: Corpus, gold: int, kind: str, articles: tuple[int, int],
                     rng: np.random.Generator) -> list[int]:
    """Candidate distractor paragraphs in the order they are taken: shuffled paragraphs of other articles within
    ``articles`` (``other``), or of the gold's article first, then of the other articles (``same``)."""
    candidates = np.array([p for p in range(len(corpus.texts))
                           if articles[0] <= corpus.article[p] < articles[1] and p != gold])
    own = np.array([corpus.article[p] == corpus.article[gold] for p in candidates], dtype=bool)
    others = candidates[~own][rng.permutation(int((~own).sum()))]
    if kind == "other":
        return others.tolist()
    return candidates[own][rng.permutation(int(own.sum()))].tolist() + others.tolist()


def multipassage_record(corpus: Corpus, paragraph: int, qa: dict, kind: str, target: int, articles: tuple[int, int],
                        rng: np.random.Generator, marker: str = "") -> dict:
    """The gold paragraph at a random place among distractors, taken in `distractor_order` while each one brings the
    context closer to ``target`` tokens (so it ends within half a paragraph of it; the pool running out stops short).
    Answer offsets are moved to the gold paragraph's place; ``passages`` holds every passage's character span."""
    marker_tokens = len(corpus.tokenizer(marker, add_special_tokens=False)["input_ids"]) if marker else 0
    order = distractor_order(corpus, paragraph, kind, articles, rng)
    total = corpus.lengths([paragraph])[0] + marker_tokens
    chosen: list[int] = []
    lengths = (n for begin in range(0, len(order), 32) for n in corpus.lengths(order[begin: begin + 32]))
    for p, n in zip(order, lengths):
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
                  answers={"text": record["answers"]["text"],
                           "answer_start": [s + shift for s in record["answers"]["answer_start"]]})
    answers = record["answers"]
    assert all(context[s: s + len(t)] == t for t, s in zip(answers["text"], answers["answer_start"]))
    return record


def cell_digest(records: list[dict]) -> str:
    """Hash of a cell's questions and contexts: equal digests mean the same inputs."""
    digest = hashlib.sha256()
    for r in records:
        digest.update(json.dumps([r["id"], r["question"], r["context"]]).encode())
    return digest.hexdigest()[:16]


def cell_name(kind: str, length: int) -> str:
    return ORACLE if kind == ORACLE else f"{kind}-{length}"


def start_cells(args) -> list[tuple[str, int]]:
    """The cells the two starts are scored on (stage A's row): the oracle and ``other`` at ``--start_lengths``."""
    return [(ORACLE, 0)] + [("other", n) for n in sorted(args.start_lengths)]


def final_cells(args) -> list[tuple[str, int]]:
    """Stage C's cells, cheapest first: the oracle, ``other`` at ``--other_lengths``, ``same`` at
    ``--same_lengths``."""
    cells = [("other", n) for n in args.other_lengths] + [("same", n) for n in args.same_lengths]
    return [(ORACLE, 0)] + sorted(cells, key=lambda cell: (cell[1], KINDS.index(cell[0])))


def as_features(records: list[dict], tokenizer, max_length: int) -> list[dict]:
    """`train_stages` features (ids, start, end); answers cut off by truncation are dropped."""
    columns = {key: [r[key] for r in records] for key in ("id", "question", "context", "answers")}
    features = prepare_train_features(columns, tokenizer, max_length=max_length, drop_truncated=True)
    return [{"input_ids": ids, "start_positions": s, "end_positions": e}
            for ids, s, e in zip(features["input_ids"], features["start_positions"], features["end_positions"])]


class Study:
    """A run's settings and folders, and the data every stage draws from (built once per process, on first use)."""

    def __init__(self, args):
        self.args = args
        self.out = Path(args.output_dir)
        self.device = torch.device(args.device)
        self.dtype = DTYPES[args.dtype]
        self.deadline = time.time() + args.time_limit if args.time_limit else None
        self._tokenizer = self._corpus = self._questions = None
        self._multipassage: dict[int, list[dict]] = {}
        self._features: dict[str, tuple[list[dict], list[dict]]] = {}

    # -- folders -----------------------------------------------------------------------------------------------------

    def seed_dir(self, seed: int) -> Path:
        return self.out / f"seed{seed}"

    def start_path(self, seed: int, model: str) -> Path:
        """The start of ``model``: stage A's model (sliding) or it with its fitted cluster layer (Cluster-Former)."""
        return self.seed_dir(seed) / ("A/model" if model == "sliding" else "start-clusterformer")

    def cell_path(self, seed: int, stage: str, model: str, kind: str, length: int) -> Path:
        return self.seed_dir(seed) / "cells" / f"{stage}-{model}" / f"{cell_name(kind, length)}.json"

    def out_of_time(self) -> bool:
        return self.deadline is not None and time.time() > self.deadline

    # -- data --------------------------------------------------------------------------------------------------------

    @property
    def tokenizer(self):
        if self._tokenizer is None:
            from transformers import AutoTokenizer

            init = self.out / "init"  # MiniLM's tokenizer, as the conversion saved it
            source = init if (init / "config.json").is_file() else pretrained_source(self.args)
            with quiet_loading():
                self._tokenizer = AutoTokenizer.from_pretrained(source)
        return self._tokenizer

    @property
    def corpus(self) -> Corpus:
        if self._corpus is None:
            self._corpus = Corpus(self.args.squad_path, self.tokenizer)
        return self._corpus

    def questions(self) -> tuple[list, list]:
        """(test, curve): ``--eval_questions`` questions of articles 40-47 (0: all) drawn once with
        ``--question_seed``, and the first ``--a_eval_questions`` validation questions (`validation_questions`) for
        stage A's curve."""
        if self._questions is None:
            a = self.args
            self._questions = (self.draw_questions(EVAL_ARTICLES, a.eval_questions, "--eval_questions"),
                               self.validation_questions(a.a_eval_questions))
        return self._questions

    def validation_questions(self, count: int) -> list:
        """``count`` questions of ``--validation_articles`` (0: all), drawn with ``--question_seed``; a smaller
        count gives a subset of a larger one's."""
        return self.draw_questions(tuple(self.args.validation_articles), count, "the validation count")

    def draw_questions(self, articles: tuple[int, int], count: int, name: str) -> list:
        """``count`` questions (0: all) of ``articles`` in article order, drawn with ``--question_seed``."""
        pool = self.corpus.question_pool(articles, self.args.max_question_length)
        count = count or len(pool)
        if count > len(pool):
            raise ValueError(f"{name} {count} exceeds the {len(pool)} questions of articles {articles[0]}-"
                             f"{articles[1] - 1}")
        order = np.random.default_rng([self.args.question_seed, 0]).permutation(len(pool))
        return [pool[i] for i in sorted(order[:count])]

    def cell_records(self, kind: str, length: int, questions: list | None = None,
                     articles: tuple[int, int] = EVAL_ARTICLES) -> list[dict]:
        """A cell's records: the questions (default the test ones) with their gold paragraph (oracle) or a
        multi-passage context whose distractors come from ``articles``."""
        questions = self.questions()[0] if questions is None else questions
        if kind == ORACLE:
            return [gold_record(self.corpus, p, qa) for p, qa in questions]
        return [multipassage_record(self.corpus, p, qa, kind, length, tuple(articles),
                                    np.random.default_rng([self.args.question_seed, 1, KINDS.index(kind), length, i]))
                for i, (p, qa) in enumerate(questions)]

    def evaluation_set(self, key: str, make) -> tuple[list[dict], list[dict]]:
        """(records, validation features) of ``key``; the latest two are kept (cells are scored one at a time)."""
        if key not in self._features:
            records = make()
            columns = {name: [r[name] for r in records] for name in ("id", "question", "context")}
            encoded = prepare_validation_features(columns, self.tokenizer, max_length=1 << 20)
            features = [{"input_ids": ids, "offset_mapping": offsets, "tokens": sum(o is not None for o in offsets),
                         "spans": np.array([(-1, -1) if o is None else o for o in offsets], dtype=np.int64)}
                        for ids, offsets in zip(encoded["input_ids"], encoded["offset_mapping"])]
            self._features = dict(list(self._features.items())[-1:]) | {key: (records, features)}
        return self._features[key]

    def paragraph_features(self, seed: int) -> list[dict]:
        """Stage A's features: questions of articles 0-39 (``--a_questions`` drawn with the seed, 0: all) with their
        gold paragraph, at most ``--a_max_length`` tokens."""
        a = self.args
        pool = self.corpus.question_pool(tuple(a.train_articles), a.max_question_length)
        picked = np.random.default_rng([seed, 1]).permutation(len(pool))[: a.a_questions or None]
        return as_features([gold_record(self.corpus, *pool[i]) for i in picked], self.tokenizer, a.a_max_length)

    def multipassage_features(self, seed: int) -> list[dict]:
        """Stage B's features for ``--b_steps`` batches, in order: training questions drawn with the seed, the gold
        among ``other`` (even examples) or ``same`` (odd) distractors of articles 0-39, each batch with one target
        length drawn from ``--b_tokens``."""
        if seed not in self._multipassage:
            a = self.args
            pool = self.corpus.question_pool(tuple(a.train_articles), a.max_question_length)
            order = np.random.default_rng([seed, 3]).permutation(len(pool))
            targets = np.random.default_rng([seed, 4]).integers(a.b_tokens[0], a.b_tokens[-1] + 1, size=a.b_steps)
            records = [multipassage_record(self.corpus, *pool[order[i % len(order)]], KINDS[i % 2],
                                           int(targets[i // a.b_batch]), tuple(a.train_articles),
                                           np.random.default_rng([seed, 5, i]))
                       for i in range(a.b_steps * a.b_batch)]
            features = as_features(records, self.tokenizer, 1 << 20)
            assert len(features) == len(records), "a multi-passage answer was lost to truncation"
            self._multipassage[seed] = features
        return self._multipassage[seed]


# ----------------------------------------------------------------------------------------------------------------
# Models
# ----------------------------------------------------------------------------------------------------------------


def pretrained_source(args) -> Path:
    """all-MiniLM-L6-v2: ``--pretrained`` (a verified folder) or the verified cache (fetched when missing)."""
    return fetch_pretrained(cache_dir=args.pretrained, download=args.pretrained is None)


def convert_init(study: Study) -> Path:
    """MiniLM converted with no cluster layer (its first ``--layers`` layers, 0: all; the same QA head
    initialisation for every seed): ``init/``."""
    a, target = study.args, study.out / "init"
    with held(study.out / "init.claim", "[init]"):
        if (target / "config.json").is_file():
            return target
        scratch = target.with_name("init.partial")
        with quiet_loading():
            convert_checkpoint(pretrained_source(a), scratch, cluster_layers=[], num_hidden_layers=a.layers or None,
                               window_size=a.window_size, window_stride=a.window_stride,
                               max_question_length=a.max_question_length, max_context_length=1 << 17, seed=0,
                               overwrite=True)
        os.replace(scratch, target)
    return target


def load_model(path: Path, study: Study, training: bool = False, **options) -> ClusterFormerForQuestionAnswering:
    """The QA model saved in ``path`` (``options``: config changes, e.g. a cluster layer added), in train mode; for
    stage B's training (``training``) with gradient checkpointing when ``--gradient_checkpointing``."""
    with quiet_loading():
        model = ClusterFormerForQuestionAnswering.from_pretrained(path, **options)
    if training and study.args.gradient_checkpointing:  # transformers' newer name first, the older one before it
        (getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable)()
    return model.to(study.device).train()


def save_model(model, study: Study, target: Path, extra: dict | None = None) -> None:
    """Save ``model`` and the tokenizer (and ``extra`` as ``record.json``) into ``target`` in one rename."""
    scratch = target.with_name(target.name + ".partial")
    shutil.rmtree(scratch, ignore_errors=True)
    with quiet_loading():
        model.save_pretrained(scratch)
        study.tokenizer.save_pretrained(scratch)
    if extra is not None:
        write_json(scratch / "record.json", extra)
    shutil.rmtree(target, ignore_errors=True)
    os.replace(scratch, target)


def make_updater(model, args, seed: int) -> CentroidUpdater | None:
    """The centroid updater of a model with a cluster layer (refits every ``--update_every_steps``), else None."""
    if not model.config.global_layers:
        return None
    settings = CentroidUpdateSettings.build(
        update_every_epochs=None, update_every_steps=args.update_every_steps, memory_size=args.memory_size,
        min_states=args.min_states, max_capture_per_forward=args.max_capture_per_forward, backend="torch", seed=seed)
    return CentroidUpdater(model, settings)


# ----------------------------------------------------------------------------------------------------------------
# Answering and scoring
# ----------------------------------------------------------------------------------------------------------------


def colocation(assignments: torch.Tensor, token_index: torch.Tensor, question: range, spans: np.ndarray,
               record: dict, stride: int) -> dict:
    """Where the question's states land among the chunks of the cluster layer, for one input.

    ``assignments`` (L,) cluster id per window slot (-1: not routed); ``token_index`` (L,) input position per slot;
    ``spans`` (T, 2) character span of each input token in the context, (-1, -1) outside it.
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
    begin, end = spans[:, 0], spans[:, 1]
    token_passage = np.where(end > begin, np.searchsorted(starts, begin, side="right") - 1, -1)  # (T,), -1: none
    answer_start = record["answers"]["answer_start"][0]
    answer_end = answer_start + len(record["answers"]["text"][0])
    is_answer = (begin < answer_end) & (end > answer_start)  # (T,)

    slots = routed & (position >= 0)
    slot_position = position[slots].numpy()
    slot_passage = token_passage[slot_position]
    with_question = torch.isin(chunk[slots], question_chunks).numpy()  # the slot's chunk holds a question token
    context = slot_passage >= 0
    shares = {int(p): bool(with_question[slot_passage == p].any()) for p in np.unique(slot_passage[context])}
    distractors = [shared for p, shared in shares.items() if p != record["gold"]]
    in_gold = slot_passage == record["gold"]
    return {"passage": shares.get(record["gold"], False),
            "answer": bool(with_question[is_answer[slot_position]].any()),
            "distractor": float(np.mean(distractors)) if distractors else None,
            "gold_tokens": float(with_question[in_gold].mean()) if in_gold.any() else 0.0,
            "context_tokens": float(with_question[context].mean()) if context.any() else 0.0}


@torch.no_grad()
def answer_batch(model, study: Study, records: list[dict], features: list[dict]) -> list[dict]:
    """Answer ``records`` in one forward pass (the model in eval mode): per record the prediction, EM and F1,
    seconds (the forward pass and the span search, shared out; tokenising excluded), context tokens and, with a
    cluster layer, the chunk co-location (`colocation`)."""
    cluster = bool(model.config.global_layers)
    started = time.perf_counter()
    ids, mask = pad_batch([f["input_ids"] for f in features], study.tokenizer.pad_token_id)  # (B, T)
    ids, mask = ids.to(study.device), mask.to(study.device)
    with torch.autocast(study.device.type, dtype=study.dtype, enabled=study.dtype != torch.float32):
        out = model(input_ids=ids, attention_mask=mask, output_cluster_assignments=cluster)
    starts, ends = out.start_logits.float().cpu(), out.end_logits.float().cpu()  # (B, T)
    predictions = [postprocess_predictions([r], {"example_id": [r["id"]], "offset_mapping": [f["offset_mapping"]]},
                                           starts[i: i + 1], ends[i: i + 1],
                                           max_answer_length=study.args.max_answer_length)[r["id"]]
                   for i, (r, f) in enumerate(zip(records, features))]
    seconds = (time.perf_counter() - started) / len(records)
    if cluster:
        is_separator = (ids == model.config.separator_token_id) & mask.bool()
        question_lengths = locate_question_prefix(is_separator)[1].tolist()
    entries = []
    for i, (record, feature, prediction) in enumerate(zip(records, features, predictions)):
        em, f1 = squad_scores(prediction, record["answers"]["text"])
        entry = {"id": record["id"], "prediction": prediction, "em": em, "f1": f1, "seconds": round(seconds, 4),
                 "tokens": feature["tokens"]}
        if cluster:
            entry["colocation"] = colocation(out.cluster_assignments[0][i], out.window_token_index[i].reshape(-1),
                                             range(1, 1 + question_lengths[i]), feature["spans"], record,
                                             model.config.window_stride)
        entries.append(entry)
    return entries


def summarize(entries: list[dict], **fields) -> dict:
    """A cell's figures from its per-question entries (``fields``: stage, model, seed, kind, length, digest)."""
    mean = lambda key, digits=2: round(float(np.mean([e[key] for e in entries])), digits)  # noqa: E731
    cell = {**fields, "questions": len(entries), "em": mean("em"), "f1": mean("f1"),
            "seconds_per_question": mean("seconds", 4),
            "context_tokens": mean("tokens", 1),
            "max_context_tokens": int(max(e["tokens"] for e in entries))}
    co = [e["colocation"] for e in entries if "colocation" in e]
    if co:
        share = lambda key: round(100 * float(np.mean([c[key] for c in co])), 1)  # noqa: E731
        rates = [c["distractor"] for c in co if c["distractor"] is not None]
        cell.update(gold_passage_colocated=share("passage"), answer_colocated=share("answer"),
                    distractor_colocated=round(100 * float(np.mean(rates)), 1) if rates else None,
                    gold_tokens_with_question=share("gold_tokens"),
                    context_tokens_with_question=share("context_tokens"))
    cell["per_question"] = entries
    return cell


def study_process_alive(pid: int) -> bool:
    """Whether process ``pid`` runs, and (where ``/proc`` tells) names realtext in its command line (this script, or
    a script beside a study's records): a pid left in a claim by a stopped session may be another program's now."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    try:
        if Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] in "ZX":
            return False  # ended, not yet reaped
        command = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (OSError, IndexError):
        return True  # no /proc: trust the pid
    return not command or b"realtext" in command  # empty for a moment after a fork: trust the pid


def claim(path: Path) -> int | None:
    """Claim a stage's or cell's ``.claim`` file for this process (its pid, written whole before it appears): None
    once claimed, else the pid of the live study process that holds it; a stopped process's claim is taken over."""
    own = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    own.write_text(str(os.getpid()))
    try:
        for _ in range(3):
            try:
                os.link(own, path)
                return None
            except FileExistsError:
                try:
                    holder = int(path.read_text())
                except (OSError, ValueError):
                    holder = 0
                if holder and holder != os.getpid() and study_process_alive(holder):
                    return holder
                path.unlink(missing_ok=True)  # stopped (or our own, left by a stop of this pid's predecessor)
        raise SystemExit(f"{path}: could not claim it; remove the file and run the same command again")
    finally:
        own.unlink(missing_ok=True)


@contextlib.contextmanager
def held(path: Path, label: str, poll_seconds: float = 30.0):
    """Run a stage while holding its claim (`claim`); while another live study process holds it, wait for it (the
    stage is then done, and skipped), so that a second command started early never trains the same stage twice."""
    path.parent.mkdir(parents=True, exist_ok=True)
    told = False
    while (holder := claim(path)) is not None:
        if not told:
            say(f"{label} run by process {holder}: waiting for it")
            told = True
        time.sleep(poll_seconds)
    try:
        yield
    finally:
        path.unlink(missing_ok=True)


def score_cell(study: Study, seed: int, stage: str, name: str, model, cell: tuple[str, int],
               later: float) -> dict | None:
    """Score one model on one cell and write its file; resumes from the partial file (every ``--eval_log_every``
    questions). ``later``: the cost model's seconds of this process's cells after this one (for the ETA line).

    A cell is claimed while it is scored (``<cell>.claim``), so a second process of the same command at the cells
    stage scores the cells the first has not reached: None for a cell another live process holds."""
    path = study.cell_path(seed, stage, name, *cell)
    if path.is_file():
        return read_json(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    claimed = path.with_name(path.stem + ".claim")
    holder = claim(claimed)
    if holder is not None:
        say(f"[cells {stage}-{name} seed {seed}] {cell_name(*cell)}: scored by process {holder}; skipped here")
        return None
    try:
        return _score_claimed_cell(study, seed, stage, name, model, cell, later, path)
    finally:
        claimed.unlink(missing_ok=True)


def _score_claimed_cell(study: Study, seed: int, stage: str, name: str, model, cell: tuple[str, int], later: float,
                        path: Path) -> dict:
    a, kind, length = study.args, *cell
    records, features = study.evaluation_set(cell_name(*cell), lambda: study.cell_records(kind, length))
    digest = cell_digest(records)
    partial = path.with_name(path.stem + ".partial.json")
    saved = read_json(partial) if partial.is_file() else {}
    entries = saved["entries"] if saved.get("digest") == digest else []
    label = f"[cells {stage}-{name} seed {seed}] {cell_name(*cell)}"
    if entries:
        say(f"{label}: resumed at question {len(entries)}/{len(records)}")
    model.eval()
    while len(entries) < len(records):
        done = len(entries)
        entries += answer_batch(model, study, records[done: done + a.eval_batch], features[done: done + a.eval_batch])
        if len(entries) // a.eval_log_every > done // a.eval_log_every or len(entries) == len(records):
            write_json(partial, {"digest": digest, "entries": entries})
            per_question = float(np.mean([e["seconds"] for e in entries]))
            ratio = per_question / max(predicted_seconds_per_question(a, name, *cell), 1e-9)
            left = per_question * (len(records) - len(entries))
            say(f"{label} question {len(entries)}/{len(records)}: {per_question:.3f} s/question, cell ETA "
                f"{left / 60:.1f} min, this process's cells ETA {(left + later * ratio) / 60:.1f} min")
    result = summarize(entries, stage=stage, model=name, seed=seed, kind=kind, length=length, digest=digest)
    write_json(path, result)
    partial.unlink(missing_ok=True)
    say(f"{label}: EM {result['em']:.1f} F1 {result['f1']:.1f} over {len(entries)} questions, "
        f"{result['context_tokens']:.0f} tokens, {result['seconds_per_question']:.3f} s/question -> {path}")
    return result


def score_cells(study: Study, seed: int, stage: str, models: dict, cells: list[tuple[str, int]]) -> None:
    """Score every model on every cell, cell by cell (each cell's inputs are built once for all models), but the
    cells another process is scoring (`score_cell`)."""
    a = study.args
    pending = [(cell, name) for cell in cells for name in models
               if not study.cell_path(seed, stage, name, *cell).is_file()]
    elsewhere = []
    for i, (cell, name) in enumerate(pending):
        if study.out_of_time():
            say(f"[cells {stage} seed {seed}] out of time (--time_limit {a.time_limit} s): {len(pending) - i} left")
            return
        later = sum(cell_seconds(a, n, *c, len(study.questions()[0])) for c, n in pending[i + 1:])
        if score_cell(study, seed, stage, name, models[name], cell, later) is None:
            elsewhere.append(f"{name} {cell_name(*cell)}")
    if elsewhere:
        say(f"[cells {stage} seed {seed}] left to other processes: {', '.join(elsewhere)}; once they end, the same "
            "command (or --report_only) completes the record")


def quick_scores(model, study: Study, key: str, records: list[dict]) -> dict:
    """{"em", "f1"} of ``model`` on ``records`` (stage A's learning curve)."""
    records, features = study.evaluation_set(key, lambda: records)
    entries = []
    for begin in range(0, len(records), study.args.eval_batch):
        entries += answer_batch(model, study, records[begin: begin + study.args.eval_batch],
                                features[begin: begin + study.args.eval_batch])
    return {"em": round(float(np.mean([e["em"] for e in entries])), 2),
            "f1": round(float(np.mean([e["f1"] for e in entries])), 2)}


# ----------------------------------------------------------------------------------------------------------------
# Budget: a cost model in window slots, printed before the start and checked against the first timed steps
# ----------------------------------------------------------------------------------------------------------------


def slots(args, context_tokens: float) -> int:
    """Window slots of one input of ``context_tokens`` (`count_windows` x (question allowance + window)): what a
    forward or training pass costs, since windows are padded to the same width."""
    return count_windows(int(context_tokens), args.window_size, args.window_stride) * (16 + 2 + args.window_size)


def predicted_seconds_per_question(args, model: str, kind: str, length: int) -> float:
    factor = COSTS["cluster_eval"] if model == "clusterformer" else 1.0
    return COSTS["eval_slot"] * factor * slots(args, 150 if kind == ORACLE else length)


def cell_seconds(args, model: str, kind: str, length: int, questions: int) -> float:
    return questions * predicted_seconds_per_question(args, model, kind, length)


def step_seconds(args, stage: str, model: str = "sliding") -> float:
    """Predicted seconds of one training step: stage A (2 threads, a batch of paragraphs) or B (one thread)."""
    if stage == "A":
        rows = args.a_batch * slots(args, args.a_max_length - 16)
        return COSTS["train_slot"] * rows / COSTS["two_threads"]
    factor = COSTS["cluster_train"] if model == "clusterformer" else 1.0
    return COSTS["train_slot"] * factor * args.b_batch * slots(args, sum(args.b_tokens) / 2)


def estimate(args, questions: int, scale: dict | None = None) -> dict:
    """Seconds of one seed per stage at the cost model's speed times ``scale`` ({"A", "B", "C"}: measured over
    predicted); the models' work after A counts once with ``--parallel`` (side by side) and twice without."""
    scale = {"A": 1.0, "B": 1.0, "C": 1.0, **(scale or {})}
    both = max if args.parallel else sum
    a_cap, b_cap = args.a_seconds or float("inf"), args.b_seconds or float("inf")
    curve = (-(-args.a_steps // args.a_eval_every) * args.a_eval_questions
             * predicted_seconds_per_question(args, "sliding", ORACLE, 0))
    stages = {
        "A": min(args.a_steps * step_seconds(args, "A") * scale["A"], a_cap) + curve * scale["C"],
        "fit": args.fit_batches * step_seconds(args, "B", "clusterformer") / 3 / COSTS["two_threads"] * scale["A"],
        "start cells": both(sum(cell_seconds(args, m, *c, questions) for c in start_cells(args))
                            for m in MODELS) * scale["C"],
        "B probe": sum(args.probe_steps * step_seconds(args, "B", m) for m in MODELS) * scale["B"],
        "B": both(min(args.b_steps * step_seconds(args, "B", m) * scale["B"], b_cap) for m in MODELS),
        "C": both(sum(cell_seconds(args, m, *c, questions) for c in final_cells(args)) for m in MODELS) * scale["C"],
    }
    stages["per seed"] = sum(stages.values())
    stages["all seeds"] = stages["per seed"] * len(args.seeds)
    return {key: round(value) for key, value in stages.items()}


def print_plan(study: Study) -> dict:
    """Print the plan and its estimated time; write ``budget.json``."""
    a, questions = study.args, len(study.questions()[0])
    lengths = lambda values: "/".join(f"{v / 1000:g}k" for v in values)  # noqa: E731
    say(f"PLAN ({len(a.seeds)} seed(s) {a.seeds}, {a.device}): A {a.a_steps} steps x {a.a_batch} paragraphs "
        f"(<= {a.a_max_length} tokens, at most {a.a_seconds or 'any'} s) on {a.threads_a} threads; centroid fit on "
        f"{a.fit_batches} batches; both starts scored on the oracle + other {lengths(a.start_lengths)}; B "
        f"{a.b_steps} steps x {a.b_batch} contexts of {a.b_tokens[0]}-{a.b_tokens[-1]} tokens per model (sized after "
        f"{a.probe_steps} timed steps to at most {a.b_seconds or 'any'} s), "
        f"{'side by side, ' + str(a.threads) + ' thread(s) each' if a.parallel else 'one model after the other'}; "
        f"C {questions} questions x {len(final_cells(a))} cells (oracle, other {lengths(a.other_lengths)}, same "
        f"{lengths(a.same_lengths)}) per model")
    plan = estimate(a, questions)
    budget = {"plan": plan, "costs": COSTS, "device": a.device}
    if study.device.type == "cpu":
        say("ESTIMATE (cost model of this machine, one core per process): " + ", ".join(
            f"{k} {v / 60:.1f} min" for k, v in plan.items() if k not in ("per seed", "all seeds"))
            + f": {plan['per seed'] / 3600:.2f} h per seed, {plan['all seeds'] / 3600:.2f} h in all")
    else:
        say(f"ESTIMATE: no cost model for {a.device}; the progress lines' ETAs come from the first timed steps")
    if not study.args.plan_only:
        path = study.out / "budget.json"
        write_json(path, {**(read_json(path) if path.is_file() else {}), **budget})
    return plan


def budget_check(study: Study, stage: str, measured: float, predicted: float) -> None:
    """Print the study's estimate again with ``stage``'s measured over predicted step time applied to that stage and
    every later one (and record it in ``budget.json``)."""
    a, questions = study.args, len(study.questions()[0])
    path = study.out / "budget.json"
    budget = read_json(path) if path.is_file() else {}
    ratio = measured / predicted
    scale = {**budget.get("scale", {}), "B": ratio, "C": ratio} | ({"A": ratio} if stage == "A" else {})
    revised = estimate(a, questions, scale)
    check = {"measured": round(measured, 3), "predicted": round(predicted, 3), "estimate": revised}
    write_json(path, {**budget, "scale": scale, f"check {stage}": check})
    planned = budget.get("plan", {}).get("all seeds", 0)
    say(f"BUDGET CHECK ({stage}): {measured:.2f} s per step against {predicted:.2f} planned (x{ratio:.2f}); the study "
        f"now estimated at {revised['all seeds'] / 3600:.2f} h (planned {planned / 3600:.2f} h)")


# ----------------------------------------------------------------------------------------------------------------
# Stages
# ----------------------------------------------------------------------------------------------------------------


def stage_a(study: Study, seed: int) -> None:
    """Paragraph QA fine-tune of the converted MiniLM: ``A/model``, resumable from ``A/checkpoint``."""
    with held(study.seed_dir(seed) / "A.claim", f"[A seed {seed}]"):
        _stage_a(study, seed)


def _stage_a(study: Study, seed: int) -> None:
    a, folder = study.args, study.seed_dir(seed) / "A"
    if (folder / "model" / "record.json").is_file():
        say(f"[A seed {seed}] done ({folder / 'model'}): skipped")
        return
    torch.set_num_threads(a.threads_a)
    model = load_model(study.out / "init", study)
    features = study.paragraph_features(seed)
    curve_records = study.cell_records(ORACLE, 0, study.questions()[1])
    say(f"[A seed {seed}] {len(features)} paragraph features; curve on {len(curve_records)} held-out questions")
    evaluated = {"seconds": 0.0, "resumed": (folder / "checkpoint").is_dir()}

    def curve(m) -> dict:
        began = time.time()
        scores = quick_scores(m, study, "curve", curve_records)
        evaluated["seconds"] += time.time() - began
        return scores

    def check(point: dict) -> None:
        if not evaluated.pop("resumed", True) and study.device.type == "cpu":  # the first point of a fresh start
            measured = (point["seconds"] - evaluated["seconds"]) / point["global_step"]
            budget_check(study, "A", measured, step_seconds(a, "A"))

    stage = TrainStage("A", features, a.a_steps, a.a_batch, a.a_lr, warmup=a.a_warmup, schedule="linear",
                       order="epochs", max_seconds=a.a_seconds or None)
    seed_everything(seed)
    result = train_stages(model, [stage], pad_id=study.tokenizer.pad_token_id, evaluate=curve,
                          eval_every=a.a_eval_every, seed=seed, checkpoint_dir=folder / "checkpoint",
                          checkpoint_every=a.checkpoint_every, log_every=a.log_every, label=f"A seed {seed}",
                          device=study.device, dtype=study.dtype, print_fn=say, on_point=check)
    save_model(model, study, folder / "model", {"features": len(features), "curve_questions": len(curve_records),
                                                "steps": result["stages"]["A"], **result})
    f1 = result["curve"][-1]["f1"] if result["curve"] else float("nan")
    say(f"[A seed {seed}] done: {result['stages']['A']} steps, {result['seconds'] / 60:.1f} min; held-out oracle F1 "
        f"{f1:.1f}" + ("" if f1 >= 50 else " (below 50: the start reads paragraphs less well than intended)"))


def fit_start(study: Study, seed: int) -> None:
    """Cluster-Former's start: stage A's weights with a cluster layer, its centroids fitted on states banked by
    train-mode forward passes (no gradients) over stage B's first ``--fit_batches`` batches."""
    with held(study.seed_dir(seed) / "fit.claim", f"[fit seed {seed}]"):
        _fit_start(study, seed)


def _fit_start(study: Study, seed: int) -> None:
    a, target = study.args, study.start_path(seed, "clusterformer")
    if (target / "record.json").is_file():
        say(f"[fit seed {seed}] done ({target}): skipped")
        return
    torch.set_num_threads(a.threads_a)
    began = time.time()
    model = load_model(study.start_path(seed, "sliding"), study, cluster_layers=[a.cluster_layer],
                       global_layer_type=a.cluster_kind, route_by=a.route_by, num_clusters=a.num_clusters)
    updater = make_updater(model, a, seed)
    data = study.multipassage_features(seed)[: a.fit_batches * a.b_batch]
    seed_everything(seed)
    with torch.no_grad(), torch.autocast(study.device.type, dtype=study.dtype, enabled=study.dtype != torch.float32):
        for begin in range(0, len(data), a.b_batch):
            rows = [f["input_ids"] for f in data[begin: begin + a.b_batch]]
            ids, mask = pad_batch(rows, study.tokenizer.pad_token_id)  # (B, T)
            model(input_ids=ids.to(study.device), attention_mask=mask.to(study.device))
    banked = updater.num_states()
    stats = updater.update()
    if stats is None:
        raise RuntimeError(f"the centroid fit found too few states: {updater.unfitted_report()}")
    updater.close()
    record = {"states": banked, "batches": a.fit_batches, "seconds": round(time.time() - began, 1),
              "stats": {layer: dataclasses.asdict(s) for layer, s in stats.items()}}
    save_model(model, study, target, record)
    say(f"[fit seed {seed}] centroids of layer {a.cluster_layer} fitted on {banked} states in {record['seconds']} s")


def probe_b(study: Study, seed: int, name: str, model) -> None:
    """Time ``--probe_steps`` steps of stage B on ``model`` (a copy of its start, thrown away after): the seconds per
    step, without the first, scaled from the probe's batches to stage B's by their window slots."""
    a, path = study.args, study.seed_dir(seed) / "B" / f"probe-{name}.json"
    if path.is_file():
        return
    data = study.multipassage_features(seed)
    updater = make_updater(model, a, seed)
    seed_everything(seed)
    result = train_stages(model, [TrainStage("probe", data[: a.probe_steps * a.b_batch], a.probe_steps, a.b_batch,
                                             a.b_lr, warmup=a.probe_steps)],
                          pad_id=study.tokenizer.pad_token_id, updater=updater, seed=seed, log_every=1,
                          label=f"B probe {name} seed {seed}", device=study.device, dtype=study.dtype, print_fn=say)
    if updater is not None:
        updater.close()
    seconds = np.diff([0.0] + [entry["seconds"] for entry in result["log"]])[1:]
    batch_slots = [sum(slots(a, len(f["input_ids"])) for f in data[b: b + a.b_batch])
                   for b in range(0, len(data), a.b_batch)]
    scale = float(np.mean(batch_slots)) / float(np.mean(batch_slots[1: a.probe_steps]))
    per_step = float(np.mean(seconds)) * scale
    write_json(path, {"model": name, "steps": a.probe_steps, "step_seconds": seconds.tolist(),
                      "seconds_per_step": round(per_step, 3), "slot_scale": round(scale, 3)})
    say(f"[B probe {name} seed {seed}] {per_step:.2f} s per step of stage B (probe steps x{scale:.2f})")


def size_b(study: Study, seed: int) -> int:
    """Stage B's steps, the same for both models: as many as ``--b_seconds`` allow the slower one."""
    a, path = study.args, study.seed_dir(seed) / "B" / "size.json"
    if path.is_file():
        return read_json(path)["steps"]
    if a.b_min_steps >= a.b_steps:  # a fixed length: nothing to size
        write_json(path, {"steps": a.b_steps, "b_seconds": None})
        say(f"[B seed {seed}] {a.b_steps} steps for both models (--b_min_steps = --b_steps)")
        return a.b_steps
    probes = {m: read_json(study.seed_dir(seed) / "B" / f"probe-{m}.json")["seconds_per_step"] for m in MODELS}
    slowest = max(max(probes.values()), 1e-3)
    steps = a.b_steps if not a.b_seconds else int(np.clip(a.b_seconds // slowest, a.b_min_steps, a.b_steps))
    write_json(path, {"steps": steps, "probe_seconds_per_step": probes, "b_seconds": a.b_seconds})
    say(f"[B seed {seed}] {steps} steps for both models (slowest {slowest:.2f} s per step, {a.b_seconds} s allowed)")
    if study.device.type == "cpu":
        budget_check(study, "B", slowest, step_seconds(a, "B", "clusterformer"))
    return steps


def train_b(study: Study, seed: int, name: str, steps: int):
    """Stage B for ``name`` from its start: ``B/<name>/model`` (centroids refitted once more after the last step),
    resumable from ``B/<name>/checkpoint``."""
    with held(study.seed_dir(seed) / "B" / f"{name}.claim", f"[B {name} seed {seed}]"):
        return _train_b(study, seed, name, steps)


def _train_b(study: Study, seed: int, name: str, steps: int):
    a, folder = study.args, study.seed_dir(seed) / "B" / name
    if (folder / "model" / "record.json").is_file():
        say(f"[B {name} seed {seed}] done: skipped")
        return load_model(folder / "model", study)
    model = load_model(study.start_path(seed, name), study, training=True)
    updater = make_updater(model, a, seed)
    data = study.multipassage_features(seed)[: steps * a.b_batch]
    groups = None if a.b_routed_lr_scale == 1 else \
        (lambda model, rate: scaled_groups(model, rate, [(zero_started(model), a.b_routed_lr_scale)]))
    stage = TrainStage("B", data, steps, a.b_batch, a.b_lr, warmup=max(1, round(a.b_warmup * steps)),
                       schedule="linear", order="sequential", param_groups=groups)
    seed_everything(seed)
    result = train_stages(model, [stage], pad_id=study.tokenizer.pad_token_id, updater=updater, seed=seed,
                          checkpoint_dir=folder / "checkpoint", checkpoint_every=a.checkpoint_every,
                          log_every=a.log_every, label=f"B {name} seed {seed}", device=study.device,
                          dtype=study.dtype, print_fn=say)
    record = {"features": len(data), "steps": steps, **result}
    if updater is not None:
        updater.update()
        record["centroids"] = {"fitted": updater.fitted, "refits": updater.num_updates}
        updater.close()
    save_model(model, study, folder / "model", record)
    say(f"[B {name} seed {seed}] done: {steps} steps in {result['seconds'] / 60:.1f} min")
    return model


def probes(study: Study, seed: int) -> None:
    """Time stage B on each model's start (`probe_b`), one after the other on ``--threads`` threads."""
    if study.args.b_min_steps >= study.args.b_steps:  # B's length is fixed (`size_b`)
        return
    todo = [n for n in MODELS if not (study.seed_dir(seed) / "B" / f"probe-{n}.json").is_file()]
    torch.set_num_threads(study.args.threads)
    for name in todo:
        probe_b(study, seed, name, load_model(study.start_path(seed, name), study, training=True))


def start_scored_by(args, name: str) -> list[str]:
    """The models whose start cells ``name``'s process scores: its own, or, when Cluster-Former's start is the sliding
    model exactly (`EQUAL_AT_START`), none for it and the sliding start's for Cluster-Former's process (which has no
    start cells of its own to score, so the two processes stay even)."""
    if args.cluster_kind not in EQUAL_AT_START:
        return [name]
    return ["sliding"] if name == "clusterformer" else []


def pending(study: Study, seed: int, name: str) -> bool:
    """Whether ``name``'s process has a cell left to score (stage A's or C's)."""
    cells = [("A", m, c) for m in start_scored_by(study.args, name) for c in start_cells(study.args)]
    cells += [("B", name, c) for c in final_cells(study.args)]
    return any(not study.cell_path(seed, stage, model, *c).is_file() for stage, model, c in cells)


def model_work(study: Study, seed: int, names: list[str]) -> None:
    """Per model: score its start on stage A's cells (`start_scored_by`), train stage B, score stage C's cells."""
    names = [n for n in names if pending(study, seed, n)]
    if not names:
        return
    owners = [m for n in names for m in start_scored_by(study.args, n)]
    starts = {m: load_model(study.start_path(seed, m), study) for m in owners
              if any(not study.cell_path(seed, "A", m, *c).is_file() for c in start_cells(study.args))}
    score_cells(study, seed, "A", starts, start_cells(study.args))
    del starts
    steps = read_json(study.seed_dir(seed) / "B" / "size.json")["steps"]
    models = {n: train_b(study, seed, n, steps) for n in names}
    score_cells(study, seed, "B", models, final_cells(study.args))


def run_models(study: Study, seed: int) -> None:
    """`model_work` for both models: in this process (``--no-parallel``), or one process per model side by side
    (only for models with work left)."""
    if not study.args.parallel:
        torch.set_num_threads(study.args.threads)
        model_work(study, seed, list(study.args.models))
        return
    env = {**os.environ, "OMP_NUM_THREADS": str(study.args.threads), "TOKENIZERS_PARALLELISM": "false"}
    workers = [subprocess.Popen([sys.executable, str(SCRIPT), *study.args.argv, "--worker_seed", str(seed),
                                 "--worker_models", name], env=env)
               for name in study.args.models if pending(study, seed, name)]
    codes = [w.wait() for w in workers]
    if any(codes):
        killed = " (-9: killed, most likely for memory: a stage B step over 4k-token contexts held 10-13 GB per " \
                 "process here; free memory first)" if -signal.SIGKILL in codes else ""
        raise SystemExit(f"seed {seed}: a model's process failed (exit codes {codes}){killed}; run the same command "
                         "again to resume")


def check_config(study: Study) -> None:
    """Record the run's settings in ``config.json``; refuse a folder made with other settings."""
    path = study.out / "config.json"
    config = {k: v for k, v in sorted(vars(study.args).items()) if k not in RUN_ONLY}
    if path.is_file():
        saved = read_json(path)
        preset = PRESETS[study.args.preset]  # a setting added since the folder was made holds there at its default
        added = {k: v for k, v in config.items() if k not in saved and k in preset and v == preset[k]}
        changed = sorted(k for k in config.keys() | saved.keys() if config.get(k) != {**saved, **added}.get(k))
        if changed:
            raise SystemExit(f"{study.out} holds a run with other settings ({', '.join(changed)}); resume it with its "
                             "own settings, or use another --output_dir")
    else:
        write_json(path, config)


def run_study(study: Study) -> None:
    """Every stage of every seed, skipping what is done, then the record."""
    a = study.args
    if a.plan_only:
        print_plan(study)
        return
    if set(a.models) != set(MODELS) and a.b_min_steps < a.b_steps:
        raise SystemExit("--models needs a fixed stage B length (--b_min_steps = --b_steps): sizing B times both "
                         "models")
    study.out.mkdir(parents=True, exist_ok=True)
    check_config(study)
    convert_init(study)
    print_plan(study)
    started = time.time()
    for seed in a.seeds:
        if study.out_of_time():
            say(f"out of time (--time_limit {a.time_limit} s): seed {seed} and later not run")
            break
        stage_a(study, seed)
        if a.stop_after == "A":
            continue
        if "clusterformer" in a.models:
            fit_start(study, seed)
        probes(study, seed)
        size_b(study, seed)
        run_models(study, seed)
        say(f"STUDY seed {seed} done after {(time.time() - started) / 60:.1f} min in this process")
    path = study.out / "budget.json"
    write_json(path, {**read_json(path), "last_run_wall_seconds": round(time.time() - started)})
    if a.stop_after or set(a.models) != set(MODELS):
        say(f"stopped: {'stage ' + a.stop_after if a.stop_after else 'the work of ' + ' '.join(a.models)} done "
            "(--stop_after / --models); the same command without them goes on")
        return
    write_report(study)


# ----------------------------------------------------------------------------------------------------------------
# Report
# ----------------------------------------------------------------------------------------------------------------


def paired_bootstrap(first, second, samples: int = 10000, seed: int = 0) -> dict:
    """Mean of ``first - second`` over paired items (questions) and its 95 % percentile bootstrap interval.

    ``first``, ``second``: (N,) scores of the same items. Resamples the N differences with replacement ``samples``
    times (seeded) and takes the 2.5th and 97.5th percentiles of the resampled means.
    """
    diff = np.asarray(first, dtype=np.float64) - np.asarray(second, dtype=np.float64)
    if diff.ndim != 1 or not len(diff):
        raise ValueError(f"expected two equal-length 1-D score lists, got a difference of shape {diff.shape}")
    rng = np.random.default_rng(seed)
    means = np.concatenate([diff[rng.integers(0, len(diff), size=(min(1000, samples - done), len(diff)))].mean(axis=1)
                            for done in range(0, samples, 1000)])
    low, high = np.percentile(means, [2.5, 97.5])
    return {"difference": float(diff.mean()), "low": float(low), "high": float(high), "questions": int(len(diff)),
            "samples": samples}


#: Words a shortcut baseline does not count as overlap with the question.
STOP_WORDS = frozenset("a an the of in on at to for from by with and or is are was were be been what which who whom "
                       "whose when where why how did do does that this these those it its as into than then there "
                       "their his her he she they them not no".split())


def split_sentences(text: str) -> list[str]:
    """``text`` cut after each ``.``, ``!`` or ``?`` followed by white space (empty pieces dropped)."""
    return [s for s in re.split(r"(?<=[.!?])\s+", text) if s.strip()]


def content_words(text: str) -> set[str]:
    return set(re.findall(r"\w+", text.lower())) - STOP_WORDS


def shortcut_predictions(record: dict) -> dict[str, str]:
    """What two answer-free readers predict for ``record``: its context's first sentence (position alone) and the
    sentence sharing the most content words with the question, the earliest on ties (lexical overlap alone)."""
    sentences = split_sentences(record["context"])
    question = content_words(record["question"])
    overlap = max(sentences, key=lambda s: (len(question & content_words(s)), -sentences.index(s)))
    return {"first sentence": sentences[0], "question-overlap sentence": overlap}


SHORTCUTS = ("first sentence", "question-overlap sentence")


def shortcut_baselines(study: Study, cells: list[dict]) -> list[dict]:
    """Per distinct cell of ``cells``: EM / F1 of the `shortcut_predictions` on the cell's very questions and
    contexts (checked by digest), and the share of questions whose gold paragraph is the context's first."""
    rows = []
    for kind, length, digest in sorted({(c["kind"], c["length"], c["digest"]) for c in cells},
                                       key=lambda cell: (cell[1], cell[0])):
        records = study.cell_records(kind, length)
        if cell_digest(records) != digest:
            raise ValueError(f"the {cell_name(kind, length)} cell's inputs differ from its file's (settings changed)")
        scores = {name: np.array([squad_scores(shortcut_predictions(r)[name], r["answers"]["text"]) for r in records])
                  for name in SHORTCUTS}
        rows.append({"kind": kind, "length": length, "questions": len(records),
                     "gold_first": round(100 * float(np.mean([r["gold"] == 0 for r in records])), 1),
                     **{name: {"em": round(float(s[:, 0].mean()), 1), "f1": round(float(s[:, 1].mean()), 1)}
                        for name, s in scores.items()}})
    return rows


def baseline_table(rows: list[dict]) -> list[str]:
    lines = ["| context | kind | " + " | ".join(f"{name} EM / F1" for name in SHORTCUTS)
             + " | gold paragraph first (%) | questions |", "|---|---|" + "---|" * (len(SHORTCUTS) + 2)]
    for r in rows:
        lines.append(f"| {'gold paragraph' if r['kind'] == ORACLE else r['length']} | {r['kind']} | "
                     + " | ".join(f"{r[n]['em']:.1f} / {r[n]['f1']:.1f}" for n in SHORTCUTS)
                     + f" | {r['gold_first']:.1f} | {r['questions']} |")
    return lines


def collect(out: Path) -> list[dict]:
    """Every finished cell under ``out`` (``seed*/cells/<stage>-<model>/<cell>.json``)."""
    return [read_json(p) for p in sorted(out.glob("seed*/cells/*/*.json")) if not p.name.endswith(".partial.json")]


def comparisons(cells: list[dict], samples: int) -> list[dict]:
    """Per stage and cell: Cluster-Former's F1 minus the sliding model's, paired over questions (each question's
    difference averaged over the seeds both models have), with a bootstrap 95 % interval."""
    by_key: dict = {}
    for c in cells:
        by_key.setdefault((c["stage"], c["kind"], c["length"]), {}).setdefault(c["model"], {})[c["seed"]] = c
    rows = []
    for (stage, kind, length), models in sorted(by_key.items(), key=lambda item: (item[0][0], item[0][2], item[0][1])):
        seeds = sorted(set(models.get("clusterformer", {})) & set(models.get("sliding", {})))
        if not seeds:
            continue
        ids = [[e["id"] for e in models[m][s]["per_question"]] for m in MODELS for s in seeds]
        assert all(i == ids[0] for i in ids), f"cells of {stage} {kind} {length} hold other questions"
        f1 = {m: np.mean([[e["f1"] for e in models[m][s]["per_question"]] for s in seeds], axis=0) for m in MODELS}
        rows.append({"stage": stage, "kind": kind, "length": length, "seeds": seeds,
                     "clusterformer_f1": float(f1["clusterformer"].mean()), "sliding_f1": float(f1["sliding"].mean()),
                     **paired_bootstrap(f1["clusterformer"], f1["sliding"], samples)})
    return rows


def _mean(cells: list[dict], key: str) -> float | None:
    values = [c[key] for c in cells if c.get(key) is not None]
    return float(np.mean(values)) if values else None


def _fmt(value: float | None, digits: int = 1) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


STAGE_ROWS = {"A": "start (after A)", "B": "after B"}
COLUMNS = ("gold_passage_colocated", "distractor_colocated", "answer_colocated", "gold_tokens_with_question",
           "context_tokens_with_question")


def cell_table(cells: list[dict]) -> list[str]:
    """The markdown table of every stage x model x cell (seeds averaged, F1 per seed listed)."""
    groups: dict = {}
    for c in cells:
        groups.setdefault((c["stage"], c["model"], c["length"], c["kind"]), []).append(c)
    lines = ["| model | stage | context | kind | tokens (mean) | EM | F1 | F1 per seed | s / question | gold passage "
             "shares a chunk with the question (%) | a distractor does (%) | the answer does (%) | gold tokens in a "
             "question chunk (%) | context tokens in a question chunk (%) |", "|" + "---|" * 14]
    order = lambda group: (group[0][1], group[0][0], group[0][2], group[0][3])  # noqa: E731  model, stage, length
    for (stage, model, length, kind), runs in sorted(groups.items(), key=order):
        runs = sorted(runs, key=lambda c: c["seed"])
        lines.append("| " + " | ".join([
            model, STAGE_ROWS[stage], "gold paragraph" if kind == ORACLE else str(length), kind,
            _fmt(_mean(runs, "context_tokens"), 0), _fmt(_mean(runs, "em")), _fmt(_mean(runs, "f1")),
            ", ".join(f"{c['f1']:.1f}" for c in runs), _fmt(_mean(runs, "seconds_per_question"), 3),
            *(_fmt(_mean(runs, k)) for k in COLUMNS)]) + " |")
    return lines


def comparison_table(rows: list[dict]) -> list[str]:
    lines = ["| stage | context | kind | Cluster-Former F1 | sliding F1 | difference | 95 % interval | questions |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {STAGE_ROWS[r['stage']]} | {'gold paragraph' if r['kind'] == ORACLE else r['length']} | "
                     f"{r['kind']} | {r['clusterformer_f1']:.1f} | {r['sliding_f1']:.1f} | {r['difference']:+.1f} | "
                     f"[{r['low']:+.1f}, {r['high']:+.1f}] | {r['questions']} |")
    return lines


def stage_records(out: Path) -> dict:
    """What each seed's training stages recorded (steps, seconds, curve; centroid fit; B's sizing)."""
    records = {}
    for seed_dir in sorted(out.glob("seed*")):
        found = {"A": seed_dir / "A/model/record.json", "fit": seed_dir / "start-clusterformer/record.json",
                 "B size": seed_dir / "B/size.json",
                 **{f"B {m}": seed_dir / f"B/{m}/model/record.json" for m in MODELS}}
        records[seed_dir.name] = {k: read_json(p) for k, p in found.items() if p.is_file()}
    return records


def write_report(study: Study) -> Path:
    """``results.md``, ``f1_vs_length.png``, ``summary.json`` (settings, budget, training records, comparisons, cell
    figures) and a copy of every cell file (``cells/<seed>/<stage>-<model>/<cell>.json``) in ``--record_dir``."""
    out, record = study.out, Path(study.args.record_dir)
    cells = collect(out)
    if not cells:
        raise FileNotFoundError(f"no finished cells under {out}")
    record.mkdir(parents=True, exist_ok=True)
    for path in out.glob("seed*/cells/*/*.json"):  # to cells/<seed>/<stage>-<model>/<cell>.json
        if not path.name.endswith(".partial.json"):
            target = record / "cells" / path.parts[-4] / path.parts[-2] / path.name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, target)
    rows = comparisons(cells, study.args.bootstrap_samples)
    stages = stage_records(out)
    baselines = shortcut_baselines(study, cells)
    summary = {"config": read_json(out / "config.json") if (out / "config.json").is_file() else None,
               "budget": read_json(out / "budget.json") if (out / "budget.json").is_file() else None,
               "stages": stages, "comparisons": rows, "shortcut_baselines": baselines,
               "cells": [{k: v for k, v in c.items() if k != "per_question"} for c in cells]}
    write_json(record / "summary.json", summary)
    (record / "results.md").write_text("\n".join(report_text(cells, rows, stages, study.args, baselines)) + "\n")
    plot(cells, record / "f1_vs_length.png")
    say(f"record written to {record}")
    say("\n".join(comparison_table(rows)))
    return record / "results.md"


def report_text(cells: list[dict], rows: list[dict], stages: dict, args, baselines: list[dict]) -> list[str]:
    digests = {c["digest"] for c in cells}
    questions = sorted({c["questions"] for c in cells})
    steps = [f"{seed}: A {r['A']['steps']} steps" + "".join(f", B {m} {r[f'B {m}']['steps']} steps" for m in MODELS
                                                              if f"B {m}" in r)
             for seed, r in stages.items() if "A" in r]
    oracle = [f"{c['model']} {STAGE_ROWS[c['stage']]} (seed {c['seed']}) {c['f1']:.1f}"
              for c in cells if c["kind"] == ORACLE]
    return ["# Real text: SQuAD v1.1 dev, articles 40-47 (`bench/realtext.py`)", "",
            "Training: " + "; ".join(steps) + ".", "",
            f"Cluster-Former: layer {args.cluster_layer} of kind `{args.cluster_kind}`, {args.num_clusters} clusters, "
            f"routed by its {args.route_by}" + (", which at its start is the sliding-window model exactly (tested), "
                                                "so the start row is the sliding start's" if args.cluster_kind in
                                                EQUAL_AT_START else "") + ".", "",
            "Oracle F1 (gold paragraph alone): " + ", ".join(oracle) + ".", "",
            f"{', '.join(map(str, questions))} questions per cell; {len(digests)} distinct cell inputs (each cell's "
            "questions and contexts are the same for every model and seed).", "",
            "## Cluster-Former minus sliding window, F1 paired over questions (bootstrap 95 % interval)", "",
            *comparison_table(rows), "", "## Every cell", "", *cell_table(cells), "",
            "## Shortcut baselines on the same cells (no model)", "",
            "What position or word overlap alone answers: the context's first sentence, and the sentence sharing "
            "the most content words with the question (a sentence scores partial F1 when it holds the answer).", "",
            *baseline_table(baselines), "",
            "## Training curves", "", *curve_tables(stages), ""]


def curve_tables(stages: dict) -> list[str]:
    """Per seed: stage A's held-out oracle curve (EM / F1 at its points) and stage B's training loss at each logged
    step, both models side by side (B has no held-out points: its cells are C's)."""
    lines = []
    for seed, record in stages.items():
        if record.get("A", {}).get("curve"):
            points = record["A"]["curve"]
            lines += [f"Stage A ({seed}), held-out oracle questions:", "",
                      "| step | " + " | ".join(str(p["step"]) for p in points) + " |",
                      "|---|" + "---|" * len(points),
                      "| EM | " + " | ".join(f"{p['em']:.1f}" for p in points) + " |",
                      "| F1 | " + " | ".join(f"{p['f1']:.1f}" for p in points) + " |", ""]
        losses = {m: {e["step"]: e["loss"] for e in record.get(f"B {m}", {}).get("log", [])} for m in MODELS}
        steps = sorted(set().union(*losses.values()))
        if steps:
            lines += [f"Stage B ({seed}), training loss:", "", "| step | " + " | ".join(MODELS) + " |",
                      "|---|" + "---|" * len(MODELS)]
            lines += [f"| {step} | " + " | ".join(_fmt(losses[m].get(step), 3) for m in MODELS) + " |"
                      for step in steps]
            lines.append("")
    return lines or ["No training records."]


def plot(cells: list[dict], path: Path) -> None:
    """F1 against context length: one line per model, stage and distractor kind; the oracle as dotted lines."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(7.5, 4.8))
    colours = {"clusterformer": "tab:blue", "sliding": "tab:orange"}
    groups: dict = {}
    for c in cells:
        groups.setdefault((c["model"], c["stage"], c["kind"]), {}).setdefault(c["length"], []).append(c["f1"])
    for (model, stage, kind), by_length in sorted(groups.items()):
        width, alpha = (1.6, 1.0) if stage == "B" else (1.0, 0.55)
        label = f"{model}, {STAGE_ROWS[stage]}"
        if kind == ORACLE:
            axis.axhline(float(np.mean(by_length[0])), color=colours[model], linestyle=":", linewidth=width,
                         alpha=alpha, label=f"{label}, gold paragraph alone")
            continue
        points = sorted((n, float(np.mean(v))) for n, v in by_length.items())
        axis.plot([p[0] for p in points], [p[1] for p in points], "-o" if kind == "other" else "--s",
                  color=colours[model], linewidth=width, alpha=alpha, label=f"{label}, distractors: {kind}")
    targets = sorted({c["length"] for c in cells if c["length"]})
    axis.set_xscale("log", base=2)
    if targets:
        axis.set_xticks(targets, [f"{t / 1000:g}k" if t >= 1000 else str(t) for t in targets])
        axis.minorticks_off()
        axis.set_xlim(min(targets) / 1.5, max(targets) * 1.5)
    axis.set_xlabel("context tokens (target; results.md gives each cell's mean)")
    axis.set_ylabel("F1")
    axis.set_title("SQuAD v1.1 dev articles 40-47: F1 vs context length")
    axis.grid(alpha=0.3)
    axis.set_ylim(bottom=0)
    axis.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # beside the axes: never over a point
    figure.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(figure)


# ----------------------------------------------------------------------------------------------------------------
# Main
# ----------------------------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    study = Study(args)
    if args.report_only:
        write_report(study)
        return 0
    if args.worker_models:
        torch.set_num_threads(args.threads)
        model_work(study, args.worker_seed, args.worker_models)
        return 0
    run_study(study)
    return 0


if __name__ == "__main__":
    sys.exit(main())
