"""Fine-tuning experiments from a pretrained start: Cluster-Former against the same model with other global layers.

One recipe (`Preset`) fixes the pretrained source, the window and cluster settings, the training stages and the
evaluation splits; `compare` fine-tunes every variant (``clusterformer``, ``sliding`` — sliding-window layers only —,
``lsh``, ``sparse``) with every seed on the same data and steps, evaluates exact match, and writes a Markdown table,
a JSON record and a PNG. ``bench/reproduce_longrange.py`` and ``examples/demo.py`` run it; the named recipes
(`make_preset`) live here so that both use the same ones.

The data are the generated long-range questions (`hf_clusterformer.data.longrange`): ``twin`` (one-hop: the place
named twice, its two mentions further apart than any stack of windows relays), ``longrange`` (two-hop) and ``local``
(one sentence, the control). Training is a plain loop (AdamW, linear schedule, `CentroidUpdater` after every step),
so it runs where ``datasets`` and ``evaluate`` are not installed. Training only: inference never imports this module.
"""

from __future__ import annotations

import json
import os
import re
import platform
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .centroid_updates import CentroidUpdater
from .data.longrange import generate_longrange_dataset
from .features import prepare_train_features, prepare_validation_features
from .hub import convert_checkpoint
from .modeling_clusterformer import ClusterFormerForQuestionAnswering
from .pipeline import rank_spans

__all__ = ["Preset", "Stage", "VARIANTS", "compare", "make_preset", "write_report"]

PRETRAINED_ORIGIN = "sentence-transformers/all-MiniLM-L6-v2"

#: Variants `compare` trains: the layer type put in place of the preset's cluster layers ("sliding": none).
VARIANTS = ("clusterformer", "clusterformer-prefix", "sliding", "lsh", "sparse")
#: The named recipes of `make_preset`.
PRESETS = ("smoke", "demo", "study", "study-gpu", "cpu", "gpu")
#: Variants run first on every seed (the comparison itself); the others on ``extra_variant_seeds`` seeds.
MAIN_VARIANTS = ("clusterformer", "clusterformer-prefix", "sliding")


# ----------------------------------------------------------------------------------------------------------------
# Recipes
# ----------------------------------------------------------------------------------------------------------------


@dataclass
class Stage:
    """One training stage: its data (``kind: generator options``), steps, batch size and learning rate."""

    name: str
    data: dict[str, dict]
    steps: int
    batch_size: int
    learning_rate: float


@dataclass
class Preset:
    pretrained: str  # "minilm" or "tiny" (a random BERT, for the smoke test)
    window_size: int
    window_stride: int
    cluster_layers: list[int]
    num_clusters: int
    stages: list[Stage]
    eval: dict[str, dict]
    eval_samples: int
    train_samples: int
    seeds: list[int]
    variants: list[str]
    extra_variant_seeds: int = 1  # LSH / sparse run on this many seeds
    centroid_update_steps: int = 50
    memory_size: int = 20_000
    max_answer_length: int = 8
    time_budget: float = 3600.0
    max_question_length: int = 16
    num_facts: int = 16
    num_layers: int | None = None  # keep the first N pretrained layers (None: all)
    frozen_layers: int = 0  # embeddings and the first N layers are not trained
    schedule: str = "linear"  # "linear": warm-up then linear decay to 0 per stage; "constant": warm-up then constant
    warmup_steps: int | None = None  # per stage (None: 5% of its steps)
    cluster_lr_scale: float = 1.0  # learning-rate factor for the parameters of the global (cluster) layers
    curve_every: int = 0  # evaluate ``curve_samples`` held-out far twin questions every N steps (0: never)
    curve_samples: int = 100


def _twin(lo, hi, min_gap=0, max_gap=None, **extra):
    return {"context_tokens": (lo, hi), "min_gap_tokens": min_gap, "max_gap_tokens": max_gap, **extra}


def _balanced(lo, hi, min_gap=0, max_gap=None, **extra):
    """Twin questions without a positional shortcut: facts spread evenly, one-token names, the later mention trained."""
    return _twin(lo, hi, min_gap, max_gap, names="words", placement="balanced", target="later", **extra)


def _chains(lo, hi, min_gap, **extra):
    return {"context_tokens": (lo, hi), "min_gap_tokens": min_gap, "max_chains": 3, **extra}


