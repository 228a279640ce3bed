#!/usr/bin/env python
"""Cluster-Former vs the sliding-window model from a pretrained start, on questions whose answer needs another
window's fact.

Fine-tunes the pretrained all-MiniLM-L6-v2 (a 6-layer BERT, read out of its PyPI wheel and hash-checked, see
`hf_clusterformer.pretrained`) converted to Cluster-Former, and the same model with sliding-window layers only (plus
LSH and sparse layers in place of the cluster layer), with the same data, seeds and steps, in two stages:

1. *near*: ``twin`` questions whose two facts lie within one window, plus ``local`` questions;
2. *far*: ``twin`` questions whose two facts lie further apart than (layers x window), so that no stack of
   overlapping windows relays one to the other, plus ``local`` (and, in the gpu recipe, ``longrange``) questions.

It evaluates exact match on ``twin`` (one-hop, far), ``longrange`` (two-hop, far) and ``local`` (the control), and how
often the two mentions of the twin answer share a chunk in the cluster layer, and writes ``results.md``,
``results.json`` and ``results.png`` under ``--output_dir``. The recipes live in `clusterformer_research.experiment`:
``smoke`` (seconds, a tiny random BERT, for the test suite), ``demo`` (what ``make demo`` runs), ``cpu`` (under an
hour on 2 cores) and ``gpu`` (at most 8 minutes on one H100/H200; bf16 autocast, torch K-Means on the GPU). No network
is needed when the weights are cached (``--pretrained DIR``: a `fetch_pretrained` folder or a `pack_pretrained` copy).
"""

from __future__ import annotations

import argparse
import json

from clusterformer_research.experiment import PRESETS, VARIANTS, Stage, compare, make_preset
from hf_clusterformer.centroid_updates import CentroidUpdateSettings


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="cpu", choices=PRESETS)
    parser.add_argument("--output_dir", default="bench/results/reproduce")
    parser.add_argument("--pretrained", default=None, help="folder of the MiniLM files (default: the user cache)")
    parser.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    parser.add_argument("--seeds", type=int, nargs="+", default=None)
    parser.add_argument("--variants", nargs="+", default=None, choices=VARIANTS)
    parser.add_argument("--workers", type=int, default=None,
                        help="parallel runs on CPU (default: the cores, at most 2; 1 runs them in this process)")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch threads per run on CPU (default: cores / workers)")
    parser.add_argument("--time_budget", type=float, default=None, help="seconds; runs that would not fit are skipped")
    parser.add_argument("--overwrite", action="store_true", help="replace models saved in --output_dir before")
    parser.add_argument("--save_models", action="store_true", help="save each variant's first-seed model")
    parser.add_argument("--set", nargs="*", default=[], metavar="FIELD=JSON",
                        help="recipe overrides, e.g. num_clusters=32 'cluster_layers=[2]'")
    args = parser.parse_args(argv)

    preset = make_preset(args.preset)
    for item in args.set:
        key, equals, value = item.partition("=")
        if not equals:
            parser.error(f"--set {item}: give FIELD=JSON, e.g. cluster_lr_scale=10")
        if not hasattr(preset, key):
            parser.error(f"--set {item}: the recipe has no field {key!r}; use FIELD=JSON")
        try:
            value = json.loads(value)
            if key == "stages":
                value = [Stage(**stage) for stage in value]
            elif key == "centroids":
                value = CentroidUpdateSettings.build(preset.centroids, **value)
            setattr(preset, key, value)
        except (ValueError, TypeError) as error:
            parser.error(f"--set {item}: {error}; give the field's value as JSON")
    if args.seeds:
        preset.seeds = args.seeds
    if args.variants:
        preset.variants = args.variants
    return compare(preset, args.output_dir, name=args.preset, pretrained=args.pretrained, device=args.device,
                   workers=args.workers, threads=args.threads, time_budget=args.time_budget,
                   save_models=args.save_models, overwrite=args.overwrite)


if __name__ == "__main__":
    main()
