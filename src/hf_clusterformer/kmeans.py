"""Spherical K-Means for Cluster-Former centroids (paper §3.2): backends, collectives, statistics.

`spherical_kmeans` clusters unit rows by cosine with a torch backend (any device, optionally distributed Lloyd over
a process group), a faiss CPU backend or a faiss GPU backend, then applies the paper's GetCentroids ordering.
`hf_clusterformer.centroid_updates` feeds it from memory banks during training.
"""

from __future__ import annotations

import math
import time
import warnings
from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from .modeling_clusterformer import order_centroids_greedy

__all__ = ["spherical_kmeans"]

#: Backend names accepted by `spherical_kmeans` (besides ``"auto"``).
BACKENDS = ("torch", "faiss-cpu", "faiss-gpu")

# Rows of states per (rows x k) similarity block in the torch backend: 2**24 floats = 64 MiB.
_BLOCK_ELEMENTS = 1 << 24


class NotEnoughStatesError(ValueError):
    """Raised when K-Means gets fewer usable states than clusters."""


# ----------------------------------------------------------------------------------------------------------------
# Backends
# ----------------------------------------------------------------------------------------------------------------


def faiss_available() -> bool:
    """Whether faiss (CPU or GPU build) is importable."""
    try:
        import faiss  # noqa: F401
    except ImportError:
        return False
    return True


def faiss_gpu_available() -> bool:
    """Whether faiss has GPU support and sees a GPU (faiss-cpu's ``gpu=True`` silently runs on CPU, so check)."""
    if not faiss_available():
        return False
    import faiss

    return hasattr(faiss, "StandardGpuResources") and faiss.get_num_gpus() > 0


def available_backends(device: torch.device | str = "cpu") -> list[str]:
    """Backends that can run for states on ``device``."""
    device = torch.device(device)
    names = ["torch"]
    if faiss_available():
        names.append("faiss-cpu")
    if device.type == "cuda" and faiss_gpu_available():
        names.append("faiss-gpu")
    return names


def resolve_backend(backend: str, device: torch.device | str, distributed: bool = False) -> str:
    """The concrete backend for ``backend`` (``"auto"`` or one of `BACKENDS`) and states on ``device``.

    ``"auto"`` picks torch for CUDA states (no host round trip; faiss-gpu builds do not exist for every CUDA
    version) and under a process group (distributed Lloyd over all ranks' banks), else faiss-cpu when importable,
    else torch.
    """
    device = torch.device(device)
    if backend == "auto":
        if distributed or device.type != "cpu" or not faiss_available():
            return "torch"
        return "faiss-cpu"
    if backend not in BACKENDS:
        raise ValueError(f"Unknown K-Means backend {backend!r}; choose 'auto' or one of {BACKENDS}.")
    if backend == "faiss-cpu" and not faiss_available():
        raise ImportError("The faiss-cpu backend needs faiss: pip install faiss-cpu.")
    if backend == "faiss-gpu" and not faiss_gpu_available():
        raise ImportError(
            "The faiss-gpu backend needs faiss built with GPU support and a visible GPU "
            "(pip install 'hf-clusterformer[faiss-gpu]'); use backend='torch' to cluster on the GPU without it."
        )
    return backend


def default_process_group() -> Any | None:
    """The default process group when torch.distributed runs with more than one process, else None."""
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        return dist.group.WORLD
    return None


# ----------------------------------------------------------------------------------------------------------------
# Results
# ----------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ClusterStats:
    """Balance of one clustering: sizes, size entropy (nats; ``normalized_entropy`` divides by log k, 1 = uniform)
    and the mean cosine of each state to its assigned centroid, over all states of all ranks."""

    num_states: int
    num_clusters: int
    size_min: int
    size_max: int
    num_empty: int
    entropy: float
    normalized_entropy: float
    mean_cosine: float
    num_iters: int
    seconds: float
    backend: str

    @classmethod
    def from_counts(cls, counts: torch.Tensor, cosine_sum: float, **extra: Any) -> ClusterStats:
        """Statistics from cluster sizes ``counts`` (k,) and the summed cosine of all states to their centroid."""
        counts = counts.double().cpu()
        total = float(counts.sum())
        probs = counts / max(total, 1.0)
        entropy = float(-(probs[probs > 0] * probs[probs > 0].log()).sum())
        k = counts.numel()
        return cls(
            num_states=int(total),
            num_clusters=k,
            size_min=int(counts.min()),
            size_max=int(counts.max()),
            num_empty=int((counts == 0).sum()),
            entropy=entropy,
            normalized_entropy=entropy / math.log(k) if k > 1 else 1.0,
            mean_cosine=cosine_sum / max(total, 1.0),
            **extra,
        )

    def as_log(self, prefix: str = "") -> dict[str, float]:
        """Numeric fields as a flat ``{prefix + name: value}`` dict for the Trainer's logs."""
        return {prefix + name: value for name, value in asdict(self).items() if not isinstance(value, str)}