def make_preset(name: str) -> Preset:
    """The recipes. Far gaps exceed what the sliding stack relays (layers x window size): 6 x 32 = 192 (demo, cpu),
    6 x 16 = 96 (study), 6 x 64 = 384 (gpu)."""
    if name == "smoke":
        return Preset(
            pretrained="tiny", window_size=16, window_stride=12, cluster_layers=[1], num_clusters=8,
            stages=[
                Stage("near", {"twin": _twin(45, 60, 0, 6, num_facts=4), "local": _chains(45, 60, 5)}, 4, 4, 1e-3),
                Stage("far", {"twin": _twin(70, 90, 30, num_facts=4), "local": _chains(70, 90, 30)}, 4, 4, 1e-3),
            ],
            eval={"twin": _twin(70, 90, 30, num_facts=4), "longrange": _chains(70, 90, 30), "local": _chains(70, 90, 30)},
            eval_samples=6, train_samples=16, seeds=[0], variants=["clusterformer", "sliding", "lsh", "sparse"],
            centroid_update_steps=2, memory_size=2000, time_budget=120, num_facts=4, curve_every=3, curve_samples=4,
        )
    if name == "demo":
        far = {"twin": _twin(260, 320, 200), "local": _chains(260, 320, 200)}
        return Preset(
            pretrained="minilm", window_size=32, window_stride=28, cluster_layers=[3], num_clusters=64,
            stages=[
                Stage("near", {"twin": _twin(120, 160, 0, 10), "local": _chains(60, 90, 5)}, 150, 4, 1e-4),
                Stage("far", far, 150, 4, 5e-5),
            ],
            eval=far, eval_samples=100, train_samples=2000, seeds=[0], variants=["clusterformer", "sliding"],
            centroid_update_steps=50, memory_size=20_000, time_budget=600,
        )
    if name == "study":  # the long-range study's CPU baseline: no positional shortcut, one-token names, curves
        far = {"twin": _balanced(150, 180, 100), "local": _chains(150, 180, 100)}
        return Preset(
            pretrained="minilm", window_size=16, window_stride=14, cluster_layers=[3], num_clusters=32,
            stages=[
                Stage("near", {"twin": _balanced(60, 80, 0, num_facts=12)}, 200, 4, 1e-4),
                Stage("far", far, 300, 4, 5e-5),
            ],
            eval=far, eval_samples=100, train_samples=3000, seeds=[0, 1],
            variants=["clusterformer", "clusterformer-prefix", "sliding"], frozen_layers=3,
            centroid_update_steps=50, memory_size=20_000, time_budget=3600, num_facts=20,
            schedule="constant", warmup_steps=30, curve_every=50, curve_samples=100,
        )
    if name == "study-gpu":  # the study recipe with 3 seeds and ~10x the examples, for one GPU
        preset = make_preset("study")
        preset.stages[0].steps, preset.stages[0].batch_size = 400, 16
        preset.stages[1].steps, preset.stages[1].batch_size = 800, 16
        preset.seeds, preset.eval_samples, preset.curve_every, preset.curve_samples = [0, 1, 2], 200, 100, 200
        preset.memory_size, preset.centroid_update_steps, preset.time_budget = 50_000, 100, 500
        return preset
    if name == "cpu":
        far = {"twin": _twin(350, 450, 200), "longrange": _chains(350, 450, 200), "local": _chains(350, 450, 200)}
        return Preset(
            pretrained="minilm", window_size=32, window_stride=28, cluster_layers=[3], num_clusters=64,
            stages=[
                Stage("near", {"twin": _twin(150, 250, 0, 10), "local": _chains(60, 90, 5)}, 200, 8, 1e-4),
                Stage("far", far, 400, 8, 5e-5),
            ],
            eval=far, eval_samples=150, train_samples=3000, seeds=[0], variants=["clusterformer", "sliding"],
            centroid_update_steps=50, memory_size=20_000, time_budget=3600,
        )
    if name == "gpu":
        far = {"twin": _twin(1000, 2500, 400), "longrange": _chains(1000, 2500, 400), "local": _chains(1000, 2500, 400)}
        return Preset(
            pretrained="minilm", window_size=64, window_stride=56, cluster_layers=[3], num_clusters=128,
            stages=[
                Stage("near", {"twin": _twin(300, 500, 0, 20), "local": _chains(150, 250, 5)}, 300, 32, 1e-4),
                Stage("far", far, 800, 16, 5e-5),
            ],
            eval=far, eval_samples=200, train_samples=6000, seeds=[0, 1, 2],
            variants=["clusterformer", "sliding", "lsh", "sparse"],
            centroid_update_steps=100, memory_size=50_000, time_budget=460,
        )
    raise ValueError(f"unknown preset {name!r}; choose {', '.join(PRESETS)}.")


# ----------------------------------------------------------------------------------------------------------------
# Data
# ----------------------------------------------------------------------------------------------------------------


def generate(kind: str, options: dict, samples: int, split: str, seed: int, num_facts: int) -> list[dict]:
    options = dict(options)
    if kind == "twin":
        options.setdefault("num_facts", num_facts)
    else:
        options.pop("max_gap_tokens", None)
    return generate_longrange_dataset(samples, seed, kind=kind, split=split, **options)


