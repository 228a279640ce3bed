"""Centroid updates for Cluster-Former layers (paper §3.2, Algorithm 1).

Three pieces, usable without the `Trainer`:

* `MemoryBank`: FIFO store of the most recent states entering a cluster layer.
* `spherical_kmeans`: cosine K-Means with a torch backend (any device, optionally distributed Lloyd over a process
  group), a faiss CPU backend and a faiss GPU backend, followed by the paper's GetCentroids ordering.
* `CentroidUpdater`: owns one bank per cluster layer, captures states with forward hooks on the routers, refits on a
  schedule and writes the centroids into the routers' buffers in place.

`hf_clusterformer.callback.CentroidUpdateCallback` drives a `CentroidUpdater` from the `Trainer`.
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from .modeling_clusterformer import ClusterRouter, order_centroids_greedy

__all__ = [
    "BACKENDS",
    "CentroidUpdater",
    "ClusterStats",
    "KMeansResult",
    "MemoryBank",
    "NotEnoughStatesError",
    "available_backends",
    "default_process_group",
    "faiss_available",
    "faiss_gpu_available",
    "find_cluster_routers",
    "resolve_backend",
    "spherical_kmeans",
]

#: Backend names accepted by `spherical_kmeans` (besides ``"auto"``).
BACKENDS = ("torch", "faiss-cpu", "faiss-gpu")

# Rows of states per (rows x k) similarity block in the torch backend: 2**24 floats = 64 MiB.
_BLOCK_ELEMENTS = 1 << 24


class NotEnoughStatesError(ValueError):
    """Raised when K-Means gets fewer usable states than clusters."""


# ----------------------------------------------------------------------------------------------------------------
# Memory bank
# ----------------------------------------------------------------------------------------------------------------


class MemoryBank:
    """FIFO queue of the most recent ``capacity`` states (Algorithm 1's ``Memory``), as unit rows.

    Rows are L2-normalised on entry (spherical K-Means only needs directions), which keeps every value in [-1, 1]
    so float16 storage loses nothing that matters: 100,000 x 1024 states take 200 MB. The ring buffer is
    allocated once, at the first `add`, on ``device`` (default: the device of the first states).
    """

    def __init__(self, capacity: int = 100_000, dtype: torch.dtype = torch.float16, device: torch.device | str | None = None):
        if capacity < 1:
            raise ValueError(f"capacity must be positive, got {capacity}.")
        self.capacity = int(capacity)
        self.dtype = dtype
        self.device = torch.device(device) if device is not None else None
        self._buffer: torch.Tensor | None = None
        self._next = 0  # ring position of the next write
        self._size = 0
        self.total_added = 0

    def __len__(self) -> int:
        return self._size

    @property
    def dim(self) -> int | None:
        """Width of the stored states, None before the first `add`."""
        return None if self._buffer is None else self._buffer.shape[1]

    @torch.no_grad()
    def add(self, states: torch.Tensor) -> None:
        """Append states (n, d), dropping the oldest rows beyond ``capacity``. Stores detached, normalised copies."""
        if states.dim() != 2:
            raise ValueError(f"MemoryBank.add expects (n, d) states, got shape {tuple(states.shape)}.")
        count = states.shape[0]
        if count == 0:
            return
        if self._buffer is None:
            device = self.device if self.device is not None else states.device
            self._buffer = torch.empty(self.capacity, states.shape[1], dtype=self.dtype, device=device)
        elif states.shape[1] != self._buffer.shape[1]:
            raise ValueError(f"MemoryBank holds {self._buffer.shape[1]}-d states, got {states.shape[1]}-d.")
        self.total_added += count
        if count > self.capacity:
            states = states[-self.capacity :]
            count = self.capacity
        rows = F.normalize(states.detach().float(), dim=-1).to(device=self._buffer.device, dtype=self.dtype)
        first = min(count, self.capacity - self._next)
        self._buffer[self._next : self._next + first] = rows[:first]
        if first < count:
            self._buffer[: count - first] = rows[first:]
        self._next = (self._next + count) % self.capacity
        self._size = min(self._size + count, self.capacity)

    def states(self) -> torch.Tensor:
        """The stored rows in ring order, without a copy: (len, d). Empty (0, 0) before the first `add`."""
        if self._buffer is None:
            return torch.empty(0, 0, dtype=self.dtype, device=self.device)
        return self._buffer[: self._size]

    def ordered(self) -> torch.Tensor:
        """The stored rows from oldest to newest (a copy): (len, d)."""
        if self._size < self.capacity:
            return self.states().clone()
        return torch.cat([self._buffer[self._next :], self._buffer[: self._next]])

    def clear(self) -> None:
        """Forget all rows and free the buffer."""
        self._buffer = None
        self._next = self._size = self.total_added = 0

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Contents for a checkpoint: ``states`` (len, d) oldest to newest, ``total_added`` (0-dim)."""
        return {"states": self.ordered(), "total_added": torch.tensor(self.total_added)}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Restore what `state_dict` returned (rows beyond ``capacity`` keep the newest)."""
        self.clear()
        states = state["states"]
        if states.numel():
            self._buffer = torch.empty(self.capacity, states.shape[1], dtype=self.dtype, device=self.device or states.device)
            rows = states[-self.capacity :]
            self._buffer[: rows.shape[0]] = rows.to(self._buffer)
            self._size = rows.shape[0]
            self._next = self._size % self.capacity
        self.total_added = int(state["total_added"])


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


def _all_reduce(tensor: torch.Tensor, group: Any) -> torch.Tensor:
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
    return [int(v) for v in _all_reduce(local, group).tolist()]


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
        warnings.warn(f"spherical_kmeans dropped {dropped} of {x.shape[0]} states that were non-finite or zero.", stacklevel=3)
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
    for iterations in range(1, num_iters + 1):
        ids, best = _assign(x, centroids)
        sums = torch.zeros(k, d, device=x.device).index_add_(0, ids, x)
        counts = torch.bincount(ids, minlength=k).float()
        changed = torch.tensor([x.shape[0] if previous is None else float((ids != previous).sum())], device=x.device)
        reduced = _all_reduce(torch.cat([sums.view(-1), counts, changed]), group)
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
    ``max_points_per_centroid=256`` subsamples, so it is set to cover all rows (the caller subsamples if asked). On GPU the
    index is pinned to x's (or the current) CUDA device: ``gpu=True`` in ``faiss.Kmeans`` would take every GPU,
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


@torch.no_grad()
def spherical_kmeans(
    states: torch.Tensor,
    num_clusters: int,
    *,
    num_iters: int = 20,
    seed: int = 0,
    init: torch.Tensor | None = None,
    backend: str = "auto",
    process_group: Any | None = None,
    max_points_per_centroid: int | None = None,
    init_sample_size: int | None = None,
    order: bool = True,
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
        max_points_per_centroid: if set, Lloyd runs on a random subset of at most ``k * max_points_per_centroid``
            rows (faiss' sampling rule); statistics still cover all rows.
        init_sample_size: rows k-means++ draws from (default ``min(n, max(k, min(max(8 k, 4096), 8192)))``; it
            builds their (m, m) Gram matrix).
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
    device = states.device
    x = _prepare(states)
    name = resolve_backend(backend, device, distributed=process_group is not None)
    counts = _all_gather_counts(x.shape[0], process_group, device)
    total = sum(counts)
    needed = counts[0] if name != "torch" else total
    if needed < k:
        where = "on the first rank" if name != "torch" and process_group is not None else "in total"
        raise NotEnoughStatesError(
            f"K-Means into {k} clusters needs at least {k} usable states, got {needed} {where}; "
            "collect more states (a larger memory bank or more steps) or use fewer clusters."
        )
    if init is not None:
        if init.shape != (k, x.shape[1]):
            raise ValueError(f"init must have shape ({k}, {x.shape[1]}), got {tuple(init.shape)}.")
        init = _broadcast(F.normalize(init.detach().float().to(device), dim=1), process_group)

    generator = torch.Generator(device=device).manual_seed(seed + 7919)
    fit = x
    if max_points_per_centroid is not None and total > k * max_points_per_centroid:
        keep = math.ceil(x.shape[0] * k * max_points_per_centroid / total)
        fit = x[torch.randperm(x.shape[0], generator=generator, device=device)[:keep]]

    if init is None:
        sample = init_sample_size or max(k, min(max(8 * k, 4096), 8192))
        init = _init_centroids(x, k, counts, sample, seed, process_group)
    iterations = num_iters
    if name == "torch":
        centroids, iterations = _lloyd_torch(fit, init, num_iters, process_group)
    else:
        centroids = torch.empty(k, x.shape[1], device=device)
        if _is_first(process_group):
            centroids = _faiss_kmeans(fit, k, num_iters, seed, init, name == "faiss-gpu")
    if order:
        centroids = order_centroids_greedy(centroids)
    centroids = _broadcast(centroids.contiguous(), process_group)

    ids, best = _assign(x, centroids)
    summary = torch.cat([torch.bincount(ids, minlength=k).double(), best.double().sum().view(1)])
    summary = _all_reduce(summary, process_group)
    sizes = summary[:k].round().long()
    stats = ClusterStats.from_counts(
        sizes, float(summary[k]), num_iters=iterations, seconds=time.perf_counter() - start, backend=name
    )
    return KMeansResult(centroids=centroids, counts=sizes, stats=stats)


# ----------------------------------------------------------------------------------------------------------------
# Updater
# ----------------------------------------------------------------------------------------------------------------


def find_cluster_routers(model: nn.Module) -> dict[int, ClusterRouter]:
    """``model.cluster_routers()`` by layer index, looking through DDP/FSDP-style ``.module`` wrappers."""
    while not hasattr(model, "cluster_routers") and hasattr(model, "module"):
        model = model.module
    if not hasattr(model, "cluster_routers"):
        raise TypeError(f"{type(model).__name__} has no cluster_routers(); pass a Cluster-Former model.")
    return dict(sorted(model.cluster_routers().items()))


class CentroidUpdater:
    """Algorithm 1 without a Trainer: memory banks, periodic spherical K-Means, centroids written in place.

    Forward hooks on each `ClusterRouter` capture the states entering its cluster layer (the representative,
    non-pad slots) into that layer's `MemoryBank`, detached and only while the router is in training mode; they
    never change the forward's results. Call `step` after every optimizer step: it fits the first centroids as
    soon as every bank holds ``min_states`` states (warm-up), then refits every ``update_every`` steps (None: only
    when `update` is called), warm-starting from the current centroids. New centroids are copied into the
    routers' ``centroids`` buffers (no reallocation) and ``fitted`` is set.

    Under torch.distributed every rank must call `step`/`update` at the same steps: states stay on their rank,
    the torch backend runs distributed Lloyd and every rank ends with bit-identical centroids.

    Args:
        model: a Cluster-Former model (or a wrapper with ``.module``).
        memory_size: M, states kept per layer (paper: 100,000).
        update_every: refit period in steps, or None.
        min_states: states needed before fitting (default ``min(memory_size, 32 * num_clusters)``, at least k).
        max_capture_per_forward: if set, each forward pass stores a random subset of at most this many states per
            layer, which makes capture cheaper and spreads the bank over more steps. Drawn from the updater's own
            generator (reseeded from ``seed``, rank and step), so the global RNG and the model's dropout are untouched.
        bank_dtype: storage dtype of the banks.
        backend, num_iters, seed, max_points_per_centroid: passed to `spherical_kmeans`.
        warm_start: start each refit from the current centroids (k-means++ for the first fit).
        process_group: ``"auto"`` (the default group when world size > 1), None (local only) or a process group.
        layers: cluster layer indices to manage (default: all).
    """

    def __init__(
        self,
        model: nn.Module,
        *,
        memory_size: int = 100_000,
        update_every: int | None = None,
        min_states: int | None = None,
        max_capture_per_forward: int | None = None,
        bank_dtype: torch.dtype = torch.float16,
        backend: str = "auto",
        num_iters: int = 20,
        seed: int = 0,
        warm_start: bool = True,
        max_points_per_centroid: int | None = None,
        process_group: Any = "auto",
        layers: Iterable[int] | None = None,
    ):
        routers = find_cluster_routers(model)
        if layers is not None:
            missing = set(layers) - set(routers)
            if missing:
                raise ValueError(f"Layers {sorted(missing)} are not cluster layers; the model has {sorted(routers)}.")
            routers = {i: routers[i] for i in sorted(layers)}
        if not routers:
            raise ValueError("The model has no K-Means cluster layers to update.")
        if update_every is not None and update_every < 1:
            raise ValueError(f"update_every must be positive or None, got {update_every}.")
        self.routers: dict[int, ClusterRouter] = routers
        self.num_clusters = max(router.num_clusters for router in routers.values())
        self.banks: dict[int, MemoryBank] = {i: MemoryBank(memory_size, bank_dtype) for i in routers}
        self.memory_size = memory_size
        self.update_every = update_every
        default_min = min(memory_size, 32 * self.num_clusters)
        self.min_states = max(self.num_clusters, min_states if min_states is not None else default_min)
        self.max_capture_per_forward = max_capture_per_forward
        self.backend = backend
        self.num_iters = num_iters
        self.seed = seed
        self.warm_start = warm_start
        self.max_points_per_centroid = max_points_per_centroid
        self.process_group = process_group
        self.step_count = 0
        self.last_update_step: int | None = None
        self.num_updates = 0
        self.last_stats: dict[int, ClusterStats] = {}
        self.capturing = True
        self._generator = torch.Generator()
        self._reseed()
        self._handles: list[Any] = []
        self.attach()

    # -- capture -------------------------------------------------------------------------------------------------

    def attach(self) -> None:
        """Register the capture hooks (done by the constructor; no-op when attached)."""
        if self._handles:
            return
        for index, router in self.routers.items():
            self._handles.append(router.register_forward_hook(self._make_hook(index), with_kwargs=True))

    def detach(self) -> None:
        """Remove the capture hooks (the banks are kept)."""
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def close(self) -> None:
        """Remove the hooks and free the banks."""
        self.detach()
        for bank in self.banks.values():
            bank.clear()

    def _make_hook(self, index: int):
        bank = self.banks[index]

        def hook(module: nn.Module, args: tuple, kwargs: dict, output: torch.Tensor) -> None:
            if not (module.training and self.capturing):
                return
            states = args[0] if args else kwargs["states"]
            representative = args[1] if len(args) > 1 else kwargs["representative"]
            with torch.no_grad():
                rows = states.detach()[representative]  # (n, d)
                cap = self.max_capture_per_forward
                if cap is not None and rows.shape[0] > cap:
                    pick = torch.randperm(rows.shape[0], generator=self._generator)[:cap]
                    rows = rows[pick.to(rows.device)]
                bank.add(rows)

        return hook

    def _group(self) -> Any | None:
        return default_process_group() if self.process_group == "auto" else self.process_group

    def _reseed(self) -> None:
        group = self._group()
        rank = 0 if group is None else dist.get_rank(group)
        self._generator.manual_seed((self.seed * 1_000_003 + rank) * 1_000_003 + self.step_count)

    # -- schedule ------------------------------------------------------------------------------------------------

    @property
    def fitted(self) -> bool:
        """Whether every managed router holds K-Means centroids."""
        return all(bool(router.fitted) for router in self.routers.values())

    def num_states(self) -> int:
        """States held by the emptiest bank, summed over ranks (a collective under torch.distributed)."""
        local = torch.tensor([float(len(bank)) for bank in self.banks.values()], dtype=torch.float64)
        group = self._group()
        if group is not None:
            local = _all_reduce(local.to(_comm_device(group, torch.device("cpu"))), group).cpu()
        return int(local.min())

    def step(self, global_step: int | None = None) -> dict[int, ClusterStats] | None:
        """Advance to ``global_step`` (default: one more step) and refit if due.

        Due means: warm-up (some router not yet fitted) or ``update_every`` steps since the last fit; either way
        only once ``min_states`` states are banked. Returns the new statistics when a fit ran, else None.
        """
        self.step_count = self.step_count + 1 if global_step is None else int(global_step)
        self._reseed()
        if self.fitted:
            if self.update_every is None:
                return None
            since = self.step_count - (self.last_update_step if self.last_update_step is not None else 0)
            if since < self.update_every:
                return None
        return self.update()

    @torch.no_grad()
    def update(self) -> dict[int, ClusterStats] | None:
        """Fit every layer's centroids now if its bank holds ``min_states`` states (all ranks must call).

        Returns ``{layer: ClusterStats}``, or None when there are not enough states yet.
        """
        if self.num_states() < self.min_states:
            return None
        group = self._group()
        stats: dict[int, ClusterStats] = {}
        for index, router in self.routers.items():
            init = router.centroids if self.warm_start and bool(router.fitted) else None
            bank = self.banks[index]
            # A rank that banked nothing still takes part, with (0, d) states.
            states = bank.states() if len(bank) else router.centroids.new_empty(0, router.centroids.shape[1])
            result = spherical_kmeans(
                states,
                router.num_clusters,
                num_iters=self.num_iters,
                seed=self.seed + 1009 * index + 7 * self.num_updates,
                init=init,
                backend=self.backend,
                process_group=group,
                max_points_per_centroid=self.max_points_per_centroid,
            )
            router.centroids.copy_(result.centroids)
            router.fitted.fill_(True)
            stats[index] = result.stats
        self.num_updates += 1
        self.last_update_step = self.step_count
        self.last_stats = stats
        return stats

    # -- persistence ---------------------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Progress (JSON-serialisable): ``step_count``, ``last_update_step``, ``num_updates``."""
        return {"step_count": self.step_count, "last_update_step": self.last_update_step, "num_updates": self.num_updates}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what `state_dict` returned."""
        self.step_count = int(state["step_count"])
        self.last_update_step = None if state["last_update_step"] is None else int(state["last_update_step"])
        self.num_updates = int(state["num_updates"])
        self._reseed()

    def banks_state_dict(self) -> dict[str, torch.Tensor]:
        """Every bank's contents as flat tensors (``layer{i}.states``, ``layer{i}.total_added``), for safetensors."""
        flat: dict[str, torch.Tensor] = {}
        for index, bank in self.banks.items():
            for key, value in bank.state_dict().items():
                flat[f"layer{index}.{key}"] = value.contiguous()
        return flat

    def load_banks_state_dict(self, flat: dict[str, torch.Tensor]) -> None:
        """Restore what `banks_state_dict` returned (banks missing from ``flat`` are left as they are)."""
        for index, bank in self.banks.items():
            if f"layer{index}.states" in flat:
                bank.load_state_dict({key: flat[f"layer{index}.{key}"] for key in ("states", "total_added")})
