"""Running the fine-tuning experiments: data, models, the training loop, evaluation and the queue of runs.

`compare` fine-tunes every variant of a recipe (`clusterformer_research.experiment.recipes`) with every seed on the
same data and steps and hands the runs to `clusterformer_research.experiment.report`. One run (`run_one`) is a plain
loop (AdamW, a warm-up then constant or linear schedule, `CentroidUpdater` after every step), which runs where
``datasets`` and ``evaluate`` are not installed (the GPU machine), with a learning curve of held-out far (and near)
``twin`` questions every ``curve_every`` steps.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hf_clusterformer.centroid_updates import CentroidUpdater
from hf_clusterformer.conversion import convert_checkpoint
from hf_clusterformer.features import prepare_train_features, prepare_validation_features
from hf_clusterformer.hub import quiet_loading, save_for_hub
from hf_clusterformer.modeling_clusterformer import ClusterFormerForQuestionAnswering
from hf_clusterformer.pipeline import rank_spans
from hf_clusterformer_files import check_output_dir

from ..longrange import generate_longrange_dataset
from ..training import Gate, TrainStage, pad_batch, scaled_groups, train_stages, zero_started
from .recipes import MAIN_VARIANTS, PRETRAINED_ORIGIN, VARIANT_LAYER_TYPE, VARIANT_OPTIONS, Preset, Stage
from .report import positional_shortcuts, write_report

#: The folder under a comparison's output where each run saves its state (every 25 steps; removed when the report is
#: written): the same call after an interruption resumes every run from it.
CHECKPOINTS = "checkpoints"

__all__ = ["build_model", "compare", "evaluate", "generate", "parameter_groups",
           "resolve_pretrained", "run_one"]


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
    keys = ("input_ids", "start_positions", "end_positions")
    return [{key: features[key][i] for key in keys} for i in range(len(records))]


def tiny_bert(directory: Path, corpus: list[str]) -> Path:
    """A random 4-layer, 32-wide BERT with a WordPiece vocabulary of the data (the smoke preset's 'pretrained').

    The vocabulary is every word of ``corpus`` plus every character with and without ``##``, sorted: the same ids
    in every process (a trained WordPiece vocabulary breaks ties between equally frequent merges differently).
    """
    from tokenizers import normalizers, pre_tokenizers
    from transformers import BertConfig, BertModel, BertTokenizerFast

    normalizer, splitter = normalizers.BertNormalizer(lowercase=True), pre_tokenizers.BertPreTokenizer()
    words = {piece for text in corpus for piece, _ in splitter.pre_tokenize_str(normalizer.normalize_str(text))}
    characters = {c for word in words for c in word}
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    vocab = specials + sorted(words | characters | {"##" + c for c in characters})
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer = BertTokenizerFast(vocab={token: index for index, token in enumerate(vocab)})
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
    from hf_clusterformer.pretrained import fetch_pretrained

    return fetch_pretrained(cache_dir=pretrained)


def build_model(source: Path, work: Path, preset: Preset, variant: str) -> Path:
    """The variant's converted checkpoint folder (converted once per layer type and ``work`` folder)."""
    layer_type = VARIANT_LAYER_TYPE[variant]
    path = work / f"init-{layer_type or 'sliding'}"
    if not (path / "config.json").is_file():
        convert_checkpoint(
            source, path, cluster_layers=preset.cluster_layers if layer_type else [],
            global_layer_type=layer_type or "cluster", num_clusters=preset.num_clusters,
            window_size=preset.window_size, window_stride=preset.window_stride,
            max_question_length=preset.max_question_length, max_context_length=1 << 17,
            num_hidden_layers=preset.num_hidden_layers,
        )
    return path


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
    rank = torch.empty_like(order).scatter_(
        1, order, torch.arange(order.shape[1], device=order.device).expand_as(order)
    )
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
    whose first global layer is a cluster or window_cluster layer, also how often the two answer mentions share a
    chunk there."""
    columns = {key: [r[key] for r in records] for key in ("id", "question", "context")}
    features = prepare_validation_features(columns, tokenizer, max_length=1 << 20)
    global_types = [t for t in model.config.layer_kinds if t != "sliding"]
    colocation = kind == "twin" and global_types[:1] in (["cluster"], ["window_cluster"])
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


def parameter_groups(model, preset: Preset, learning_rate: float) -> list[dict]:
    """AdamW groups (`scaled_groups`): the rest at the rate, the parameters that start at zero (a window_cluster
    layer's ``routed_output``) at ``routed_lr_scale`` times it, the global layers' other parameters at
    ``cluster_lr_scale`` times it."""
    global_layers = tuple(f"encoder.layer.{i}." for i in model.config.global_layers)
    return scaled_groups(model, learning_rate, [(zero_started(model), preset.routed_lr_scale),
                                                (lambda name: any(p in name for p in global_layers),
                                                 preset.cluster_lr_scale)])


# ----------------------------------------------------------------------------------------------------------------
# One run: a (variant, seed) through every stage
# ----------------------------------------------------------------------------------------------------------------


@dataclass
class RunSetup:
    """What every run of one `compare` shares: the recipe, the converted checkpoints and where and how to train.

    ``step_plan`` maps a stage to the steps every run trains (set by the first run when ``train_seconds`` made it
    shorten them); ``save_dir``: where the first seed's models go (None: not saved).
    """

    preset: Preset
    source: Path
    work: Path
    device: torch.device
    dtype: torch.dtype
    threads: int | None = None
    save_dir: Path | None = None
    overwrite: bool = False
    checkpoint_root: Path | None = None
    step_plan: dict[str, int] = field(default_factory=dict)

    def steps(self, stage: Stage) -> int:
        return self.step_plan.get(stage.name, stage.steps)


def load_variant(setup: RunSetup, variant: str, seed: int):
    """(model, tokenizer) of a variant, seeded, on the device, the recipe's lower layers frozen."""
    from transformers import AutoTokenizer

    init = build_model(setup.source, setup.work, setup.preset, variant)
    tokenizer = AutoTokenizer.from_pretrained(init)
    torch.manual_seed(seed)
    np.random.seed(seed)
    model = ClusterFormerForQuestionAnswering.from_pretrained(init, **VARIANT_OPTIONS.get(variant, {}))
    model = model.to(setup.device)
    if setup.preset.frozen_layers:
        for module in [model.roberta.embeddings, *model.roberta.encoder.layer[: setup.preset.frozen_layers]]:
            module.requires_grad_(False)
    return model, tokenizer


def training_data(preset: Preset, stage: Stage, seed: int, tokenizer) -> list[dict]:
    """The stage's training features for ``seed``: enough records of each kind for its steps (capped)."""
    needed = min(preset.train_samples, -(-stage.steps * stage.batch_size // len(stage.data)))
    records = []
    for kind, options in stage.data.items():
        records += generate(kind, options, needed, f"{stage.name}-train", seed, preset.num_facts)
    return encode_train(records, tokenizer)


class LearningCurve:
    """Far (and the first stage's near) ``twin`` EM on held-out questions: the training loop's ``evaluate``."""

    def __init__(self, preset: Preset, setup: RunSetup, tokenizer):
        self.preset, self.setup, self.tokenizer = preset, setup, tokenizer
        self.far, self.near = [], []
        if preset.curve_every and "twin" in preset.eval:
            self.far = generate("twin", preset.eval["twin"], preset.curve_samples, "curve", 1000, preset.num_facts)
            near = preset.stages[0].data.get("twin")
            if near is not None and near != preset.eval["twin"]:
                self.near = generate("twin", near, preset.curve_samples, "curve", 1000, preset.num_facts)

    def __call__(self, model) -> dict:
        setup, preset = self.setup, self.preset
        far = evaluate(model, self.tokenizer, self.far, preset, setup.device, setup.dtype, 16, "twin")
        point = {"twin_em": far["exact_match"], "twin_shared_chunk": far.get("twin_shared_chunk")}
        return {**point, **self.near_only(model)} if self.near else point

    def near_only(self, model) -> dict:
        """The near EM alone (what a gate reads), for stages whose curve skips the far questions."""
        setup = self.setup
        return {"near_twin_em": evaluate(model, self.tokenizer, self.near, self.preset, setup.device, setup.dtype, 16,
                                         "twin")["exact_match"]}


def training_plan(setup: RunSetup, tokenizer, seed: int, train_seconds: float | None,
                  curve: LearningCurve | None = None) -> list[TrainStage]:
    """The recipe's stages for the training loop: features, steps (the step plan's), schedule, a shuffle per pass,
    the global layers' learning-rate scale, the near-only curve of a stage without ``far_curve``; with
    ``train_seconds`` and no plan yet, each stage's share of it."""
    preset = setup.preset
    total = sum(s.steps for s in preset.stages)
    plan: list[TrainStage] = []
    for stage in preset.stages:
        steps = setup.steps(stage)
        share = train_seconds * stage.steps / total if train_seconds and stage.name not in setup.step_plan else None
        plan.append(TrainStage(
            stage.name, training_data(preset, stage, seed, tokenizer), steps, stage.batch_size, stage.learning_rate,
            warmup=max(1, preset.warmup_steps or steps // 20), schedule=preset.schedule, order=preset.order,
            gate=Gate("near_twin_em", stage.gate) if stage.gate is not None else None,
            rehearsal=plan[0].data if stage.rehearsal_batch else (), rehearsal_batch=stage.rehearsal_batch,
            max_seconds=share, param_groups=lambda model, lr: parameter_groups(model, preset, lr),
            evaluate=curve.near_only if curve is not None and curve.near and not stage.far_curve else None))
    return plan


def save_model(model, tokenizer, setup: RunSetup, variant: str) -> None:
    """Save a trained variant (weights, centroids, tokenizer, code, card) under ``save_dir/<variant>``."""
    preset = setup.preset
    card = {"model_id": f"clusterformer-{variant}",
            "base_model": PRETRAINED_ORIGIN if preset.pretrained == "minilm" else None,
            "training_data": "Generated long-range QA (`clusterformer_research.longrange`): " + ", ".join(preset.eval),
            "centroids_fitted": {i: bool(r.fitted) for i, r in model.cluster_routers().items()}}
    save_for_hub(model.cpu().eval(), tokenizer, setup.save_dir / variant,
                 card_data={k: v for k, v in card.items() if v is not None}, overwrite=setup.overwrite)


def run_one(setup: RunSetup, variant: str, seed: int, train_seconds: float | None = None) -> dict:
    """Fine-tune one variant with one seed through every stage, evaluate it, and save it for the first seed.

    With ``train_seconds`` and no step plan yet, this run times steps 10-30 of each stage and, when the stage would
    take more than its share, trains fewer steps; ``setup.step_plan`` then makes every later run train as many.
    """
    if setup.threads:
        torch.set_num_threads(setup.threads)
    with quiet_loading():
        preset, label = setup.preset, f"{variant}/seed {seed}"
        model, tokenizer = load_variant(setup, variant, seed)
        updater = None
        if model.cluster_routers():  # cluster and window_cluster layers
            updater = CentroidUpdater(model, preset.centroids, seed=seed)
        curve = LearningCurve(preset, setup, tokenizer)
        checkpoint = setup.checkpoint_root / f"{variant}-seed{seed}" if setup.checkpoint_root else None
        result = train_stages(
            model, training_plan(setup, tokenizer, seed, train_seconds, curve), pad_id=tokenizer.pad_token_id,
            evaluate=curve if curve.far else None, eval_every=preset.curve_every or 1, updater=updater, seed=seed,
            checkpoint_dir=checkpoint, label=label, device=setup.device, dtype=setup.dtype,
            print_fn=lambda line: print(line if line.startswith("[") else f"[{label}] curve {line}", flush=True))
        for stage in preset.stages:
            setup.step_plan.setdefault(stage.name, result["stages"][stage.name])
        started = time.time()
        scores = {kind: evaluate(model, tokenizer,
                                 generate(kind, options, preset.eval_samples, "validation", 1000, preset.num_facts),
                                 preset, setup.device, setup.dtype, 16, kind)
                  for kind, options in preset.eval.items()}
        if updater is not None:
            updater.close()
        if setup.save_dir is not None and seed == preset.seeds[0]:
            save_model(model, tokenizer, setup, variant)
        return {"variant": variant, "seed": seed, "scores": scores, "train_seconds": result["seconds"],
                "eval_seconds": round(time.time() - started, 1), "log": result["log"],
                "curve": [{k: v for k, v in p.items() if k != "seconds"} for p in result["curve"]],
                "steps": dict(result["stages"])}


# ----------------------------------------------------------------------------------------------------------------
# Every run of a recipe
# ----------------------------------------------------------------------------------------------------------------


def run_queue(preset: Preset) -> tuple[list[tuple[str, int]], int]:
    """The order of the runs and how many come before the other layer types: the main variants on two seeds, then
    the other layer types, then the main variants' other seeds (a time budget that cuts the queue short keeps a
    comparison of every variant)."""
    main = [(v, s) for s in preset.seeds for v in preset.variants if v in MAIN_VARIANTS]
    others = [(v, s) for s in preset.seeds[: preset.extra_variant_seeds] for v in preset.variants
              if v not in MAIN_VARIANTS]
    split = 2 * sum(v in MAIN_VARIANTS for v in preset.variants)
    return main[:split] + others + main[split:], split + len(others)


def _run_on_cpu(setup: RunSetup, queue, fits, record, workers: int | None) -> None:
    """Waves of ``workers`` runs in parallel processes; one worker runs them in this process (no interpreter to
    start)."""
    import contextlib
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    workers = workers or min(2, os.cpu_count() or 1)
    setup.threads = setup.threads or max(1, (os.cpu_count() or 1) // workers)
    pool = None
    if workers > 1:
        pool = ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn"))
    with pool or contextlib.nullcontext():
        for begin in range(0, len(queue), workers):
            if not fits(begin):
                break
            wave = [(setup, v, s) for v, s in queue[begin: begin + workers]]
            for run in pool.map(run_one, *zip(*wave)) if pool else (run_one(*args) for args in wave):
                record(run)


def _run_on_gpu(setup: RunSetup, queue, fits, record, budget: float, started: float, first_part: int) -> None:
    """One run after another; the first one sizes the steps so that ``first_part`` runs fit in the budget."""
    for position, (variant, seed) in enumerate(queue):
        if not fits(position):
            break
        per_run = 0.8 * (budget - (time.time() - started)) / max(1, min(len(queue), first_part))
        record(run_one(setup, variant, seed, train_seconds=None if setup.step_plan else per_run))


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
    """Fine-tune and evaluate every variant and seed of ``preset``; write ``results.{md,json,png}`` (and, with
    learning curves, ``curves.png``) to ``output_dir``.

    Args:
        preset: the recipe (`clusterformer_research.experiment.make_preset`).
        output_dir: where the results (and, with ``save_models``, each variant's first-seed model) go.
        name: the recipe's name, for the report.
        pretrained: folder of the pretrained files (default: `hf_clusterformer.pretrained.fetch_pretrained`'s cache).
        device: default CUDA when available (bf16 autocast), else CPU (fp32, runs in parallel processes).
        workers, threads: CPU only: parallel runs (default: the cores, at most 2) and torch threads per run.
        time_budget: seconds; runs that would not fit after the previous ones are skipped (and listed).
            Each run saves its state under ``output_dir/checkpoints`` every 25 steps; the same call after an
            interruption resumes the runs from there (the folder goes once the report is written).
        save_models: save each variant's model of the first seed under ``output_dir/<variant>``.
        overwrite: replace models already saved there; without it such a folder is refused
            (`hf_clusterformer.hub.ModelFolderExistsError`) before any training.

    Returns:
        ``{"meta": ..., "runs": [...], "summary": ...}`` as written to ``results.json``.
    """
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    budget = time_budget or preset.time_budget
    output = Path(output_dir)
    if save_models:
        for variant in preset.variants:
            check_output_dir(output / variant, overwrite, "overwrite=True (--overwrite)")
    output.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="clusterformer-experiment-"))
    started = time.time()
    setup = RunSetup(preset, resolve_pretrained(preset, pretrained, work), work, device,
                     torch.bfloat16 if device.type == "cuda" else torch.float32, threads,
                     output if save_models else None, overwrite, checkpoint_root=output / CHECKPOINTS)
    with quiet_loading():
        for variant in preset.variants:  # every variant is converted once, up front
            build_model(setup.source, work, preset, variant)
    queue, first_part = run_queue(preset)
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
        _run_on_cpu(setup, queue, fits, record, workers)
    else:
        _run_on_gpu(setup, queue, fits, record, budget, started, first_part)
    meta = run_meta(setup, name, started, skipped, runs)
    report = write_report(output, runs, meta, list(preset.eval))
    shutil.rmtree(output / CHECKPOINTS, ignore_errors=True)  # every run is recorded: nothing left to resume
    print(report + (f"skipped (time budget): {', '.join(skipped)}\n" if skipped else ""), flush=True)
    return json.loads((output / "results.json").read_text())


def run_meta(setup: RunSetup, name: str, started: float, skipped: list[str], runs: list[dict]) -> dict:
    """The report's record of where, how and with what the runs went, and the twin questions' positional shortcuts."""
    preset, device = setup.preset, setup.device
    meta = {
        "preset": name, "device": str(device),
        "device_name": (
            torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU ({os.cpu_count()} cores)"
        ),
        "dtype": str(setup.dtype).replace("torch.", ""), "torch": torch.__version__,
        "transformers": __import__("transformers").__version__, "python": platform.python_version(),
        "wall_seconds": round(time.time() - started, 1), "skipped": skipped,
        "steps": runs[0]["steps"] if runs else {s.name: s.steps for s in preset.stages},
        "preset_settings": asdict(preset),
    }
    if "twin" in preset.eval:
        meta["positional_shortcuts"] = positional_shortcuts(
            generate("twin", preset.eval["twin"], preset.eval_samples, "validation", 1000, preset.num_facts))
    return meta