def encode_train(records: list[dict], tokenizer) -> list[dict]:
    columns = {key: [r[key] for r in records] for key in ("question", "context", "answers")}
    features = prepare_train_features(columns, tokenizer, max_length=1 << 20)
    return [{key: features[key][i] for key in ("input_ids", "start_positions", "end_positions")} for i in range(len(records))]


def pad_batch(rows: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, T) right-padded ids and attention mask."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = torch.tensor(r)
        mask[i, : len(r)] = 1
    return ids, mask


# ----------------------------------------------------------------------------------------------------------------
# Models
# ----------------------------------------------------------------------------------------------------------------


def tiny_bert(directory: Path, corpus: list[str]) -> Path:
    """A random 4-layer, 32-wide BERT with a WordPiece vocabulary of the data (the smoke preset's 'pretrained')."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers
    from transformers import BertConfig, BertModel, BertTokenizerFast

    wordpiece = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    wordpiece.normalizer = normalizers.BertNormalizer(lowercase=True)
    wordpiece.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    wordpiece.train_from_iterator(corpus, trainers.WordPieceTrainer(vocab_size=400, special_tokens=specials, show_progress=False))
    directory.mkdir(parents=True, exist_ok=True)
    vocab = sorted(wordpiece.get_vocab().items(), key=lambda item: item[1])
    tokenizer = BertTokenizerFast(vocab=dict(vocab))
    tokenizer.save_pretrained(directory)
    torch.manual_seed(0)
    config = BertConfig(vocab_size=len(vocab), hidden_size=32, num_hidden_layers=4, num_attention_heads=4,
                        intermediate_size=64, max_position_embeddings=64, pad_token_id=0)
    BertModel(config).save_pretrained(directory)
    return directory


def resolve_pretrained(preset: Preset, pretrained: str | os.PathLike | None, work: Path) -> Path:
    """The pretrained checkpoint folder: the verified MiniLM, or a tiny random BERT for the smoke recipe."""
    if preset.pretrained == "tiny":
        corpus = [r["question"] + " " + r["context"] for kind, options in preset.eval.items()
                  for r in generate(kind, options, 20, "corpus", 0, preset.num_facts)]
        return tiny_bert(work / "tiny-bert", corpus)
    from .pretrained import fetch_pretrained

    return fetch_pretrained(cache_dir=pretrained)


#: The layer type each variant puts at the recipe's cluster layers (None: none, a sliding-window model).
_VARIANT_LAYER_TYPE = {"clusterformer": "cluster", "clusterformer-prefix": "cluster", "sliding": None, "lsh": "lsh",
                       "sparse": "sparse"}
#: Model options of a variant beyond its layer type (``clusterformer-prefix``: question prefix in every chunk).
_VARIANT_OPTIONS = {"clusterformer-prefix": {"chunk_question_prefix": True}}


def build_model(source: Path, work: Path, preset: Preset, variant: str) -> Path:
    """The variant's converted checkpoint folder (converted once per layer type and ``work`` folder)."""
    layer_type = _VARIANT_LAYER_TYPE[variant]
    path = work / f"init-{layer_type or 'sliding'}"
    if not (path / "config.json").is_file():
        convert_checkpoint(
            source, path, cluster_layers=preset.cluster_layers if layer_type else [],
            global_layer_type=layer_type or "cluster", num_clusters=preset.num_clusters,
            window_size=preset.window_size, window_stride=preset.window_stride,
            max_question_length=preset.max_question_length, max_context_length=1 << 17,
            num_hidden_layers=preset.num_layers,
        )
    return path


# ----------------------------------------------------------------------------------------------------------------
# Train and evaluate one (variant, seed)
# ----------------------------------------------------------------------------------------------------------------


def twin_colocation(cluster_ids: torch.Tensor, token_index: torch.Tensor, answer_tokens: list[tuple[int, int]],
                    chunk_size: int) -> list[bool]:
    """Whether the two answer mentions of each example share a chunk in a cluster layer.

    Args:
        cluster_ids: (B, L) the layer's ids over flat window slots, -1 for slots that take no part.
        token_index: (B, L) input position of every slot (-1 for empty slots).
        answer_tokens: each example's two answer start tokens.
        chunk_size: m; the chunk of a token is the rank of its owner copy in the stable (cluster, position) sort,
            divided by m.
    """
    sentinel = torch.iinfo(cluster_ids.dtype).max
    order = torch.sort(cluster_ids.masked_fill(cluster_ids < 0, sentinel), dim=1, stable=True).indices
    rank = torch.empty_like(order).scatter_(1, order, torch.arange(order.shape[1], device=order.device).expand_as(order))
    chunk = rank // chunk_size  # (B, L)
    result = []
    for b, (first, second) in enumerate(answer_tokens):
        owner = cluster_ids[b] >= 0
        c1 = chunk[b][owner & (token_index[b] == first)]
        c2 = chunk[b][owner & (token_index[b] == second)]
        result.append(bool(len(c1) and len(c2) and (c1[-1] == c2[-1])))
    return result