@dataclass
class KMeansResult:
    """Output of `spherical_kmeans`.

    centroids: (k, d) float32 unit rows on the states' device, in GetCentroids order unless ``order=False``.
    counts: (k,) int64 states per centroid (all ranks) under the final centroids.
    stats: balance statistics under the final centroids.
    """

    centroids: torch.Tensor
    counts: torch.Tensor
    stats: ClusterStats


# ----------------------------------------------------------------------------------------------------------------
# Collectives
# ----------------------------------------------------------------------------------------------------------------


def _comm_device(group: Any, data_device: torch.device) -> torch.device:
    """Device for collective buffers: CPU for gloo, CUDA for NCCL, else the data's device."""
    name = str(dist.get_backend(group))
    if "nccl" in name and "gloo" not in name:
        return torch.device("cuda", torch.cuda.current_device())
    if "gloo" in name and "nccl" not in name:
        return torch.device("cpu")
    return data_device


def all_reduce_sum(tensor: torch.Tensor, group: Any) -> torch.Tensor:
    """Sum ``tensor`` over ``group`` (every rank gets the same bits); returns it on its original device."""
    if group is None:
        return tensor
    buffer = tensor.to(_comm_device(group, tensor.device))
    dist.all_reduce(buffer, op=dist.ReduceOp.SUM, group=group)
    return buffer.to(tensor.device)


def _broadcast(tensor: torch.Tensor, group: Any) -> torch.Tensor:
    """``tensor`` as held by the group's first rank, on every rank; returns it on its original device."""
    if group is None:
        return tensor
    buffer = tensor.contiguous().to(_comm_device(group, tensor.device))
    dist.broadcast(buffer, src=dist.get_global_rank(group, 0), group=group)
    return buffer.to(tensor.device)


def _all_gather_counts(count: int, group: Any, device: torch.device) -> list[int]:
    """Every rank's ``count``, in rank order."""
    if group is None:
        return [count]
    world = dist.get_world_size(group)
    local = torch.zeros(world, dtype=torch.float64, device=device)
    local[dist.get_rank(group)] = count
    return [int(v) for v in all_reduce_sum(local, group).tolist()]


def _is_first(group: Any) -> bool:
    return group is None or dist.get_rank(group) == 0


# ----------------------------------------------------------------------------------------------------------------
# Torch spherical K-Means
# ----------------------------------------------------------------------------------------------------------------


def _prepare(states: torch.Tensor) -> torch.Tensor:
    """Finite, non-zero rows of ``states`` (n, d) as float32 unit rows (m, d); warns about dropped rows."""
    if states.dim() != 2:
        raise ValueError(f"spherical_kmeans expects (n, d) states, got shape {tuple(states.shape)}.")
    x = states.detach().float()
    norms = x.norm(dim=1)
    keep = torch.isfinite(x).all(dim=1) & (norms > 0)
    dropped = int(x.shape[0] - keep.sum())
    if dropped:
        warnings.warn(
            f"spherical_kmeans dropped {dropped} of {x.shape[0]} states that were non-finite or zero.", stacklevel=3
        )
        x, norms = x[keep], norms[keep]
    return x / norms.unsqueeze(1)


