"""Encoder throughput and peak memory against its peers, in one process.

Peers on the same question + long context (random weights, base dims unless told otherwise):
  clusterformer  this model, sliding-window layers + 2 cluster layers
  floor          the same windows through plain RobertaModel as one batch (no merging, no clustering)
  longformer     LongformerModel, attention window 512, global attention on the question
  bigbird        BigBirdModel, block_sparse attention
  modernbert     ModernBertModel, 128-token local attention with a global layer every third layer

Prints tokens/s, seconds per forward (``--train``: also per training step, forward + backward of the summed output)
and peak memory (CUDA: max allocated; CPU: peak RSS growth sampled every 2 ms) and the ratios to the floor; a peer
that runs out of memory, or took longer than ``--max_seconds`` at a shorter length, is reported as such and skipped at
longer lengths. ``--json FILE`` also writes the rows. Usage: ``python bench/bench_encoder.py [--lengths 4096 8192]``.
"""

from __future__ import annotations

import argparse
import gc
import json
import threading
import time

import psutil
import torch
from transformers import (
    BigBirdConfig,
    BigBirdModel,
    LongformerConfig,
    LongformerModel,
    ModernBertConfig,
    ModernBertModel,
    RobertaConfig,
    RobertaModel,
)

from hf_clusterformer import ClusterFormerConfig, ClusterFormerModel
from hf_clusterformer.configuration_clusterformer import QUESTION_PREFIX_SPECIAL_TOKENS
from hf_clusterformer.modeling_clusterformer import count_windows


class PeakMemory:
    """Peak memory of a block: CUDA max allocated, or CPU resident-set growth sampled in a thread."""

    def __init__(self, device: torch.device):
        self.device = device
        self.peak = 0

    def __enter__(self):
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
            self.base = torch.cuda.memory_allocated()
        else:
            self.process = psutil.Process()
            self.base = self.process.memory_info().rss
            self.running = True
            self.thread = threading.Thread(target=self._sample, daemon=True)
            self.thread.start()
        return self

    def _sample(self):
        while self.running:
            self.peak = max(self.peak, self.process.memory_info().rss - self.base)
            time.sleep(0.002)

    def __exit__(self, *exc):
        if self.device.type == "cuda":
            torch.cuda.synchronize()
            self.peak = torch.cuda.max_memory_allocated() - self.base
        else:
            self.running = False
            self.thread.join()