def evaluate(model, tokenizer, records: list[dict], preset: Preset, device, dtype, batch_size: int, kind: str) -> dict:
    """Exact match of the best span (the pipeline's span search) on ``records``; on ``twin`` questions of a model
    whose first global layer is a cluster layer, also how often the two answer mentions share a chunk there."""
    columns = {key: [r[key] for r in records] for key in ("id", "question", "context")}
    features = prepare_validation_features(columns, tokenizer, max_length=1 << 20)
    global_types = [t for t in model.config.layer_types if t != "sliding"]
    colocation = kind == "twin" and global_types[:1] == ["cluster"]
    correct, shared = 0, []
    model.eval()
    for begin in range(0, len(records), batch_size):
        rows = range(begin, min(begin + batch_size, len(records)))
        ids, mask = pad_batch([features["input_ids"][i] for i in rows], tokenizer.pad_token_id)
        ids, mask = ids.to(device), mask.to(device)
        with torch.no_grad(), torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32):
            out = model(input_ids=ids, attention_mask=mask, output_cluster_assignments=colocation)
        for j, i in enumerate(rows):
            offsets = features["offset_mapping"][i]
            candidate = torch.tensor([o is not None for o in offsets])
            ((_, start, end),) = rank_spans(out.start_logits[j, : len(offsets)].float().cpu(),
                                            out.end_logits[j, : len(offsets)].float().cpu(), candidate,
                                            max_answer_len=preset.max_answer_length)
            text = records[i]["context"][offsets[start][0]: offsets[end][1]]
            correct += text.strip().lower() in {a.lower() for a in records[i]["answers"]["text"]}
        if colocation:
            answer_tokens = []
            for i in rows:
                offsets = features["offset_mapping"][i]
                answer_tokens.append(tuple(next(t for t, o in enumerate(offsets) if o is not None and o[0] <= s < o[1])
                                           for s in records[i]["answers"]["answer_start"][:2]))
            shared += twin_colocation(out.cluster_assignments[0], out.window_token_index.reshape(len(rows), -1),
                                      answer_tokens, model.config.window_stride)
    result = {"exact_match": round(100.0 * correct / len(records), 1), "n": len(records)}
    if shared:
        result["twin_shared_chunk"] = round(100.0 * sum(shared) / len(shared), 1)
    return result


def positional_shortcuts(records: list[dict]) -> dict[str, float]:
    """EM of answering ``twin`` questions by fact position alone, on ``records``: always the first fact's place, the
    last fact's, and the best single fact slot (looked up on these very records, so an upper bound), beside chance
    (``1 / distinct places``)."""
    hits = []
    for record in records:
        places = re.findall(r"\w+ lives in (\w+)\.", record["context"])
        hits.append([place == record["answers"]["text"][0] for place in places])
    width = min(len(h) for h in hits)
    rate = 100.0 * np.array([h[:width] for h in hits], dtype=float).mean(axis=0)
    return {"first_fact": round(float(rate[0]), 1), "last_fact": round(float(rate[-1]), 1),
            "best_fact_slot": round(float(rate.max()), 1), "chance": round(100.0 / (width - 1), 1)}


def learning_rate_factor(schedule: str, warmup: int, steps: int):
    """Step -> learning-rate factor: linear warm-up over ``warmup`` steps, then constant or linear decay to 0."""
    if schedule == "constant":
        return lambda step: min(1.0, (step + 1) / warmup)
    if schedule != "linear":
        raise ValueError(f"schedule must be 'linear' or 'constant', got {schedule!r}")
    return lambda step: min((step + 1) / warmup, max(0.0, (steps - step) / max(1, steps - warmup)))


def parameter_groups(model, preset: Preset, learning_rate: float) -> list[dict]:
    """AdamW groups: the global layers' parameters at ``cluster_lr_scale`` times the rate, the rest at the rate."""
    global_layers = {f"encoder.layer.{i}." for i in model.config.cluster_layers}
    fast, rest = [], []
    for name, parameter in model.named_parameters():
        if parameter.requires_grad:
            (fast if any(prefix in name for prefix in global_layers) else rest).append(parameter)
    groups = [{"params": rest, "lr": learning_rate}]
    if fast:
        groups.append({"params": fast, "lr": learning_rate * preset.cluster_lr_scale})
    return groups


