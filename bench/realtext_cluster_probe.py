#!/usr/bin/env python
"""Why the Cluster-Former start collapses at length: its cluster layer, or a fault?

The real-text study's Cluster-Former start (stage A's weights with a cluster layer whose centroids were fitted on the
start's states, never trained with it) scored F1 9 on ``other`` contexts of 2k tokens where the same weights with a
sliding-window layer scored F1 40 (and 56 vs 57 on the gold paragraph alone). This probe scores the first
``--questions`` questions of that cell with variants that change one thing in the cluster layer:

* ``sliding``: stage A's model (the sliding-window start);
* ``cluster``: the Cluster-Former start as the study runs it;
* ``cluster-contiguous``: the same layer with every slot given one cluster id, so the stable sort keeps input order and
  the chunks are contiguous runs of ``m`` slots (no clustering, no question in the chunk): if this recovers, the
  clustering (which states meet) is what hurts;
* ``cluster-question-prefix``: the fitted clusters with ``chunk_question_prefix`` (every chunk prefixed by its
  question; beyond the paper): if this recovers, losing the question in that layer is what hurts.

It also prints, per layer, the mean cosine between the sliding start's and the cluster start's states of the gold
passage's tokens (the layers before the cluster layer must agree to float precision; a fault shows up there or as a
drop that the variants do not explain). One core, a few minutes::

    .venv/bin/python bench/realtext_cluster_probe.py --questions 40 > bench/measured/realtext/cluster-probe/log.txt
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import realtext  # noqa: E402  (the study's data, models and scoring)

from hf_clusterformer.modeling_clusterformer import RoutedLayer  # noqa: E402


def contiguous_routing(model) -> None:
    """Give every representative slot cluster 0 in each routed layer (sorting then keeps input order)."""
    for layer in model.base_model.encoder.layer:
        if isinstance(layer, RoutedLayer):
            router = layer.router
            router.forward = lambda states, representative, p=router.num_clusters: torch.zeros(
                representative.shape, dtype=torch.long, device=states.device).masked_fill(~representative, p)


@torch.no_grad()
def gold_cosines(first, second, records: list[dict], features: list[dict]) -> list[float]:
    """Mean cosine per hidden-state layer between two models' token states of the gold passage."""
    totals = None
    for record, feature in zip(records, features):
        ids = torch.tensor([feature["input_ids"]])
        start, end = record["passages"][record["gold"]]
        spans = feature["spans"]
        gold = torch.from_numpy((spans[:, 0] >= start) & (spans[:, 1] <= end) & (spans[:, 1] > spans[:, 0]))
        a = first(input_ids=ids, output_hidden_states=True).hidden_states
        b = second(input_ids=ids, output_hidden_states=True).hidden_states
        cos = torch.stack([torch.nn.functional.cosine_similarity(x[0, gold], y[0, gold], dim=-1).mean()
                           for x, y in zip(a, b)])
        totals = cos if totals is None else totals + cos
    return [round(float(v), 4) for v in totals / len(records)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--questions", type=int, default=40, help="the cell's first N questions")
    parser.add_argument("--length", type=int, default=2000, help="the other-article cell's context tokens")
    parser.add_argument("--cosine_questions", type=int, default=8, help="questions of the per-layer cosine")
    parser.add_argument("--output", help="a JSON record of the scores")
    options = parser.parse_args(argv)
    torch.set_num_threads(1)
    study = realtext.Study(realtext.parse_args([]))
    records, features = study.evaluation_set("probe", lambda: study.cell_records("other", options.length))
    records, features = records[: options.questions], features[: options.questions]
    sliding_path, cluster_path = study.start_path(0, "sliding"), study.start_path(0, "clusterformer")

    variants = {
        "sliding": lambda: realtext.load_model(sliding_path, study),
        "cluster": lambda: realtext.load_model(cluster_path, study),
        "cluster-contiguous": lambda: realtext.load_model(cluster_path, study),
        "cluster-question-prefix": lambda: realtext.load_model(cluster_path, study, chunk_question_prefix=True),
    }
    scores = {}
    for name, load in variants.items():
        model = load().eval()
        if name == "cluster-contiguous":
            contiguous_routing(model)
        entries = [e for r, f in zip(records, features) for e in realtext.answer_batch(model, study, [r], [f])]
        scores[name] = {"em": round(float(np.mean([e["em"] for e in entries])), 1),
                        "f1": round(float(np.mean([e["f1"] for e in entries])), 1)}
        if "colocation" in entries[0]:
            scores[name]["gold_tokens_with_question"] = round(
                100 * float(np.mean([e["colocation"]["gold_tokens"] for e in entries])), 1)
        print(f"{name:24s} EM {scores[name]['em']:5.1f}  F1 {scores[name]['f1']:5.1f}  "
              f"({options.questions} questions, other-{options.length})", flush=True)

    first = realtext.load_model(sliding_path, study).eval()
    second = realtext.load_model(cluster_path, study).eval()
    n = options.cosine_questions
    cosines = gold_cosines(first, second, records[:n], features[:n])
    print(f"gold-passage token cosine, sliding start vs cluster start, per hidden state (embeddings, layers 0-5), "
          f"{n} questions: {cosines}")
    if options.output:
        Path(options.output).parent.mkdir(parents=True, exist_ok=True)
        Path(options.output).write_text(json.dumps({"questions": options.questions, "length": options.length,
                                                    "scores": scores, "gold_cosines": cosines}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
