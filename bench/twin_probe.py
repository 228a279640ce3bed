#!/usr/bin/env python
"""Is the twin readable from the states at all? Linear probes on frozen pretrained features, no fine-tuning.

For each variant (the sliding-window model, Cluster-Former, Cluster-Former with ``chunk_question_prefix``) converted
from MiniLM with a recipe's settings (default ``study``): fit the cluster layer's centroids by K-Means on its input
states over training contexts, run far ``twin`` questions, and take the state of every place mention (its first
token) after every encoder layer, labelled 1 when the place is the one named twice. A logistic-regression probe per
layer is trained on training questions; on held-out questions it scores "pick the twin": the highest-scoring
mention is one of the two twin mentions (chance 2 / facts). A layer whose probe picks the twin well holds the fact
that the QA head needs; a sliding-window stack cannot, when the mentions lie beyond its reach.

    python bench/twin_probe.py --output bench/measured/study/twin_probe.json
"""

from __future__ import annotations

import argparse
import json
import re
import tempfile
import time
from pathlib import Path

import torch

from clusterformer_research.experiment import make_preset
from clusterformer_research.experiment.recipes import VARIANT_OPTIONS
from clusterformer_research.experiment.running import build_model, generate, resolve_pretrained
from hf_clusterformer import ClusterFormerForQuestionAnswering
from hf_clusterformer.kmeans import spherical_kmeans


def mention_positions(record: dict, offsets: list) -> tuple[list[int], list[int]]:
    """Token index of every place mention's first token and its label (1: the twin place)."""
    answer = record["answers"]["text"][0]
    positions, labels = [], []
    for match in re.finditer(r"\w+ lives in (\w+)\.", record["context"]):
        start = match.start(1)
        token = next(t for t, o in enumerate(offsets) if o is not None and o[0] <= start < o[1])
        positions.append(token)
        labels.append(int(match.group(1) == answer))
    return positions, labels


def features(
    model, tokenizer, records: list[dict], batch_size: int = 16
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Per record: (layers + 1, mentions, d) states of its place mentions and (mentions,) labels."""
    states, labels = [], []
    for begin in range(0, len(records), batch_size):
        batch = records[begin: begin + batch_size]
        encoded = tokenizer([r["question"] for r in batch], [r["context"] for r in batch], padding=True,
                            return_offsets_mapping=True, return_tensors="pt")
        with torch.no_grad():
            out = model(input_ids=encoded["input_ids"], attention_mask=encoded["attention_mask"],
                        output_hidden_states=True)
        layers = torch.stack(out.hidden_states, dim=1)  # (B, layers + 1, T, d)
        for row, record in enumerate(batch):
            sequence = encoded.sequence_ids(row)
            offsets = [tuple(o) if s == 1 else None for o, s in zip(encoded["offset_mapping"][row].tolist(), sequence)]
            positions, label = mention_positions(record, offsets)
            states.append(layers[row][:, positions])
            labels.append(torch.tensor(label))
    return states, labels


def fit_centroids(model, tokenizer, records: list[dict]) -> None:
    """K-Means on every cluster layer's input states (token-aligned) over ``records``; marks the routers fitted."""
    routers = model.cluster_routers()
    if not routers:
        return
    encoded = tokenizer([r["question"] for r in records], [r["context"] for r in records], padding=True,
                        return_tensors="pt")
    with torch.no_grad():
        hidden = model(**encoded, output_hidden_states=True).hidden_states
    valid = encoded["attention_mask"].bool()
    for index, router in routers.items():
        result = spherical_kmeans(hidden[index][valid], router.num_clusters, backend="torch", seed=0)
        router.centroids.copy_(result.centroids)
        router.fitted.fill_(True)


def probe(train: tuple, test: tuple, layer: int, steps: int = 300) -> float:
    """Pick-the-twin accuracy (%) on ``test`` of a logistic regression on layer ``layer`` trained on ``train``."""
    x = torch.cat([s[layer] for s in train[0]]).float()
    y = torch.cat(train[1]).float()
    mean, std = x.mean(0), x.std(0) + 1e-5
    weight = torch.zeros(x.shape[1], requires_grad=True)
    bias = torch.zeros((), requires_grad=True)
    optimizer = torch.optim.Adam([weight, bias], lr=0.01, weight_decay=1e-3)
    for _ in range(steps):
        logits = ((x - mean) / std) @ weight + bias
        pos_weight = torch.tensor(float(len(y) / y.sum() - 1))
        loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, y, pos_weight=pos_weight)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    with torch.no_grad():
        hits = [bool(label[int((((s[layer].float() - mean) / std) @ weight).argmax())]) for s, label in zip(*test)]
    return round(100.0 * sum(hits) / len(hits), 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="study")
    parser.add_argument("--variants", nargs="+", default=["sliding", "clusterformer", "clusterformer-prefix"])
    parser.add_argument("--train", type=int, default=300, help="training questions for the probes")
    parser.add_argument("--test", type=int, default=200, help="held-out questions")
    parser.add_argument("--pretrained", default=None)
    parser.add_argument("--output", default=None, help="JSON file for the results")
    args = parser.parse_args()
    torch.manual_seed(0)
    preset = make_preset(args.preset)
    options = preset.eval["twin"]
    train_records = generate("twin", options, args.train, "probe-train", 0, preset.num_facts)
    test_records = generate("twin", options, args.test, "validation", 1000, preset.num_facts)
    work = Path(tempfile.mkdtemp(prefix="twin-probe-"))
    source = resolve_pretrained(preset, args.pretrained, work)
    from transformers import AutoTokenizer

    results = {"preset": args.preset, "twin_options": options, "train": args.train, "test": args.test,
               "chance": round(200.0 / preset.num_facts, 1), "variants": {}}
    for variant in args.variants:
        started = time.time()
        init = build_model(source, work, preset, variant)
        tokenizer = AutoTokenizer.from_pretrained(init)
        model = ClusterFormerForQuestionAnswering.from_pretrained(init, **VARIANT_OPTIONS.get(variant, {})).eval()
        fit_centroids(model, tokenizer, train_records[:64])
        train, test = features(model, tokenizer, train_records), features(model, tokenizer, test_records)
        layers = train[0][0].shape[0]
        scores = {
            f"after layer {layer - 1}" if layer else "embeddings": probe(train, test, layer) for layer in range(layers)
        }
        results["variants"][variant] = scores
        seconds = round(time.time() - started)
        print(json.dumps({"variant": variant, "pick_the_twin": scores, "seconds": seconds}), flush=True)
    print(f"chance (two of {preset.num_facts} mentions): {results['chance']}%")
    if args.output:
        Path(args.output).parent.mkdir(parents=True, exist_ok=True)
        Path(args.output).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