def timed(fn, device: torch.device, repeats: int, train: bool = False) -> tuple[float, int]:
    """Median seconds of ``fn()`` after one warm-up, and peak memory of one call in bytes.

    With ``train`` the call is a training step: forward, then backward of the summed last hidden state.
    """
    if train:
        forward = fn

        def fn():
            forward().last_hidden_state.float().sum().backward()

    with torch.inference_mode(not train):
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        with PeakMemory(device) as memory:
            fn()
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            fn()
            if device.type == "cuda":
                torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
    times.sort()
    return times[len(times) // 2], memory.peak


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", type=int, nargs="+", default=[4096, 8192, 16384])
    parser.add_argument("--hidden", type=int, default=768)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--question", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--peers", nargs="+", default=["clusterformer", "floor", "longformer", "bigbird", "modernbert"])
    parser.add_argument("--dtype", default=None, help="float32 or bfloat16 (default: bf16 on CUDA, fp32 on CPU)")
    parser.add_argument("--train", action="store_true", help="also time a training step (forward + backward)")
    parser.add_argument("--max_seconds", type=float, default=20.0, help="skip a peer at longer lengths once a call took this long")
    parser.add_argument("--json", default=None, help="also write the rows to this file")
    args = parser.parse_args()

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = getattr(torch, args.dtype) if args.dtype else (torch.bfloat16 if device.type == "cuda" else torch.float32)
    torch.manual_seed(0)
    common = dict(
        hidden_size=args.hidden,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        intermediate_size=4 * args.hidden,
        vocab_size=50265,
    )
    config = ClusterFormerConfig(**common, max_position_embeddings=514)  # 2 cluster layers by default
    models = {}
    if "clusterformer" in args.peers:
        models["clusterformer"] = ClusterFormerModel(config)
    if "floor" in args.peers:
        models["floor"] = RobertaModel(RobertaConfig(**common, max_position_embeddings=514))
    if "longformer" in args.peers:
        models["longformer"] = LongformerModel(
            LongformerConfig(**common, attention_window=512, max_position_embeddings=max(args.lengths) + 2)
        )
    if "bigbird" in args.peers:
        models["bigbird"] = BigBirdModel(
            BigBirdConfig(**common, attention_type="block_sparse", block_size=64, num_random_blocks=3,
                          max_position_embeddings=max(args.lengths))
        )
    if "modernbert" in args.peers:
        models["modernbert"] = ModernBertModel(
            ModernBertConfig(**common, pad_token_id=1, bos_token_id=0, eos_token_id=2, cls_token_id=0, sep_token_id=2,
                             max_position_embeddings=max(args.lengths) + 2)
        )
    for model in models.values():
        model.to(device=device, dtype=dtype).eval()

    print(f"device={device} dtype={dtype} hidden={args.hidden} layers={args.layers} cluster_layers={config.cluster_layers}")
    header = f"{'tokens':>7} {'model':>14} {'mode':>7} {'seconds':>9} {'tokens/s':>10} {'peak MiB':>9} {'time/floor':>10} {'mem/floor':>9}"
    print(header)
    rows: list[dict] = []
    skipped: dict[tuple[str, str], str] = {}
    for length in args.lengths:
        question = torch.randint(4, 50000, (args.question,))
        context = torch.randint(4, 50000, (length - args.question - 4,))
        ids = torch.cat([torch.tensor([0]), question, torch.tensor([2, 2]), context, torch.tensor([2])]).unsqueeze(0).to(device)
        prefix = args.question + QUESTION_PREFIX_SPECIAL_TOKENS
        windows = count_windows(ids.shape[1] - prefix, config.window_size, config.window_stride)
        starts = torch.arange(windows) * config.window_stride
        floor_ids = torch.full((windows, prefix + config.window_size), 1, dtype=torch.long)
        for k, start in enumerate(starts.tolist()):
            piece = ids[0, prefix + start : prefix + start + config.window_size].cpu()
            floor_ids[k, :prefix] = ids[0, :prefix].cpu()
            floor_ids[k, prefix : prefix + piece.shape[0]] = piece
        floor_ids = floor_ids.to(device)
        global_mask = torch.zeros_like(ids)
        global_mask[:, :prefix] = 1
        runs = {
            "clusterformer": lambda: models["clusterformer"](ids),
            "floor": lambda: models["floor"](floor_ids, attention_mask=floor_ids.ne(1).long()),
            "longformer": lambda: models["longformer"](ids, global_attention_mask=global_mask),
            "bigbird": lambda: models["bigbird"](ids),
        }
        runs["modernbert"] = lambda: models["modernbert"](ids)
        for mode in ("forward", "train") if args.train else ("forward",):
            results = {}
            for name in models:
                if (name, mode) in skipped:
                    print(f"{length:>7} {name:>14} {mode:>7} skipped: {skipped[name, mode]}")
                    continue
                try:
                    results[name] = timed(runs[name], device, args.repeats, train=mode == "train")
                except torch.OutOfMemoryError:
                    skipped[name, mode] = f"out of memory at {length} tokens"
                    print(f"{length:>7} {name:>14} {mode:>7} out of memory")
                    rows.append({"tokens": length, "model": name, "mode": mode, "status": "out of memory"})
                    gc.collect()
                    torch.cuda.empty_cache() if device.type == "cuda" else None
                    continue
                if results[name][0] > args.max_seconds:
                    skipped[name, mode] = f"{results[name][0]:.1f} s at {length} tokens"
            floor = results.get("floor")
            for name, (seconds, peak) in results.items():
                ratio = f"{seconds / floor[0]:10.2f}" if floor else f"{'-':>10}"
                mem = f"{peak / max(floor[1], 1):9.2f}" if floor else f"{'-':>9}"
                print(f"{length:>7} {name:>14} {mode:>7} {seconds:9.4f} {length / seconds:10.0f} {peak / 2**20:9.0f} {ratio} {mem}", flush=True)
                rows.append({"tokens": length, "model": name, "mode": mode, "seconds": seconds, "tokens_per_s": length / seconds,
                             "peak_mib": peak / 2**20, "time_vs_floor": seconds / floor[0] if floor else None,
                             "memory_vs_floor": peak / max(floor[1], 1) if floor else None})
            for peer in ("longformer", "bigbird", "modernbert"):
                if peer in results and "clusterformer" in results:
                    speedup = results[peer][0] / results["clusterformer"][0]
                    print(f"{length:>7} {mode}: clusterformer is {speedup:.2f}x {peer}'s tokens/s")
        if args.json:  # after every length, so that a run cut short keeps what it measured
            meta = {"device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu", "dtype": str(dtype),
                    "hidden": args.hidden, "layers": args.layers, "cluster_layers": config.cluster_layers,
                    "torch": torch.__version__}
            with open(args.json, "w") as handle:
                json.dump({"meta": meta, "rows": rows}, handle, indent=1)


if __name__ == "__main__":
    main()
