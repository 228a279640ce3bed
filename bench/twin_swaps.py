#!/usr/bin/env python
"""One-swap-at-a-time study of the twin (one-hop) task: which piece makes a fine-tuning run learn it or not.

A small, fixed loop over the project's public pieces (``convert_checkpoint``, ``ClusterFormerForQuestionAnswering``,
``CentroidUpdater``, the twin generator and ``prepare_train_features``), where every piece the long-range
experiment could differ in is one flag: the data (``--near`` / ``--far``: the project's generator with JSON options,
or ``probe``: the reference loop's own generator, read from ``--probe`` when that file is present), token types,
the question length limit, batch order, the centroid updater's settings, the learning-rate schedule and which layers
train. It prints a learning curve of two metrics on the same held-out questions: ``start_em`` (the start token is
the trained mention's) and ``text_em`` (the best span's text is the answer, either mention; project data only).

    python bench/twin_swaps.py --variant clusterformer --seed 1 --near-steps 300 --far-steps 0 \\
        --near '{"context_tokens": [40, 50], "num_facts": 5, "placement": "balanced"}'

Runs one model; run the two variants side by side (one thread each). The JSON record goes to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

import torch

from clusterformer_research.experiment.report import positional_shortcuts
from clusterformer_research.longrange import generate_longrange_dataset
from clusterformer_research.training import Gate, TrainStage, pad_batch, train_stages
from hf_clusterformer import CentroidUpdater, ClusterFormerForQuestionAnswering
from hf_clusterformer.centroid_updates import CentroidUpdateSettings
from hf_clusterformer.conversion import convert_checkpoint
from hf_clusterformer.features import prepare_train_features, prepare_validation_features
from hf_clusterformer.hub import quiet_loading
from hf_clusterformer.pipeline import rank_spans
from hf_clusterformer.pretrained import fetch_pretrained

TWIN_DEFAULTS = {"names": "words", "placement": "balanced", "target": "later", "min_gap_tokens": 0}


def project_examples(options: dict, count: int, split: str, seed: int, tokenizer) -> list[dict]:
    """Twin examples of the project's generator as features: ids, the trained start/end, and text for text EM."""
    records = generate_longrange_dataset(count, seed, kind="twin", split=split, **{**TWIN_DEFAULTS, **options})
    columns = {key: [r[key] for r in records] for key in ("id", "question", "context", "answers")}
    train = prepare_train_features(columns, tokenizer, max_length=1 << 20)
    valid = prepare_validation_features(columns, tokenizer, max_length=1 << 20)
    return [{"ids": train["input_ids"][i], "start": train["start_positions"][i], "end": train["end_positions"][i],
             "offsets": valid["offset_mapping"][i], "context": records[i]["context"],
             "answer": records[i]["answers"]["text"][0].lower(), "record": records[i]} for i in range(len(records))]


def probe_examples(path: str, stage: str, count: int, seed: int) -> list[dict]:
    """Examples of the reference loop's generator (its ``make``/``feats``, run from its file, nothing copied)."""
    source = Path(path).read_text()
    prefix = source[: source.index("near = feats(")]
    argv = sys.argv
    os.environ.setdefault("MINILM_DIR", str(fetch_pretrained()))
    sys.argv = ["probe", "x", "[]", "1", "0", "0"]
    try:
        scope: dict = {"__name__": "probe_data"}
        exec(compile(prefix, path, "exec"), scope)
    finally:
        sys.argv = argv
    n_fill, n_facts, min_gap = {"near": (6, 5, 0), "far": (48, 16, 200)}[stage]
    return [{"ids": ids, "start": s, "end": e} for ids, s, e in scope["feats"](count, seed, n_fill, n_facts, min_gap)]


def load_examples(spec: str, stage: str, count: int, split: str, seed: int, tokenizer, probe: str) -> list[dict]:
    if spec == "probe":
        return probe_examples(probe, stage, count, {"train": 0, "validation": 7}[split] + seed * 10 + (stage == "far"))
    return project_examples(json.loads(spec), count, f"{stage}-{split}", seed, tokenizer)


