"""Cost of banking states: a training step with the CentroidUpdater's capture hooks against one without.

A small Cluster-Former QA model trains on random pair encodings (forward, backward, AdamW step). Steps alternate in
blocks between hooks attached and detached, so drift of a shared machine hits both sides alike; the script reports
median step times and the overhead ratio, with and without per-forward subsampling. K-Means fits are not part of
the step (they run every epoch or every N steps; see bench_kmeans.py).

    python bench/bench_capture.py                 # default small model
    python bench/bench_capture.py --threads 1 --steps 10
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from hf_clusterformer import ClusterFormerConfig, ClusterFormerForQuestionAnswering
from hf_clusterformer.centroid_updates import CentroidUpdater
from hf_clusterformer.configuration_clusterformer import QUESTION_PREFIX_SPECIAL_TOKENS


def make_batch(batch: int, question: int, context: int, vocab: int, seed: int) -> dict[str, torch.Tensor]:
    """Pair encodings ``<s> Q </s></s> C </s>`` of equal length with answer spans: (B, T) tensors."""
    generator = torch.Generator().manual_seed(seed)
    tokens = torch.randint(4, vocab, (batch, question + context), generator=generator)
    bos, sep = torch.zeros(batch, 1, dtype=torch.long), torch.full((batch, 1), 2, dtype=torch.long)
    ids = torch.cat([bos, tokens[:, :question], sep, sep, tokens[:, question:], sep], dim=1)
    start = torch.randint(question + QUESTION_PREFIX_SPECIAL_TOKENS, ids.shape[1] - 2, (batch,), generator=generator)
    return {
        "input_ids": ids, "attention_mask": torch.ones_like(ids), "start_positions": start, "end_positions": start + 1
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--clusters", type=int, default=16)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--context", type=int, default=480)
    parser.add_argument("--steps", type=int, default=24, help="timed steps per side")
    parser.add_argument("--block", type=int, default=4, help="consecutive steps before switching sides")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    torch.manual_seed(0)
    config = ClusterFormerConfig(
        vocab_size=1000,
        hidden_size=args.hidden,
        num_hidden_layers=args.layers,
        num_attention_heads=max(1, args.hidden // 64),
        intermediate_size=4 * args.hidden,
        cluster_layers=[args.layers // 2, args.layers - 1],
        num_clusters=args.clusters,
        window_size=128,
        window_stride=112,
        max_question_length=16,
        max_position_embeddings=160,
    )
    device = torch.device(args.device)
    model = ClusterFormerForQuestionAnswering(config).to(device).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    batch = {k: v.to(device) for k, v in make_batch(args.batch, 12, args.context, 1000, 0).items()}

    def step() -> float:
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        loss = model(**batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - start

    print(
        f"device {device}, threads {torch.get_num_threads()}, hidden {args.hidden}, layers {args.layers} "
        f"(cluster layers {config.global_layers}), batch {args.batch} x {batch['input_ids'].shape[1]} tokens"
    )
    for label, cap in (("all states", None), ("subsample 256/forward", 256)):
        updater = CentroidUpdater(model, memory_size=100_000, max_capture_per_forward=cap)
        for _ in range(3):  # warm-up, also allocates the banks
            step()
        times: dict[bool, list[float]] = {True: [], False: []}
        hooked = True
        while min(len(v) for v in times.values()) < args.steps:
            (updater.attach if hooked else updater.detach)()
            for _ in range(args.block):
                times[hooked].append(step())
            hooked = not hooked
        captured = len(updater.banks[config.global_layers[0]])
        updater.close()
        with_hooks, without = statistics.median(times[True]), statistics.median(times[False])
        print(
            f"{label:>22}: step {without * 1e3:8.2f} ms without capture, {with_hooks * 1e3:8.2f} ms with "
            f"-> overhead {100 * (with_hooks / without - 1):+.2f}%  ({captured} states banked per layer)"
        )


if __name__ == "__main__":
    main()