@torch.no_grad()
def _assign(x: torch.Tensor, centroids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Nearest centroid by cosine, in row blocks: (n, d) unit, (k, d) unit -> ids (n,) long, cosines (n,) float."""
    n, k = x.shape[0], centroids.shape[0]
    ids = torch.empty(n, dtype=torch.long, device=x.device)
    best = torch.empty(n, dtype=x.dtype, device=x.device)
    block = max(1, _BLOCK_ELEMENTS // max(k, 1))
    t = centroids.T.contiguous()
    for start in range(0, n, block):
        values, indices = (x[start : start + block] @ t).max(dim=1)
        best[start : start + block] = values
        ids[start : start + block] = indices
    return ids, best


def _quotas(counts: list[int], total: int) -> list[int]:
    """Split ``total`` sample rows over ranks holding ``counts`` rows, as evenly as their sizes allow."""
    quotas = [0] * len(counts)
    left = min(total, sum(counts))
    open_ranks = [r for r, c in enumerate(counts) if c > 0]
    while left > 0 and open_ranks:
        share = max(1, left // len(open_ranks))
        for r in list(open_ranks):
            take = min(share, counts[r] - quotas[r], left)
            quotas[r] += take
            left -= take
            if quotas[r] == counts[r]:
                open_ranks.remove(r)
            if left == 0:
                break
    return quotas


@torch.no_grad()
def _kmeans_plusplus(x: torch.Tensor, k: int, generator: torch.Generator) -> torch.Tensor:
    """Greedy k-means++ seeding under cosine distance: (m, d) unit rows -> (k, d).

    Each step draws ``2 + log k`` candidates with probability ∝ 1 - cos to the nearest chosen centroid (squared
    Euclidean distance / 2 on the sphere) and keeps the one that lowers the total distance most (as scikit-learn).
    The (m, m) Gram matrix is computed once, so the k sequential steps only read rows of it.
    """
    m = x.shape[0]
    trials = 2 + int(math.log(k))
    distances = (1 - x @ x.T).clamp_min_(0)  # (m, m)
    chosen = torch.empty(k, dtype=torch.long, device=x.device)
    chosen[0] = torch.randint(m, (1,), generator=generator, device=x.device)[0]
    distance = distances[chosen[0]]  # (m,)
    for i in range(1, k):
        # The tiny floor keeps the weights valid when every row coincides with a chosen one.
        candidates = torch.multinomial(distance + 1e-12, trials, replacement=True, generator=generator)  # (t,)
        candidate_distance = torch.minimum(distance.unsqueeze(0), distances[candidates])  # (t, m)
        best = candidate_distance.sum(dim=1).argmin()
        chosen[i] = candidates[best]
        distance = candidate_distance[best]
    return x[chosen].clone()


def _init_centroids(
    x: torch.Tensor, k: int, counts: list[int], sample_size: int, seed: int, group: Any
) -> torch.Tensor:
    """k-means++ centroids (k, d) from a sample of all ranks' rows, computed on the first rank and broadcast."""
    quota = _quotas(counts, sample_size)
    rank = 0 if group is None else dist.get_rank(group)
    generator = torch.Generator(device=x.device).manual_seed(seed)
    take = quota[rank]
    local = x[torch.randperm(x.shape[0], generator=generator, device=x.device)[:take]] if take < x.shape[0] else x
    if group is None:
        sample = local
    else:
        width = max(quota)
        padded = torch.zeros(width, x.shape[1], device=_comm_device(group, x.device))
        padded[:take] = local
        parts = [torch.empty_like(padded) for _ in range(dist.get_world_size(group))]
        dist.all_gather(parts, padded, group=group)
        sample = torch.cat([part[:q] for part, q in zip(parts, quota)]).to(x.device)
    centroids = torch.empty(k, x.shape[1], device=x.device)
    if _is_first(group):
        centroids = _kmeans_plusplus(sample, k, generator)
    return _broadcast(centroids, group)


@torch.no_grad()
def _lloyd_torch(x: torch.Tensor, centroids: torch.Tensor, num_iters: int, group: Any) -> tuple[torch.Tensor, int]:
    """Spherical Lloyd iterations over every rank's rows.

    Each rank assigns its own rows (n_r, d); only per-cluster sums (k, d), counts (k,) and the number of changed
    assignments are all-reduced, so every rank derives the same centroids (k, d). Empty clusters are re-seeded
    by farthest-point picks among the first rank's rows, then broadcast. Stops early once no assignment
    changes. Returns the centroids and the number of iterations run.
    """
    k, d = centroids.shape
    previous = None
    iterations = 0
    for iterations in range(1, num_iters + 1):  # noqa: B007 (the count is returned after the loop)
        ids, best = _assign(x, centroids)
        sums = torch.zeros(k, d, device=x.device).index_add_(0, ids, x)
        counts = torch.bincount(ids, minlength=k).float()
        changed = torch.tensor([x.shape[0] if previous is None else float((ids != previous).sum())], device=x.device)
        reduced = all_reduce_sum(torch.cat([sums.view(-1), counts, changed]), group)
        sums, counts, changed = reduced[: k * d].view(k, d), reduced[k * d : k * d + k], float(reduced[-1])
        norms = sums.norm(dim=1, keepdim=True)
        empty = (counts == 0) | (norms.squeeze(1) < 1e-12)
        updated = torch.where(empty.unsqueeze(1), centroids, sums / norms.clamp_min(1e-12))
        num_empty = int(empty.sum())
        if num_empty:
            if _is_first(group) and x.shape[0]:
                # Farthest-point re-seeding: each empty centroid takes the row worst served so far.
                served = best.clone()
                for slot in empty.nonzero().squeeze(1).tolist():
                    row = x[served.argmin()]
                    updated[slot] = row
                    torch.maximum(served, x @ row, out=served)
            updated = _broadcast(updated, group)
        centroids = updated
        previous = ids
        if changed == 0 and not num_empty:
            break
    return centroids, iterations


# ----------------------------------------------------------------------------------------------------------------
# faiss spherical K-Means
# ----------------------------------------------------------------------------------------------------------------


def _faiss_kmeans(x: torch.Tensor, k: int, num_iters: int, seed: int, init: torch.Tensor, gpu: bool) -> torch.Tensor:
    """faiss Lloyd on unit rows (n, d) from unit ``init`` (k, d) -> unit centroids (k, d) on x's device.

    faiss' ``spherical=True`` only normalises centroids (inputs are normalised by the caller), and its default
    ``max_points_per_centroid=256`` subsamples, so it is set to cover all rows (the caller subsamples if asked). On
    GPU the index is pinned to x's (or the current) CUDA device: ``gpu=True`` in ``faiss.Kmeans`` would take every GPU,
    which under DDP means every rank on every GPU.
    """
    import faiss

    n, d = x.shape
    data = x.cpu().numpy()
    params = faiss.ClusteringParameters()
    params.niter = num_iters
    params.seed = seed
    params.spherical = True
    params.verbose = False
    params.min_points_per_centroid = 1
    params.max_points_per_centroid = n // k + 1
    clustering = faiss.Clustering(d, k, params)
    faiss.copy_array_to_vector(init.detach().float().cpu().contiguous().numpy().reshape(-1), clustering.centroids)
    if gpu:
        resources = faiss.StandardGpuResources()
        config = faiss.GpuIndexFlatConfig()
        on_gpu = x.device.type == "cuda" and x.device.index is not None
        config.device = x.device.index if on_gpu else torch.cuda.current_device()
        index = faiss.GpuIndexFlatIP(resources, d, config)
    else:
        index = faiss.IndexFlatIP(d)
    clustering.train(data, index)
    centroids = torch.from_numpy(faiss.vector_to_array(clustering.centroids).reshape(k, d).copy()).to(x.device)
    # A cluster whose members cancel out has no direction: keep its starting centroid, as the torch backend does.
    norms = centroids.norm(dim=1, keepdim=True)
    degenerate = ~torch.isfinite(norms) | (norms < 1e-6)
    return torch.where(degenerate, init.to(centroids), centroids / norms.clamp_min(1e-6))


# ----------------------------------------------------------------------------------------------------------------
# Public entry point
# ----------------------------------------------------------------------------------------------------------------


def _check_enough_states(k: int, counts: list[int], backend: str, group: Any | None) -> None:
    """Raise `NotEnoughStatesError` unless the backend sees at least k states: all ranks' ``counts`` for torch, the
    first rank's for faiss (which clusters the first rank's states only)."""
    needed = counts[0] if backend != "torch" else sum(counts)
    if needed < k:
        where = "on the first rank" if backend != "torch" and group is not None else "in total"
        raise NotEnoughStatesError(
            f"K-Means into {k} clusters needs at least {k} usable states, got {needed} {where}; "
            "collect more states (a larger memory bank or more steps) or use fewer clusters."
        )


def _warm_start(init: torch.Tensor, k: int, x: torch.Tensor, group: Any | None) -> torch.Tensor:
    """Starting centroids (k, d) from the caller, checked against the states x (n, d), made unit float32 rows on x's
    device and taken from the first rank."""
    if init.shape != (k, x.shape[1]):
        raise ValueError(f"init must have shape ({k}, {x.shape[1]}), got {tuple(init.shape)}.")
    return _broadcast(F.normalize(init.detach().float().to(x.device), dim=1), group)


def _lloyd_subset(x: torch.Tensor, k: int, total: int, max_points_per_centroid: int | None, seed: int) -> torch.Tensor:
    """The rows (m, d) of x (n, d) that Lloyd runs on: all of them, or a random ``n * k * max_points_per_centroid /
    total`` of this rank's when all ranks' ``total`` exceeds ``k * max_points_per_centroid`` (faiss' rule)."""
    if max_points_per_centroid is None or total <= k * max_points_per_centroid:
        return x
    generator = torch.Generator(device=x.device).manual_seed(seed + 7919)
    keep = math.ceil(x.shape[0] * k * max_points_per_centroid / total)
    return x[torch.randperm(x.shape[0], generator=generator, device=x.device)[:keep]]


def _run_backend(
    backend: str, fit: torch.Tensor, init: torch.Tensor, num_iters: int, seed: int, group: Any | None
) -> tuple[torch.Tensor, int]:
    """Lloyd from ``init`` (k, d) on the unit rows ``fit`` (m, d) -> (centroids (k, d), iterations run).

    torch runs distributed Lloyd over every rank; faiss runs on the first rank only (the other ranks return
    placeholders that the caller's broadcast replaces) and reports ``num_iters``.
    """
    if backend == "torch":
        return _lloyd_torch(fit, init, num_iters, group)
    k, d = init.shape
    if not _is_first(group):
        return torch.empty(k, d, device=fit.device), num_iters
    return _faiss_kmeans(fit, k, num_iters, seed, init, backend == "faiss-gpu"), num_iters


def _cluster_sizes(x: torch.Tensor, centroids: torch.Tensor, group: Any | None) -> tuple[torch.Tensor, float]:
    """All ranks' cluster sizes (k,) int64 and summed best cosine of the unit rows x (n, d) to ``centroids`` (k, d)."""
    k = centroids.shape[0]
    ids, best = _assign(x, centroids)
    summary = torch.cat([torch.bincount(ids, minlength=k).double(), best.double().sum().view(1)])
    summary = all_reduce_sum(summary, group)
    return summary[:k].round().long(), float(summary[k])


@torch.no_grad()
def spherical_kmeans(
    states: torch.Tensor, num_clusters: int, *, num_iters: int = 20, seed: int = 0, init: torch.Tensor | None = None,
    backend: str = "auto", process_group: Any | None = None, max_points_per_centroid: int | None = None,
    init_sample_size: int | None = None, order: bool = True,
) -> KMeansResult:
    """Cosine K-Means of ``states`` into ``num_clusters`` unit centroids, then the paper's GetCentroids ordering.

    Args:
        states: (n, d) any float dtype, on any device; rows are L2-normalised here. Non-finite and all-zero rows are
            dropped with a warning.
        num_clusters: k.
        num_iters: Lloyd iterations (torch stops earlier once no assignment changes).
        seed: seeds k-means++ and subsampling.
        init: optional (k, d) starting centroids (warm start from the previous fit); greedy k-means++ over a sample
            of all ranks' states otherwise (for every backend: faiss' own random pick often merges clusters).
        backend: ``"auto"``, ``"torch"``, ``"faiss-cpu"`` or ``"faiss-gpu"`` (see `resolve_backend`).
        process_group: run over several processes, each passing its own ``states``. The torch backend runs
            distributed Lloyd (only per-cluster sums and counts are all-reduced); the faiss backends cluster the
            first rank's states. Every rank must call, and every rank gets bit-identical centroids (the first
            rank's are broadcast at the end).
        max_points_per_centroid: Lloyd on a random subset of at most ``k * max_points_per_centroid`` rows (faiss'
            rule); statistics cover all rows.
        init_sample_size: rows k-means++ draws from, whose (m, m) Gram matrix it builds (default
            ``min(n, max(k, min(max(8 k, 4096), 8192)))``).
        order: apply `order_centroids_greedy` to the result.

    Returns:
        `KMeansResult` with (k, d) float32 centroids on the states' device.

    Raises:
        NotEnoughStatesError: fewer usable states than clusters (over all ranks; for the faiss backends under a
            process group, on the first rank), on every rank alike.
    """
    start = time.perf_counter()
    k = int(num_clusters)
    if k < 1:
        raise ValueError(f"num_clusters must be positive, got {num_clusters}.")
    x = _prepare(states)
    name = resolve_backend(backend, states.device, distributed=process_group is not None)
    counts = _all_gather_counts(x.shape[0], process_group, states.device)
    _check_enough_states(k, counts, name, process_group)
    init = _warm_start(init, k, x, process_group) if init is not None else None
    fit = _lloyd_subset(x, k, sum(counts), max_points_per_centroid, seed)
    if init is None:
        sample_size = init_sample_size or max(k, min(max(8 * k, 4096), 8192))
        init = _init_centroids(x, k, counts, sample_size, seed, process_group)
    centroids, iterations = _run_backend(name, fit, init, num_iters, seed, process_group)
    if order:
        centroids = order_centroids_greedy(centroids)
    centroids = _broadcast(centroids.contiguous(), process_group)
    sizes, objective = _cluster_sizes(x, centroids, process_group)
    stats = ClusterStats.from_counts(sizes, objective, num_iters=iterations, seconds=time.perf_counter() - start,
                                     backend=name)
    return KMeansResult(centroids=centroids, counts=sizes, stats=stats)