@torch.no_grad()
def evaluate(model, examples: list[dict], pad_id: int) -> dict:
    model.eval()
    start_hits = text_hits = 0
    for begin in range(0, len(examples), 16):
        rows = examples[begin: begin + 16]
        ids, mask = pad_batch([r["ids"] for r in rows], pad_id)
        out = model(input_ids=ids, attention_mask=mask)
        start_hits += int((out.start_logits.masked_fill(mask == 0, -1e4).argmax(-1)
                           == torch.tensor([r["start"] for r in rows])).sum())
        for j, r in enumerate(rows):
            if "offsets" not in r:
                continue
            n = len(r["offsets"])
            candidate = torch.tensor([o is not None for o in r["offsets"]])
            ((_, s, e),) = rank_spans(out.start_logits[j, :n], out.end_logits[j, :n], candidate, max_answer_len=8)
            text_hits += r["context"][r["offsets"][s][0]: r["offsets"][e][1]].strip().lower() == r["answer"]
    result = {"start_em": round(100 * start_hits / len(examples), 1)}
    if "offsets" in examples[0]:
        result["text_em"] = round(100 * text_hits / len(examples), 1)
    return result


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--variant", choices=["clusterformer", "sliding"], required=True)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--near", default='{"context_tokens": [40, 50], "num_facts": 5}')
    parser.add_argument("--far", default='{"context_tokens": [300, 340], "num_facts": 16, "min_gap_tokens": 200}')
    parser.add_argument("--probe", default=str(Path(__file__).resolve().parents[2] / "shared/probes/twin_probe.py"))
    parser.add_argument("--near-steps", type=int, default=300)
    parser.add_argument("--far-steps", type=int, default=420)
    parser.add_argument("--near-gate", type=float, default=None,
                        help="end the near stage at the first evaluation whose held-out near start EM reaches this "
                             "(--near-steps is then the most it runs)")
    parser.add_argument("--gate-evaluations", type=int, default=1,
                        help="the gate reads the mean of the near stage's last this many evaluations")
    parser.add_argument("--rehearsal-batch", type=int, default=0,
                        help="near training questions added to every far step (their own forward pass; 0: none)")
    parser.add_argument("--checkpoint-dir", default=None,
                        help="save the run's state here every 25 steps; the same command resumes from it")
    parser.add_argument("--near-batch", type=int, default=16)
    parser.add_argument("--far-batch", type=int, default=8)
    parser.add_argument("--near-lr", type=float, default=1e-4)
    parser.add_argument("--far-lr", type=float, default=5e-5)
    parser.add_argument("--warmup", type=int, default=30)
    parser.add_argument("--window", type=int, nargs=2, default=[32, 28])
    parser.add_argument("--cluster-layer", type=int, default=3)
    parser.add_argument("--num-clusters", type=int, default=64)
    parser.add_argument("--max-question-length", type=int, default=32)
    parser.add_argument("--token-types", choices=["pair", "zero"], default="pair")
    parser.add_argument("--order", choices=["sequential", "shuffled"], default="sequential")
    parser.add_argument("--frozen-layers", type=int, default=0)
    parser.add_argument("--centroids", default='{"update_every_steps": 50, "memory_size": 20000, "min_states": 1500}',
                        help="CentroidUpdateSettings fields as JSON")
    parser.add_argument("--train-examples", type=int, default=3000)
    parser.add_argument("--eval-examples", type=int, default=150)
    parser.add_argument("--eval-every", type=int, default=100)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    from transformers import AutoTokenizer

    source = fetch_pretrained()
    work = Path(tempfile.mkdtemp(prefix="twin-swaps-"))
    with quiet_loading():
        convert_checkpoint(source, work / "model",
                           cluster_layers=[args.cluster_layer] if args.variant == "clusterformer" else [],
                           global_layer_type="cluster", num_clusters=args.num_clusters,
                           window_size=args.window[0], window_stride=args.window[1],
                           max_question_length=args.max_question_length, max_context_length=1 << 17)
        tokenizer = AutoTokenizer.from_pretrained(work / "model")
        torch.manual_seed(args.seed)
        model = ClusterFormerForQuestionAnswering.from_pretrained(
            work / "model", pair_token_types=args.token_types == "pair").train()
    if args.frozen_layers:
        for module in [model.roberta.embeddings, *model.roberta.encoder.layer[: args.frozen_layers]]:
            module.requires_grad_(False)
    settings = CentroidUpdateSettings.build(update_every_epochs=None, backend="torch", seed=args.seed,
                                            **json.loads(args.centroids))
    updater = CentroidUpdater(model, settings) if args.variant == "clusterformer" else None
    stages = [("near", args.near, args.near_steps, args.near_batch, args.near_lr),
              ("far", args.far, args.far_steps, args.far_batch, args.far_lr)]
    pad_id = tokenizer.pad_token_id
    held_out = {name: load_examples(spec, name, args.eval_examples, "validation", args.seed, tokenizer, args.probe)
                for name, spec, steps, *_ in stages if steps}
    record = {"args": vars(args)}
    record["shortcuts"] = {name: positional_shortcuts([e["record"] for e in examples])
                           for name, examples in held_out.items() if "record" in examples[0]}
    print(json.dumps({"shortcuts": record["shortcuts"]}), flush=True)
    data = {name: [{"input_ids": e["ids"], "start_positions": e["start"], "end_positions": e["end"]} for e in
                   load_examples(spec, name, args.train_examples, "train", args.seed, tokenizer, args.probe)]
            for name, spec, steps, *_ in stages if steps}
    order = "epochs" if args.order == "shuffled" else "sequential"
    plan = [TrainStage(name, data[name], steps, batch_size, lr, warmup=args.warmup, order=order,
                       gate=Gate("near_start_em", args.near_gate, args.gate_evaluations)
                       if name == "near" and args.near_gate is not None else None,
                       rehearsal=data.get("near", ()) if name == "far" and args.rehearsal_batch else (),
                       rehearsal_batch=args.rehearsal_batch if name == "far" else 0)
            for name, spec, steps, batch_size, lr in stages if steps]

    def held_out_metrics(model) -> dict:
        return {f"{k}_{m}": v for k, ex in held_out.items() for m, v in evaluate(model, ex, pad_id).items()}

    result = train_stages(model, plan, pad_id=pad_id, evaluate=held_out_metrics, eval_every=args.eval_every,
                          updater=updater, seed=args.seed, checkpoint_dir=args.checkpoint_dir,
                          label=f"{args.variant}/seed {args.seed}")
    record.update(curve=result["curve"], log=result["log"], seconds=result["seconds"], stage_steps=result["stages"])
    if "near" in result["stages"] and result["stages"]["near"] < args.near_steps:
        record["near_steps_run"] = result["stages"]["near"]
    record["final"] = record["curve"][-1] if record["curve"] else None
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(record, indent=1))
    return record


if __name__ == "__main__":
    main()