_TRAIN_DATA: dict[tuple, list[dict]] = {}


#: Steps per stage fixed by the first run that had to shorten them (`run_one`'s ``train_seconds``); later runs of
#: the process take the same steps, so that every variant is trained alike.
_STEP_PLAN: dict[str, int] = {}


def run_one(variant: str, seed: int, preset: Preset, source: Path, work: Path, device: torch.device, dtype,
            threads: int | None, save_dir: Path | None = None, train_seconds: float | None = None,
            overwrite: bool = False) -> dict:
    """Fine-tune one variant with one seed through every stage, then evaluate it (and save it under
    ``save_dir/<variant>`` for the first seed).

    With ``train_seconds``, the first run times steps 10-30 of each stage and, when the stage would take
    more than its share of ``train_seconds``, trains fewer steps; every later run in the process trains as many.
    """
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # loading reports of every run would bury the progress lines
    try:
        return _run_one(variant, seed, preset, source, work, device, dtype, threads, save_dir, train_seconds, overwrite)
    finally:
        hf_logging.set_verbosity(verbosity)


def _run_one(variant, seed, preset, source, work, device, dtype, threads, save_dir, train_seconds, overwrite) -> dict:
    if threads:
        torch.set_num_threads(threads)
    from transformers import AutoTokenizer

    init = build_model(source, work, preset, variant)
    tokenizer = AutoTokenizer.from_pretrained(init)
    torch.manual_seed(seed)
    np.random.seed(seed)
    model = ClusterFormerForQuestionAnswering.from_pretrained(init, **_VARIANT_OPTIONS.get(variant, {})).to(device)
    if preset.frozen_layers:
        frozen = [model.roberta.embeddings, *model.roberta.encoder.layer[: preset.frozen_layers]]
        for module in frozen:
            module.requires_grad_(False)
    has_router = any(t == "cluster" for t in model.config.layer_types)
    updater = None
    if has_router:
        updater = CentroidUpdater(model, memory_size=preset.memory_size, update_every_steps=preset.centroid_update_steps,
                                  backend="torch", seed=seed, max_capture_per_forward=2048)
    started = time.time()
    log, curve = [], []
    generator = torch.Generator().manual_seed(seed)
    curve_records, near_records = [], []
    if preset.curve_every and "twin" in preset.eval:
        curve_records = generate("twin", preset.eval["twin"], preset.curve_samples, "curve", 1000, preset.num_facts)
        near = preset.stages[0].data.get("twin")
        if near is not None and near != preset.eval["twin"]:  # the first stage's twin questions, held out
            near_records = generate("twin", near, preset.curve_samples, "curve", 1000, preset.num_facts)
    global_step = 0

    def record_curve(stage_name: str, step: int, losses: list[float]) -> None:
        point = evaluate(model, tokenizer, curve_records, preset, device, dtype, 16, "twin")
        curve.append({"stage": stage_name, "step": step, "global_step": global_step,
                      "loss": round(float(np.mean(losses[-preset.curve_every:])), 4) if losses else None,
                      "twin_em": point["exact_match"], "twin_shared_chunk": point.get("twin_shared_chunk")})
        if near_records:
            curve[-1]["near_twin_em"] = evaluate(model, tokenizer, near_records, preset, device, dtype, 16, "twin")["exact_match"]
        print(f"[{variant}/seed {seed}] curve {json.dumps(curve[-1])}", flush=True)
        model.train()
    for stage in preset.stages:
        key = (stage.name, seed, str(init.parent))
        if key not in _TRAIN_DATA:  # runs of one seed share their data (and its tokenization)
            needed = min(preset.train_samples, -(-stage.steps * stage.batch_size // len(stage.data)))
            records = []
            for kind, options in stage.data.items():
                records += generate(kind, options, needed, f"{stage.name}-train", seed, preset.num_facts)
            for stale in [k for k in _TRAIN_DATA if k[1:] != key[1:]]:
                del _TRAIN_DATA[stale]
            _TRAIN_DATA[key] = encode_train(records, tokenizer)
        data = _TRAIN_DATA[key]
        trained = [p for p in model.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(parameter_groups(model, preset, stage.learning_rate), weight_decay=0.01)
        plan = {"steps": _STEP_PLAN.get(stage.name, stage.steps)}
        warmup = max(1, preset.warmup_steps or plan["steps"] // 20)
        schedule = torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda step: learning_rate_factor(preset.schedule, warmup, plan["steps"])(step))
        share = train_seconds * stage.steps / sum(st.steps for st in preset.stages) if train_seconds else None
        model.train()
        order = torch.randperm(len(data), generator=generator).tolist()
        position, losses = 0, []
        step, warm_started = 0, time.time()
        while step < plan["steps"]:
            if step == 10:  # steps 10-30 are timed: the first ones pay for warm-up (kernels, the first K-Means fit)
                warm_started = time.time()
            if step == 30 and share and stage.name not in _STEP_PLAN:
                projected = (time.time() - warm_started) / 20 * plan["steps"]
                if projected > share:
                    plan["steps"] = max(30, int(plan["steps"] * share / projected))
                    print(f"[{variant}/seed {seed}] {stage.name}: {projected:.0f} s projected for {stage.steps} steps, "
                          f"more than {share:.0f} s: {plan['steps']} steps for every run", flush=True)
                _STEP_PLAN[stage.name] = plan["steps"]
            if position + stage.batch_size > len(order):
                order, position = torch.randperm(len(data), generator=generator).tolist(), 0
            batch = [data[i] for i in order[position: position + stage.batch_size]]
            position += stage.batch_size
            ids, mask = pad_batch([b["input_ids"] for b in batch], tokenizer.pad_token_id)
            starts = torch.tensor([b["start_positions"] for b in batch])
            ends = torch.tensor([b["end_positions"] for b in batch])
            with torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32):
                loss = model(input_ids=ids.to(device), attention_mask=mask.to(device),
                             start_positions=starts.to(device), end_positions=ends.to(device)).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(trained, 1.0)
            optimizer.step()
            schedule.step()
            optimizer.zero_grad(set_to_none=True)
            if updater is not None:
                updater.step()
            losses.append(loss.item())
            step += 1
            global_step += 1
            if curve_records and step % preset.curve_every == 0:
                record_curve(stage.name, step, losses)
            if step % 25 == 0 or step == plan["steps"]:
                log.append({"stage": stage.name, "step": step, "loss": round(float(np.mean(losses[-25:])), 4),
                            "seconds": round(time.time() - started, 1)})
                print(f"[{variant}/seed {seed}] {json.dumps(log[-1])}", flush=True)
    if curve_records and (not curve or curve[-1]["global_step"] != global_step):
        record_curve(preset.stages[-1].name, step, losses)
    train_seconds = time.time() - started
    scores = {}
    for kind, options in preset.eval.items():
        records = generate(kind, options, preset.eval_samples, "validation", 1000, preset.num_facts)
        scores[kind] = evaluate(model, tokenizer, records, preset, device, dtype, 16, kind)
    if updater is not None:
        updater.close()
    if save_dir is not None and seed == preset.seeds[0]:
        from .hub import save_for_hub

        fitted = {i: bool(r.fitted) for i, r in model.cluster_routers().items()}
        card = {"model_id": f"clusterformer-{variant}", "base_model": PRETRAINED_ORIGIN if preset.pretrained == "minilm" else None,
                "training_data": "Generated long-range QA (`hf_clusterformer.data.longrange`): " + ", ".join(preset.eval),
                "centroids_fitted": fitted}
        save_for_hub(model.cpu().eval(), tokenizer, save_dir / variant,
                     card_data={k: v for k, v in card.items() if v is not None}, overwrite=overwrite)
    return {"variant": variant, "seed": seed, "scores": scores, "train_seconds": round(train_seconds, 1),
            "eval_seconds": round(time.time() - started - train_seconds, 1), "log": log, "curve": curve,
            "steps": {s.name: _STEP_PLAN.get(s.name, s.steps) for s in preset.stages}}


# ----------------------------------------------------------------------------------------------------------------
# Report
# ----------------------------------------------------------------------------------------------------------------


def summarise(runs: list[dict], kinds: list[str]) -> dict[str, dict[str, dict]]:
    """Mean, spread and per-seed EM of each variant on each split."""
    table: dict[str, dict[str, dict]] = {}
    for run in runs:
        for kind in kinds:
            entry = table.setdefault(run["variant"], {}).setdefault(kind, {"seeds": []})
            entry["seeds"].append(run["scores"][kind]["exact_match"])
    for variant in table.values():
        for entry in variant.values():
            values = np.array(entry["seeds"], dtype=float)
            entry["mean"] = round(float(values.mean()), 1)
            entry["min"], entry["max"] = float(values.min()), float(values.max())
    return table


def write_report(output: Path, runs: list[dict], meta: dict, kinds: list[str]) -> str:
    table = summarise(runs, kinds)
    names = {"twin": "one-hop far (twin)", "longrange": "two-hop far (longrange)", "local": "local control"}
    lines = ["| model | seeds | " + " | ".join(f"{names.get(k, k)} EM" for k in kinds) + " | twin mentions share a chunk |",
             "|---|---|" + "---|" * len(kinds) + "---|"]
    for variant, entry in table.items():
        shared = [r["scores"].get("twin", {}).get("twin_shared_chunk") for r in runs if r["variant"] == variant]
        shared = [s for s in shared if s is not None]
        cells = []
        for k in kinds:
            e = entry[k]
            cells.append(f"{e['mean']:.1f}" + (f" ({', '.join(f'{v:.1f}' for v in e['seeds'])})" if len(e["seeds"]) > 1 else ""))
        lines.append(f"| {variant} | {len(entry[kinds[0]]['seeds'])} | " + " | ".join(cells) + " | "
                     + (f"{np.mean(shared):.0f}%" if shared else "–") + " |")
    markdown = "\n".join(lines) + "\n"
    shortcuts = meta.get("positional_shortcuts")
    if shortcuts:
        markdown += (f"\nPositional shortcuts on the same twin questions: first fact {shortcuts['first_fact']:.1f}, "
                     f"last fact {shortcuts['last_fact']:.1f}, best single fact slot {shortcuts['best_fact_slot']:.1f} "
                     f"(chance {shortcuts['chance']:.1f}).\n")
    curves = [run for run in runs if run.get("curve")]
    if curves:
        markdown += ("\nLearning curves (one-hop far EM on held-out questions, and on the first stage's near ones; "
                     "global step: EM):\n\n")
        for run in curves:
            points = ", ".join(f"{p['global_step']}: {p['twin_em']:.0f}"
                               + (f" (near {p['near_twin_em']:.0f})" if "near_twin_em" in p else "") for p in run["curve"])
            markdown += f"- {run['variant']} / seed {run['seed']}: {points}\n"
    header = (f"Preset `{meta['preset']}` on {meta['device_name']} ({meta['dtype']}), {meta['wall_seconds']:.0f} s; "
              f"steps {meta['steps']}; EM in %, mean over seeds (per seed in brackets).\n\n")
    (output / "results.md").write_text(header + markdown)
    (output / "results.json").write_text(json.dumps({"meta": meta, "summary": table, "runs": runs}, indent=1))
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        figure, axis = plt.subplots(figsize=(7, 3.5))
        width = 0.8 / max(1, len(table))
        for n, (variant, entry) in enumerate(table.items()):
            xs = np.arange(len(kinds)) + n * width
            axis.bar(xs, [entry[k]["mean"] for k in kinds], width, label=variant)
            for x, k in zip(xs, kinds):
                axis.scatter([x] * len(entry[k]["seeds"]), entry[k]["seeds"], s=8, c="black", zorder=3)
        axis.set_xticks(np.arange(len(kinds)) + width * (len(table) - 1) / 2, [names.get(k, k) for k in kinds])
        axis.set_ylabel("exact match (%)")
        axis.set_ylim(0, 100)
        axis.legend(fontsize=8)
        axis.set_title(f"{meta['preset']} preset, {meta['device_name']}")
        figure.savefig(output / "results.png", dpi=110, bbox_inches="tight")
        plt.close(figure)
        if curves:
            plot_curves(plt, output / "curves.png", curves, meta)
    except ImportError:
        pass
    return header + markdown



def plot_curves(plt, path: Path, runs: list[dict], meta: dict) -> None:
    """One-hop far EM (near EM faint) against the global step, a line per (variant, seed)."""
    figure, axis = plt.subplots(figsize=(7, 4))
    colours = {}
    for run in runs:
        colour = colours.setdefault(run["variant"], f"C{len(colours)}")
        steps = [p["global_step"] for p in run["curve"]]
        style = ("-", "--", "-.", ":")[run["seed"] % 4]
        axis.plot(steps, [p["twin_em"] for p in run["curve"]], color=colour, marker=".",
                  label=f"{run['variant']} seed {run['seed']}", linestyle=style)
        if "near_twin_em" in run["curve"][0]:
            axis.plot(steps, [p["near_twin_em"] for p in run["curve"]], color=colour, linestyle=style, alpha=0.35)
    shortcuts = meta.get("positional_shortcuts") or {}
    if shortcuts:
        axis.axhline(shortcuts["best_fact_slot"], color="grey", linewidth=0.8, linestyle=":")
        axis.axhline(shortcuts["chance"], color="black", linewidth=0.8, linestyle=":")
    axis.set_xlabel("training step (all stages)")
    axis.set_ylabel("one-hop far EM (%)")
    axis.set_ylim(0, 100)
    axis.legend(fontsize=7)
    axis.set_title(f"{meta['preset']}: far twin EM (faint: near twin EM; dotted: best positional shortcut, chance)",
                   fontsize=9)
    figure.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(figure)


def compare(
    preset: Preset,
    output_dir: str | os.PathLike,
    *,
    name: str = "custom",
    pretrained: str | os.PathLike | None = None,
    device: str | torch.device | None = None,
    workers: int | None = None,
    threads: int | None = None,
    time_budget: float | None = None,
    save_models: bool = False,
    overwrite: bool = False,
) -> dict[str, Any]:
    """Fine-tune and evaluate every variant and seed of ``preset``; write ``results.{md,json,png}`` to ``output_dir``.

    Args:
        preset: the recipe (`make_preset`).
        output_dir: where the results (and, with ``save_models``, each variant's first-seed model) go.
        name: the recipe's name, for the report.
        pretrained: folder of the pretrained files (default: `hf_clusterformer.pretrained.fetch_pretrained`'s cache).
        device: default CUDA when available (bf16 autocast), else CPU (fp32, runs in parallel processes).
        workers, threads: CPU only: parallel runs (default: the cores, at most 2) and torch threads per run.
        time_budget: seconds; runs that would not fit after the previous ones are skipped (and listed).
        save_models: save each variant's model of the first seed under ``output_dir/<variant>``.
        overwrite: replace models already saved there; without it such a folder is refused
            (`hf_clusterformer.hub.ModelFolderExistsError`) before any training.

    Returns:
        ``{"meta": ..., "runs": [...], "summary": ...}`` as written to ``results.json``.
    """
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    budget = time_budget or preset.time_budget
    output = Path(output_dir)
    if save_models:
        from .hub import check_output_dir

        for variant in preset.variants:
            check_output_dir(output / variant, overwrite, "overwrite=True (--overwrite)")
    output.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="clusterformer-experiment-"))
    started = time.time()
    source = resolve_pretrained(preset, pretrained, work)
    for variant in preset.variants:  # every variant is converted once, up front
        build_model(source, work, preset, variant)
    # the main pair on two seeds, then the other layer types, then the main pair's other seeds: a time budget that
    # cuts the queue short keeps a comparison of every variant
    main = [(v, s) for s in preset.seeds for v in preset.variants if v in MAIN_VARIANTS]
    others = [(v, s) for s in preset.seeds[: preset.extra_variant_seeds] for v in preset.variants
              if v not in MAIN_VARIANTS]
    split = 2 * sum(v in MAIN_VARIANTS for v in preset.variants)
    queue = main[:split] + others + main[split:]
    save_dir = output if save_models else None
    runs: list[dict] = []
    skipped: list[str] = []

    def fits(position: int) -> bool:
        longest = max((r["train_seconds"] + r["eval_seconds"] for r in runs), default=0.0)
        if runs and time.time() - started + longest > budget:
            skipped.extend(f"{v}/seed {s}" for v, s in queue[position:])
            return False
        return True

    def record(run: dict) -> None:
        runs.append(run)
        print(json.dumps({k: run[k] for k in ("variant", "seed", "scores", "train_seconds")}), flush=True)

    if device.type == "cpu":
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        workers = workers or min(2, os.cpu_count() or 1)
        threads = threads or max(1, (os.cpu_count() or 1) // workers)
        with ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn")) as pool:
            for begin in range(0, len(queue), workers):
                if not fits(begin):
                    break
                wave = [pool.submit(run_one, v, s, preset, source, work, device, dtype, threads, save_dir, None, overwrite)
                        for v, s in queue[begin: begin + workers]]
                for future in wave:
                    record(future.result())
    else:
        for position, (variant, seed) in enumerate(queue):
            if not fits(position):
                break
            # room for the main pair on two seeds and the other layer types, each trained alike
            per_run = 0.8 * (budget - (time.time() - started)) / max(1, min(len(queue), split + len(others)))
            record(run_one(variant, seed, preset, source, work, device, dtype, None, save_dir,
                           train_seconds=per_run if not runs else None, overwrite=overwrite))

    meta = {
        "preset": name, "device": str(device),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU ({os.cpu_count()} cores)",
        "dtype": str(dtype).replace("torch.", ""), "torch": torch.__version__,
        "transformers": __import__("transformers").__version__, "python": platform.python_version(),
        "wall_seconds": round(time.time() - started, 1), "skipped": skipped,
        "steps": {s.name: _STEP_PLAN.get(s.name, s.steps) for s in preset.stages}, "preset_settings": asdict(preset),
    }
    if "twin" in preset.eval:
        meta["positional_shortcuts"] = positional_shortcuts(
            generate("twin", preset.eval["twin"], preset.eval_samples, "validation", 1000, preset.num_facts))
    report = write_report(output, runs, meta, list(preset.eval))
    print(report + (f"skipped (time budget): {', '.join(skipped)}\n" if skipped else ""), flush=True)
    return json.loads((output / "results.json").read_text())
