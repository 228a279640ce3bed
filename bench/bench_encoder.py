"""Encoder speed, model FLOPs utilisation and peak memory against its peers, in one process, models interleaved.

Peers on the same question + long context (random weights, base dims unless told otherwise):
  clusterformer  this model, sliding-window layers + 2 cluster layers
  floor          the same windows through plain RobertaModel as one batch (no merging, no clustering)
  sliding        this model with sliding-window layers only (no global layer)
  window_cluster this model with window_cluster layers where clusterformer has its cluster layers (a sliding layer
                 plus a cluster layer's attention, added through the routed projection)
  longformer     LongformerModel, attention window 512, global attention on the question
  bigbird        BigBirdModel, block_sparse attention
  modernbert     ModernBertModel, 128-token local attention with a global layer every third layer
``--compile`` adds ``clusterformer+compile`` and ``floor+compile`` (torch.compile, ``--compile_mode``). With
``sliding`` and ``window_cluster`` among the peers, every length and mode ends with the layer kinds' time ratios:
window_cluster / cluster, window_cluster / sliding and cluster / sliding (``--route_by`` sets what the routers of
clusterformer and window_cluster compare with their centroids).

Timing: every model is warmed up (``--warmup`` calls, compilation included), then the models run in turn, one call
each, ``--repeats`` rounds (20 by default; fewer on CPU), the order rotating every round so that drift of a shared
machine hits all alike. CUDA calls are timed with CUDA events after a synchronisation, CPU calls with
``time.perf_counter``. Printed: the median, the interquartile range (q1-q3) and min/max of the rounds, tokens/s of
the median, MFU, peak memory of one more call (CUDA: max allocated; CPU: peak RSS growth sampled every 2 ms) and the
ratios of medians to the floor. ``--train`` also times a training step (forward + backward of the summed output).

MFU (GPU only) = model FLOPs / median seconds / the GPU's dense bf16 peak (`PEAK_TFLOPS`, or ``--peak_tflops``).
Model FLOPs of a forward, summed over the layers and over the attention segments (windows, chunks) each layer runs,
counting every real slot a layer processes (question copies in every window and overlapping context copies
included; padding slots not), embeddings and heads left out:
    segment of n real slots, each attending to k keys:  n * (8 d^2 + 4 d I) + 4 n k d    (I = intermediate size;
    ModernBERT's gated MLP: 8 d^2 + 6 d I); a training step counts 3x the forward.
Cluster-Former and the floor: sliding layers run windows of n = p + (context slice) slots with k = n; a cluster layer
runs ceil(R / m) chunks holding R = K p + c routed slots, k = the chunk's real slots; a window_cluster layer runs
the sliding layer's windows plus, per chunk of n routed slots, its Q/K/V (6 n d^2) and attention (4 n^2 d), and the
routed projection on every window slot (2 d^2 each); ``route_by`` keys adds 2 d^2 per routed slot. Longformer:
k = 513 + g local and global keys per token, the g global tokens k = T; BigBird: k = 8 blocks of 64, the first and
last block k = T; ModernBERT: k = 129 in local layers and T in global ones. At base size (d 768, I 3072) that is
~15 MFLOP per slot per layer, ~180 MFLOP per slot for 12 layers.

``--profile`` then runs torch.profiler (CPU and, on CUDA, GPU activities) over ``--profile_steps`` forwards of
Cluster-Former and of the floor at every length and prints where the time goes, Cluster-Former beside the floor:
the layers, embeddings, input location and window layout, attention masks, the overlap merge / re-split, centroid
(or LSH) assignment, the sort, gathers into chunks and scatters back, chunk padding, the token-aligned output,
other operators, and Python / launch overhead (wall time not spent in operators, on CUDA wall time with no kernel
running).

``--json FILE`` also writes the rows (every round's seconds included). Usage:
``python bench/bench_encoder.py [--lengths 4096 8192] [--train] [--compile] [--profile] [--repeats 20]``.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import gc
import json
import math
import statistics
import threading
import time

import psutil
import torch
import torch.nn.functional as F
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
from transformers.models.roberta.modeling_roberta import RobertaEmbeddings, RobertaLayer

from hf_clusterformer import ClusterFormerConfig, ClusterFormerModel
from hf_clusterformer import modeling_clusterformer as modeling
from hf_clusterformer.configuration_clusterformer import QUESTION_PREFIX_SPECIAL_TOKENS
from hf_clusterformer.modeling_clusterformer import count_windows

#: Dense (no sparsity) bf16 tensor-core peaks in TFLOP/s by a piece of the CUDA device name, most specific first.
PEAK_TFLOPS = [
    ("H100 NVL", 835.0),
    ("H100 PCIe", 756.0),
    ("H100", 989.4),  # SXM (e.g. "NVIDIA H100 80GB HBM3")
    ("H200", 989.4),
    ("H800", 989.4),
    ("GH200", 989.4),
    ("B200", 2250.0),
    ("A100", 312.0),
    ("A800", 312.0),
    ("L40S", 362.0),
    ("L40", 181.0),
    ("L4", 121.0),
    ("A10G", 70.0),
    ("A10", 125.0),
    ("RTX 4090", 165.2),
]


def peak_tflops(device: torch.device, override: float | None) -> float | None:
    """The dense bf16 peak of a CUDA device from `PEAK_TFLOPS` (or ``override``); None on CPU or when unknown."""
    if override:
        return override
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((peak for key, peak in PEAK_TFLOPS if key in name), None)


# ----------------------------------------------------------------------------------------------------------------
# Model FLOPs
# ----------------------------------------------------------------------------------------------------------------


def segment_flops(slots: float, keys: float, hidden: int, intermediate: int, gated: bool = False) -> float:
    """Forward FLOPs of one layer over ``slots`` real slots attending to ``keys`` keys each (see the module doc)."""
    return slots * (8 * hidden**2 + (6 if gated else 4) * hidden * intermediate) + 4 * slots * keys * hidden


def window_lengths(prefix: int, context: int, size: int, stride: int) -> list[int]:
    """Real slots of each sliding window: the prefix plus its slice of the context."""
    return [prefix + min(size, context - k * stride) for k in range(count_windows(context, size, stride))]


def clusterformer_flops(config: ClusterFormerConfig, prefix: int, context: int, floor: bool = False) -> float:
    """Forward model FLOPs of Cluster-Former (or, with ``floor``, of its windows through every layer) on one example.

    ``context`` counts every token after the question prefix (the closing separator included), as the layout does.
    """
    d, inter = config.hidden_size, config.intermediate_size
    windows = window_lengths(prefix, context, config.window_size, config.window_stride)
    sliding = sum(segment_flops(n, n, d, inter) for n in windows)
    m = config.window_stride
    routed = context + (0 if config.chunk_question_prefix else prefix * len(windows))
    chunks = [min(m, routed - j * m) for j in range(math.ceil(routed / m))]
    keys = 2 * d**2 * routed if config.route_by == "keys" else 0  # the routers' key projections
    total = 0.0
    for layer_type in config.layer_kinds:
        if floor or layer_type == "sliding":
            total += sliding
        elif layer_type in ("cluster", "lsh"):
            extra = prefix if config.chunk_question_prefix else 0
            total += keys + sum(segment_flops(n + extra, n + extra, d, inter) for n in chunks)
        elif layer_type == "window_cluster":  # the window's layer, the chunks' attention and the routed projection
            total += sliding + keys + sum(6 * n * d**2 + 4 * n * n * d for n in chunks) + 2 * d**2 * sum(windows)
        else:  # sparse: every in-window slot attends across the windows
            total += segment_flops(sum(windows), len(windows), d, inter)
    return total


def peer_flops(name: str, tokens: int, question_tokens: int, hidden: int, intermediate: int, layers: int) -> float:
    """Forward model FLOPs of Longformer, BigBird or ModernBERT over ``tokens`` tokens (see the module doc)."""
    if name == "longformer":
        per_layer = segment_flops(tokens - question_tokens, 513 + question_tokens, hidden, intermediate)
        per_layer += segment_flops(question_tokens, tokens, hidden, intermediate)
        return layers * per_layer
    if name == "bigbird":
        block = 64
        per_layer = segment_flops(tokens - 2 * block, 8 * block, hidden, intermediate)
        per_layer += segment_flops(2 * block, tokens, hidden, intermediate)
        return layers * per_layer
    if name == "modernbert":
        global_layers = math.ceil(layers / 3)
        return (global_layers * segment_flops(tokens, tokens, hidden, intermediate, gated=True)
                + (layers - global_layers) * segment_flops(tokens, 129, hidden, intermediate, gated=True))
    raise ValueError(name)


# ----------------------------------------------------------------------------------------------------------------
# Timing
# ----------------------------------------------------------------------------------------------------------------


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


def time_call(fn, device: torch.device) -> float:
    """Seconds of one call: CUDA events around it after a synchronisation, or ``time.perf_counter`` on CPU."""
    if device.type == "cuda":
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1000
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def step_function(model, call, train: bool):
    """The timed call: a forward, or a training step (forward, then backward of the summed last hidden state)."""
    if not train:
        return call

    def step():
        model.zero_grad(set_to_none=True)
        call().last_hidden_state.float().sum().backward()

    return step


def summary(times: list[float]) -> dict:
    """Median, quartiles, min and max of a list of seconds."""
    ordered = sorted(times)
    q1, median, q3 = statistics.quantiles(ordered, n=4, method="inclusive") if len(ordered) > 1 else ordered * 3
    return {"seconds": median, "q1": q1, "q3": q3, "min": ordered[0], "max": ordered[-1], "repeats": len(ordered)}


def run_interleaved(steps: dict, device: torch.device, warmup: int, repeats: int) -> tuple[dict, dict]:
    """Warm every step up, then time them in rotating turns; a step that runs out of memory is dropped.

    Returns ({name: [seconds per round]}, {name: reason} of the dropped ones).
    """
    dropped = {}
    for name, fn in list(steps.items()):
        try:
            for _ in range(warmup):
                fn()
            if device.type == "cuda":
                torch.cuda.synchronize()
        except torch.OutOfMemoryError:
            dropped[name] = "out of memory"
            del steps[name]
            gc.collect()
            torch.cuda.empty_cache() if device.type == "cuda" else None
    names = list(steps)
    times = {name: [] for name in names}
    for round_index in range(repeats):
        shift = round_index % max(1, len(names))
        for name in names[shift:] + names[:shift]:
            if name in dropped:
                continue
            try:
                times[name].append(time_call(steps[name], device))
            except torch.OutOfMemoryError:
                dropped[name] = "out of memory"
                times.pop(name)
                gc.collect()
                torch.cuda.empty_cache() if device.type == "cuda" else None
    return times, dropped


# ----------------------------------------------------------------------------------------------------------------
# Profile
# ----------------------------------------------------------------------------------------------------------------

#: Functions timed by name in --profile: (owner, attribute, label); those a version of the model lacks are left out.
PROFILED = [
    (RobertaLayer, "forward", "layers (attention + feed-forward)"),
    (modeling.ClusterFormerLayer, "forward", "layers (attention + feed-forward)"),
    (RobertaEmbeddings, "forward", "embeddings"),
    (modeling.ClusterFormerModel, "_locate_inputs", "locate inputs (lengths read back)"),
    (modeling, "build_window_layout", "window layout"),
    (modeling, "bidirectional_mask", "attention masks"),
    (modeling.LayerMasks, "share", "overlap merge / re-split"),
    (modeling, "share_context_states", "overlap merge / re-split"),
    (modeling.ClusterRouter, "forward", "centroid assignment"),
    (modeling.LSHRouter, "forward", "centroid assignment"),
    (modeling, "sort_into_chunks", "sort into chunks"),
    (modeling, "unsort_from_chunks", "unsort from chunks"),
    (modeling, "windows_to_tokens", "token-aligned output"),
]
#: Operators inside the sort/unsort ranges, by what they do.
SPLIT_OPS = {"aten::sort": "sort", "aten::gather": "gathers / scatters", "aten::scatter": "gathers / scatters",
             "aten::constant_pad_nd": "chunk padding", "aten::pad": "chunk padding"}
ROWS = ["layers (attention + feed-forward)", "embeddings", "locate inputs (lengths read back)", "window layout",
        "attention masks", "overlap merge / re-split", "centroid assignment", "sort", "gathers / scatters",
        "chunk padding", "token-aligned output", "other operators", "Python / launch overhead"]


@contextlib.contextmanager
def labelled_functions():
    """Wrap the `PROFILED` functions in ``torch.profiler.record_function`` ranges for the duration of the block."""
    originals = []
    for owner, attribute, label in PROFILED:
        original = vars(owner).get(attribute)
        if original is None:
            continue

        def wrapped(*args, __original=original, __label=label, **kwargs):
            with torch.profiler.record_function(f"cf::{__label}"):
                return __original(*args, **kwargs)

        functools.update_wrapper(wrapped, original)
        originals.append((owner, attribute, original))
        setattr(owner, attribute, wrapped)
    try:
        yield
    finally:
        for owner, attribute, original in reversed(originals):
            setattr(owner, attribute, original)


def breakdown(fn, device: torch.device, steps: int) -> dict[str, dict[str, float]]:
    """Milliseconds per call by `ROWS` entry: {"cpu": ..., "gpu": ...} (GPU: kernel time; CPU: operator time).

    A labelled range counts in full (CPU: its wall time, Python inside it included), labelled ranges inside it
    included; the sort/unsort ranges are split by operator (`SPLIT_OPS`), the rest of them counts as gathers /
    scatters.
    "other operators" are top-level operators in no range. "Python / launch overhead" is the rest of the wall time:
    on CPU, time outside every range and operator; on CUDA, wall time with no kernel running.
    """
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with labelled_functions():
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        with torch.profiler.profile(activities=activities) as prof:
            walls = [time_call(fn, device) for _ in range(steps)]
    events = prof.events()
    cpu = dict.fromkeys(ROWS, 0.0)
    gpu = dict.fromkeys(ROWS, 0.0)

    def gpu_time(event):
        return event.device_time_total if device.type == "cuda" else 0.0

    def add(row, cpu_us, gpu_us):
        cpu[row] += cpu_us
        gpu[row] += gpu_us

    def inside(event, prefixes):
        """``event`` lies inside a range whose name starts with one of ``prefixes``."""
        parent = event.cpu_parent
        while parent is not None:
            if parent.name.startswith(prefixes):
                return True
            parent = parent.cpu_parent
        return False

    for event in events:
        if event.name.startswith("cf::") and not inside(event, "cf::"):
            label = event.name[4:]
            cpu_us, gpu_us = event.cpu_time_total, gpu_time(event)
            if label in ("sort into chunks", "unsort from chunks"):
                for child in event.cpu_children:
                    row = SPLIT_OPS.get(child.name)
                    if row is not None and not child.name.startswith("cf::"):
                        add(row, child.cpu_time_total, gpu_time(child))
                        cpu_us -= child.cpu_time_total
                        gpu_us -= gpu_time(child)
                add("gathers / scatters", cpu_us, gpu_us)
            else:
                add(label, cpu_us, gpu_us)
        elif event.name.startswith("aten::") and not inside(event, ("cf::", "aten::")):
            add("other operators", event.cpu_time_total, gpu_time(event))
    wall_us = sum(walls) * 1e6
    cpu["Python / launch overhead"] = wall_us - sum(cpu.values())
    gpu["Python / launch overhead"] = wall_us - sum(gpu.values()) if device.type == "cuda" else 0.0
    scale = 1e-3 / steps
    return {"wall_ms": wall_us * scale, "cpu": {k: v * scale for k, v in cpu.items()},
            "gpu": {k: v * scale for k, v in gpu.items()}}


def print_breakdown(length: int, results: dict[str, dict], device: torch.device) -> None:
    """Cluster-Former beside the floor, ms per forward, by row; the difference is where the time above the floor
    goes."""
    kind = "gpu" if device.type == "cuda" else "cpu"
    what = "GPU kernel ms" if kind == "gpu" else "CPU ms"
    cf, floor = results.get("clusterformer"), results.get("floor")
    print(f"\nprofile at {length} tokens, {what} per forward:")
    print(f"  {'':<36} {'clusterformer':>14} {'floor':>10} {'difference':>11}"
          + (f" {'CF CPU ms':>10}" if kind == "gpu" else ""))
    print(f"  {'wall':<36} {cf['wall_ms']:14.2f} {floor['wall_ms']:10.2f} {cf['wall_ms'] - floor['wall_ms']:11.2f}")
    for row in ROWS:
        a, b = cf[kind][row], floor[kind][row]
        extra = f" {cf['cpu'][row]:10.2f}" if kind == "gpu" else ""
        print(f"  {row:<36} {a:14.2f} {b:10.2f} {a - b:11.2f}{extra}")


# ----------------------------------------------------------------------------------------------------------------
# Main
# ----------------------------------------------------------------------------------------------------------------


#: The layer kinds' peers (`main`'s configs) and their names in the ratios: cluster layers, window_cluster layers at
#: the same indices, sliding-window layers only.
KIND_PEERS = {"clusterformer": "cluster", "window_cluster": "window_cluster", "sliding": "sliding"}


def layer_kind_ratios(stats: dict[str, dict]) -> dict[str, float]:
    """Median time ratios of the layer kinds' peers (`KIND_PEERS`), for the pairs of them that both ran:
    ``window_cluster/cluster``, ``window_cluster/sliding`` and ``cluster/sliding``."""
    pairs = [("window_cluster", "clusterformer"), ("window_cluster", "sliding"), ("clusterformer", "sliding")]
    return {f"{KIND_PEERS[a]}/{KIND_PEERS[b]}": stats[a]["seconds"] / stats[b]["seconds"]
            for a, b in pairs if a in stats and b in stats}


def build_inputs(length: int, question: int, config: ClusterFormerConfig, device: torch.device):
    """A pair encoding of ``length`` tokens (B = 1) and the floor's windows of it: (1, T) and (K, S) ids."""
    generator = torch.Generator().manual_seed(length)
    q = torch.randint(4, 50000, (question,), generator=generator)
    context = torch.randint(4, 50000, (length - question - 4,), generator=generator)
    ids = torch.cat([torch.tensor([0]), q, torch.tensor([2, 2]), context, torch.tensor([2])]).unsqueeze(0)
    prefix = question + QUESTION_PREFIX_SPECIAL_TOKENS
    windows = count_windows(ids.shape[1] - prefix, config.window_size, config.window_stride)
    index = torch.arange(windows).unsqueeze(1) * config.window_stride + torch.arange(config.window_size) + prefix
    pieces = F.pad(ids[0], (0, config.window_size), value=1)[index]  # (K, l), padded past the end
    floor_ids = torch.cat([ids[0, :prefix].expand(windows, -1), pieces], dim=1)
    return ids.to(device), floor_ids.to(device), prefix


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", type=int, nargs="+", default=[4096, 8192, 16384])
    parser.add_argument("--hidden", type=int, default=768)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--question", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=20, help="timed rounds (at least 20 on a GPU; fewer on CPU)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed calls of every model first")
    parser.add_argument("--peers", nargs="+",
                        default=["clusterformer", "floor", "longformer", "bigbird", "modernbert"],
                        choices=["clusterformer", "floor", "sliding", "window_cluster", "longformer", "bigbird",
                                 "modernbert"])
    parser.add_argument("--route_by", choices=["states", "keys"], default="states",
                        help="what the routers of clusterformer and window_cluster compare with their centroids")
    parser.add_argument("--dtype", default=None, help="float32 or bfloat16 (default: bf16 on CUDA, fp32 on CPU)")
    parser.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads on CPU (default: torch's)")
    parser.add_argument("--train", action="store_true", help="also time a training step (forward + backward)")
    parser.add_argument("--no_forward", action="store_true", help="time only the training step")
    parser.add_argument("--compile", action="store_true", help="also time torch.compile'd Cluster-Former and floor")
    parser.add_argument("--compile_mode", default=None, help="torch.compile mode, e.g. reduce-overhead (CUDA graphs)")
    parser.add_argument("--profile", action="store_true", help="print where the time goes (torch.profiler)")
    parser.add_argument("--profile_steps", type=int, default=5)
    parser.add_argument("--peak_tflops", type=float, default=None,
                        help="dense bf16 peak for MFU (default: by GPU name)")
    parser.add_argument("--max_seconds", type=float, default=20.0,
                        help="skip a peer at longer lengths once a call took this long")
    parser.add_argument("--json", default=None, help="also write the rows to this file")
    args = parser.parse_args()

    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if args.threads:
        torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype) if args.dtype else (torch.bfloat16 if device.type == "cuda" else torch.float32)
    peak = peak_tflops(device, args.peak_tflops)
    torch.manual_seed(0)
    common = dict(hidden_size=args.hidden, num_hidden_layers=args.layers, num_attention_heads=args.heads,
                  intermediate_size=4 * args.hidden, vocab_size=50265)
    config = ClusterFormerConfig(**common, max_position_embeddings=514, route_by=args.route_by)  # 2 cluster layers
    configs = {  # the peers of this model, by layer kinds: cluster layers, sliding only, window_cluster layers
        "clusterformer": config,
        "sliding": ClusterFormerConfig(**common, max_position_embeddings=514, cluster_layers=[]),
        "window_cluster": ClusterFormerConfig(**common, max_position_embeddings=514, route_by=args.route_by,
                                              cluster_layers=config.global_layers, global_layer_type="window_cluster"),
    }
    models = {}
    for name, kind_config in configs.items():
        if name in args.peers:
            models[name] = ClusterFormerModel(kind_config)
            for router in models[name].cluster_routers().values():
                router.fitted.fill_(True)  # random centroids, marked fitted: no warning, the same work
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
    if args.compile:
        torch._dynamo.config.cache_size_limit = max(64, torch._dynamo.config.cache_size_limit)
        for name in ("clusterformer", "floor"):
            if name in models:  # static shapes: every length compiles once
                models[f"{name}+compile"] = torch.compile(models[name], mode=args.compile_mode, dynamic=False)

    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(f"device={device_name} dtype={dtype} hidden={args.hidden} layers={args.layers} "
          f"cluster_layers={config.global_layers} "
          f"route_by={args.route_by} threads={torch.get_num_threads()} torch={torch.__version__} "
          f"repeats={args.repeats} warmup={args.warmup}"
          + (f" peak={peak} TFLOP/s" if peak else ""))
    header = (f"{'tokens':>7} {'model':>21} {'mode':>7} {'median s':>9} {'q1-q3 s':>17} {'min-max s':>17} "
              f"{'tokens/s':>10} {'MFU':>6} {'peak MiB':>9} {'time/floor':>10} {'mem/floor':>9}")
    print(header)
    rows: list[dict] = []
    ratios: list[dict] = []
    profiles: dict[int, dict] = {}
    skipped: dict[tuple[str, str], str] = {}
    modes = (["forward"] if not args.no_forward else []) + (["train"] if args.train else [])
    for length in args.lengths:
        ids, floor_ids, prefix = build_inputs(length, args.question, config, device)
        context = ids.shape[1] - prefix
        floor_mask = floor_ids.ne(1).long()
        global_mask = torch.zeros_like(ids)
        global_mask[:, :prefix] = 1
        # B023 (a loop variable in a closure) is fine here: these calls run within this length's iteration, never after
        calls = {
            "clusterformer": lambda m: m(ids),  # noqa: B023
            "sliding": lambda m: m(ids),  # noqa: B023
            "window_cluster": lambda m: m(ids),  # noqa: B023
            "floor": lambda m: m(floor_ids, attention_mask=floor_mask),  # noqa: B023
            "longformer": lambda m: m(ids, global_attention_mask=global_mask),  # noqa: B023
            "bigbird": lambda m: m(ids),  # noqa: B023
            "modernbert": lambda m: m(ids),  # noqa: B023
        }
        flops = {name: clusterformer_flops(kind_config, prefix, context) for name, kind_config in configs.items()}
        flops["floor"] = clusterformer_flops(config, prefix, context, floor=True)
        for peer in ("longformer", "bigbird", "modernbert"):
            flops[peer] = peer_flops(peer, length, prefix, args.hidden, 4 * args.hidden, args.layers)
        for mode in modes:
            train = mode == "train"
            steps = {}
            for name, model in models.items():
                if (name, mode) in skipped:
                    print(f"{length:>7} {name:>21} {mode:>7} skipped: {skipped[name, mode]}")
                    continue
                base = name.split("+")[0]
                model.train(train)
                call = functools.partial(calls[base], model)
                steps[name] = step_function(model, call, train)
            with torch.inference_mode(not train):
                times, dropped = run_interleaved(steps, device, args.warmup, args.repeats)
                memory = {}
                for name in times:
                    with PeakMemory(device) as peak_memory:
                        steps[name]()
                    memory[name] = peak_memory.peak
            for name, reason in dropped.items():
                skipped[name, mode] = f"{reason} at {length} tokens"
                print(f"{length:>7} {name:>21} {mode:>7} {reason}")
                rows.append({"tokens": length, "model": name, "mode": mode, "status": reason})
            stats = {name: summary(t) for name, t in times.items()}
            for name, row in stats.items():
                if row["seconds"] > args.max_seconds:
                    skipped[name, mode] = f"{row['seconds']:.1f} s at {length} tokens"
                base = name.split("+")[0]
                model_flops = flops[base] * (3 if train else 1)
                mfu = model_flops / row["seconds"] / (peak * 1e12) if peak else None
                compiled = name.endswith("+compile") and "floor+compile" in stats
                reference = stats.get("floor+compile" if compiled else "floor")
                ratio = row["seconds"] / reference["seconds"] if reference else None
                floor_memory = memory.get("floor", 0)
                mem_ratio = memory[name] / floor_memory if floor_memory >= 2**20 else None  # not below 1 MiB
                print(f"{length:>7} {name:>21} {mode:>7} {row['seconds']:9.4f} {row['q1']:8.4f}-{row['q3']:<8.4f} "
                      f"{row['min']:8.4f}-{row['max']:<8.4f} {length / row['seconds']:10.0f} "
                      f"{f'{100 * mfu:5.1f}%' if mfu is not None else '-':>6} {memory[name] / 2**20:9.0f} "
                      f"{f'{ratio:10.3f}' if ratio else '-':>10} {f'{mem_ratio:9.2f}' if mem_ratio else '-':>9}",
                      flush=True)
                rows.append({"tokens": length, "model": name, "mode": mode, **row,
                             "tokens_per_s": length / row["seconds"], "model_flops": model_flops, "mfu": mfu,
                             "peak_mib": memory[name] / 2**20,
                             "time_vs_floor": ratio, "memory_vs_floor": mem_ratio, "times": times[name]})
            for peer in ("longformer", "bigbird", "modernbert"):
                if peer in stats and "clusterformer" in stats:
                    speedup = stats[peer]["seconds"] / stats["clusterformer"]["seconds"]
                    print(f"{length:>7} {mode}: clusterformer is {speedup:.2f}x {peer}'s tokens/s")
            if "clusterformer+compile" in stats and "clusterformer" in stats:
                gain = stats["clusterformer"]["seconds"] / stats["clusterformer+compile"]["seconds"]
                print(f"{length:>7} {mode}: compiled clusterformer is {gain:.2f}x eager")
            kind_ratios = layer_kind_ratios(stats)
            if kind_ratios:
                print(f"{length:>7} {mode}: time ratios of layer kinds: "
                      + ", ".join(f"{pair} {value:.3f}" for pair, value in kind_ratios.items()), flush=True)
                ratios.append({"tokens": length, "mode": mode, **kind_ratios})
        if args.profile and "clusterformer" in models and "floor" in models:
            with torch.inference_mode():
                results = {}
                for name in ("clusterformer", "floor"):
                    models[name].eval()
                    results[name] = breakdown(functools.partial(calls[name], models[name]), device, args.profile_steps)
            print_breakdown(length, results, device)
            profiles[length] = results
        if args.json:  # after every length, so that a run cut short keeps what it measured
            meta = {"device": device_name, "dtype": str(dtype), "hidden": args.hidden, "layers": args.layers,
                    "cluster_layers": config.global_layers, "torch": torch.__version__, "repeats": args.repeats,
                    "warmup": args.warmup, "threads": torch.get_num_threads(), "peak_tflops": peak,
                    "compile_mode": args.compile_mode if args.compile else None, "route_by": args.route_by}
            with open(args.json, "w") as handle:
                json.dump({"meta": meta, "rows": rows, "kind_ratios": ratios, "profile": profiles}, handle, indent=1)


if __name__ == "__main__":
    main()
