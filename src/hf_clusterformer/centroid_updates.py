"""Centroid updates for Cluster-Former layers (paper Algorithm 1), usable without the `Trainer`.

* `MemoryBank`: FIFO store of the most recent states entering a cluster layer.
* `CentroidUpdateSettings`: the refit schedule and K-Means options, shared by `CentroidUpdater`,
  `hf_clusterformer.callback.CentroidUpdateCallback` and run_qa's arguments.
* `CentroidUpdater`: owns one bank per cluster layer, captures states with forward hooks on the routers, refits with
  `hf_clusterformer.kmeans.spherical_kmeans` on a schedule and writes the centroids into the routers' buffers.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, fields, replace
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from .kmeans import BACKENDS, ClusterStats, all_reduce_sum, default_process_group, faiss_available, spherical_kmeans
from .modeling_clusterformer import ClusterRouter

__all__ = ["CentroidUpdateSettings", "CentroidUpdater", "NothingBankedError"]


# ----------------------------------------------------------------------------------------------------------------
# Memory bank
# ----------------------------------------------------------------------------------------------------------------


class MemoryBank:
    """FIFO queue of the most recent ``capacity`` states (Algorithm 1's ``Memory``), as unit rows.

    Rows are L2-normalised on entry (spherical K-Means only needs directions), which keeps every value in [-1, 1]
    so float16 storage loses nothing that matters: 100,000 x 1024 states take 200 MB. The ring buffer is
    allocated once, at the first `add`, on ``device`` (default: the device of the first states).
    """

    def __init__(
        self, capacity: int = 100_000, dtype: torch.dtype = torch.float16, device: torch.device | str | None = None
    ):
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
            self._buffer = torch.empty(
                self.capacity, states.shape[1], dtype=self.dtype, device=self.device or states.device
            )
            rows = states[-self.capacity :]
            self._buffer[: rows.shape[0]] = rows.to(self._buffer)
            self._size = rows.shape[0]
            self._next = self._size % self.capacity
        self.total_added = int(state["total_added"])


# ----------------------------------------------------------------------------------------------------------------
# Settings
# ----------------------------------------------------------------------------------------------------------------


@dataclass
class CentroidUpdateSettings:
    """When centroids are refitted and how: the options of `CentroidUpdater`, `CentroidUpdateCallback` and run_qa.

    Each field's ``help`` is also its run_qa command-line help. ``update_every_epochs`` and ``save_memory_bank``
    only apply under the `Trainer` (`CentroidUpdateCallback`).
    """

    update_every_epochs: float | None = field(
        default=1, metadata={"help": "Refit every N epochs (None: no epoch-based refits; Trainer only)."}
    )
    update_every_steps: int | None = field(
        default=None, metadata={"help": "Refit every N optimizer steps (None: no step-based refits)."}
    )
    memory_size: int = field(
        default=100_000, metadata={"help": "States kept per cluster layer and rank (paper: 100k)."}
    )
    min_states: int | None = field(
        default=None,
        metadata={"help": "States banked (all ranks together) before the first fit; default min(memory_size, 32 k)."},
    )
    max_capture_per_forward: int | None = field(
        default=None, metadata={"help": "Random states banked per forward pass and layer (None: all)."}
    )
    backend: str = field(default="auto", metadata={"help": "K-Means backend: auto, torch, faiss-cpu or faiss-gpu."})
    num_iters: int = field(default=20, metadata={"help": "Lloyd iterations per fit."})
    seed: int = field(default=0, metadata={"help": "Seeds k-means++ and the capture subsampling."})
    bank_dtype: str = field(
        default="float16", metadata={"help": "Storage dtype of the banks: float16, bfloat16 or float32."}
    )
    warm_start: bool = field(default=True, metadata={"help": "Start each refit from the current centroids."})
    max_points_per_centroid: int | None = field(
        default=None, metadata={"help": "Fit on at most k times this many states (None: all)."}
    )
    save_memory_bank: bool = field(
        default=False, metadata={"help": "Also save the banks in checkpoints, for an exact resume (Trainer only)."}
    )

    def __post_init__(self) -> None:
        if self.backend != "auto" and self.backend not in BACKENDS:  # else said only at the first fit, maybe hours in
            raise ValueError(f"backend must be 'auto' or one of {', '.join(BACKENDS)}, got {self.backend!r}.")
        if self.backend == "faiss-cpu" and not faiss_available():
            raise ImportError("backend 'faiss-cpu' needs faiss (pip install faiss-cpu); or use backend='torch'.")
        if self.num_iters < 1:
            raise ValueError(f"num_iters must be positive, got {self.num_iters}.")
        positive = ("update_every_epochs", "update_every_steps", "max_capture_per_forward", "max_points_per_centroid")
        for name in positive:
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ValueError(f"{name} must be positive or None, got {value}.")
        if self.memory_size < 1:
            raise ValueError(f"memory_size must be positive, got {self.memory_size}.")
        if self.min_states is not None and self.min_states < 0:
            raise ValueError(f"min_states must be non-negative or None, got {self.min_states}.")
        if isinstance(self.bank_dtype, torch.dtype):
            self.bank_dtype = str(self.bank_dtype).removeprefix("torch.")
        if not isinstance(getattr(torch, str(self.bank_dtype), None), torch.dtype):
            raise ValueError(f"bank_dtype must name a torch dtype such as 'float16', got {self.bank_dtype!r}.")

    @property
    def torch_bank_dtype(self) -> torch.dtype:
        """``bank_dtype`` as a torch dtype."""
        return getattr(torch, self.bank_dtype)

    @classmethod
    def build(cls, settings: CentroidUpdateSettings | None = None, **options: Any) -> CentroidUpdateSettings:
        """``settings`` (default: the defaults) with ``options`` (field names) replaced, validated."""
        if settings is not None and not isinstance(settings, cls):
            raise ValueError(
                f"settings must be a {cls.__name__}, got {type(settings).__name__}; pass options by keyword."
            )
        unknown = sorted(set(options) - {f.name for f in fields(cls)})
        if unknown:
            valid = ", ".join(f.name for f in fields(cls))
            raise ValueError(f"Unknown centroid update option(s) {unknown}; valid options: {valid}.")
        return replace(settings or cls(), **options)


#: Centroid settings of the small models (generated data, run_qa's from-scratch models, the experiments): refit
#: every 50 steps over a bank of 20k states, at most 2048 captured per forward.
SMALL_MODEL_CENTROIDS = CentroidUpdateSettings(
    update_every_epochs=None, update_every_steps=50, memory_size=20_000, max_capture_per_forward=2048
)


# ----------------------------------------------------------------------------------------------------------------
# Updater
# ----------------------------------------------------------------------------------------------------------------


class NothingBankedError(RuntimeError):
    """`CentroidUpdater.update` was asked to fit with empty banks while the model is in eval mode (which banks
    nothing)."""


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
    soon as every bank holds ``min_states`` states (warm-up), then refits every ``update_every_steps`` steps
    (None: only when `update` is called), warm-starting from the current centroids. New centroids are copied into
    the routers' ``centroids`` buffers (no reallocation) and ``fitted`` is set.

    With ``max_capture_per_forward``, the random subset banked per forward pass is drawn from the updater's own
    generator (reseeded from ``seed``, rank and step), so the global RNG and the model's dropout are untouched.

    Under torch.distributed every rank must call `step`/`update` at the same steps: states stay on their rank,
    the torch backend runs distributed Lloyd and every rank ends with bit-identical centroids.

    Args:
        model: a Cluster-Former model (or a wrapper with ``.module``).
        settings: the options (default `CentroidUpdateSettings()`); ``update_every_epochs`` and
            ``save_memory_bank`` are ignored here.
        process_group: ``"auto"`` (the default group when world size > 1), None (local only) or a process group.
        layers: cluster layer indices to manage (default: all).
        **options: `CentroidUpdateSettings` fields overriding ``settings`` (``memory_size=...``, ``backend=...``;
            ``bank_dtype`` may be a torch dtype).
    """

    def __init__(
        self,
        model: nn.Module,
        settings: CentroidUpdateSettings | None = None,
        *,
        process_group: Any = "auto",
        layers: Iterable[int] | None = None,
        **options: Any,
    ):
        self.settings = CentroidUpdateSettings.build(settings, **options)
        routers = find_cluster_routers(model)
        if layers is not None:
            missing = set(layers) - set(routers)
            if missing:
                raise ValueError(f"Layers {sorted(missing)} are not cluster layers; the model has {sorted(routers)}.")
            routers = {i: routers[i] for i in sorted(layers)}
        if not routers:
            raise ValueError("The model has no K-Means cluster layers to update.")
        s = self.settings
        self.routers: dict[int, ClusterRouter] = routers
        self.num_clusters = max(router.num_clusters for router in routers.values())
        self.banks: dict[int, MemoryBank] = {i: MemoryBank(s.memory_size, s.torch_bank_dtype) for i in routers}
        default_min = min(s.memory_size, 32 * self.num_clusters)
        #: States needed before fitting: ``min_states`` (default ``min(memory_size, 32 k)``), at least k.
        self.min_states = max(self.num_clusters, s.min_states if s.min_states is not None else default_min)
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
                cap = self.settings.max_capture_per_forward
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
        self._generator.manual_seed((self.settings.seed * 1_000_003 + rank) * 1_000_003 + self.step_count)

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
            local = all_reduce_sum(local, group)
        return int(local.min())

    def step(self, global_step: int | None = None) -> dict[int, ClusterStats] | None:
        """Advance to ``global_step`` (default: one more step) and refit if due.

        Due means: warm-up (some router not yet fitted) or ``update_every_steps`` steps since the last fit; either way
        only once ``min_states`` states are banked. Returns the new statistics when a fit ran, else None (raises as
        `update` does when nothing was banked in eval mode).
        """
        self.step_count = self.step_count + 1 if global_step is None else int(global_step)
        self._reseed()
        if self.fitted:
            if self.settings.update_every_steps is None:
                return None
            since = self.step_count - (self.last_update_step if self.last_update_step is not None else 0)
            if since < self.settings.update_every_steps:
                return None
        return self.update()

    @torch.no_grad()
    def update(self) -> dict[int, ClusterStats] | None:
        """Fit every layer's centroids now if its bank holds ``min_states`` states (all ranks must call).

        Returns ``{layer: ClusterStats}``, or None when there are not enough states yet. Raises
        `NothingBankedError` when nothing was banked and the model is in eval mode (states are banked only by
        train-mode forward passes).
        """
        banked = self.num_states()
        if banked < self.min_states:
            if banked == 0 and not any(router.training for router in self.routers.values()):
                raise NothingBankedError(
                    "CentroidUpdater has banked no states: the model is in eval mode, and states are banked only by "
                    "forward passes in train mode; call model.train() before the forward passes (under "
                    "torch.no_grad() when no gradients are needed), then step() or update()."
                )
            return None
        group = self._group()
        s = self.settings
        stats: dict[int, ClusterStats] = {}
        for index, router in self.routers.items():
            init = router.centroids if s.warm_start and bool(router.fitted) else None
            bank = self.banks[index]
            # A rank that banked nothing still takes part, with (0, d) states.
            states = bank.states() if len(bank) else router.centroids.new_empty(0, router.centroids.shape[1])
            result = spherical_kmeans(
                states,
                router.num_clusters,
                num_iters=s.num_iters,
                seed=s.seed + 1009 * index + 7 * self.num_updates,
                init=init,
                backend=s.backend,
                process_group=group,
                max_points_per_centroid=s.max_points_per_centroid,
            )
            router.centroids.copy_(result.centroids)
            router.fitted.fill_(True)
            stats[index] = result.stats
        self.num_updates += 1
        self.last_update_step = self.step_count
        self.last_stats = stats
        return stats

    def unfitted_report(self) -> str | None:
        """One line saying which managed cluster layers were never fitted, the states K-Means waits for, the states
        banked, and how to get there; None when every layer is fitted (under torch.distributed, a collective)."""
        unfitted = [index for index, router in self.routers.items() if not bool(router.fitted)]
        if not unfitted:
            return None
        banked, needed, k, s = self.num_states(), self.min_states, self.num_clusters, self.settings
        ways = []
        if banked >= k:
            ways.append(f"pass min_states={banked} or less (not below num_clusters={k})")
        elif banked:
            few = f"num_clusters={banked // 32} or fewer (min_states defaults to 32 states per cluster), or " \
                if banked >= 32 else ""
            ways.append(f"use fewer clusters than {k}: {few}num_clusters={banked} or fewer with min_states={banked}")
        more = "train on more data or for more steps"
        if k > s.memory_size:
            more += f" with memory_size at least {k} (now {s.memory_size}, which cannot hold {k} states)"
        ways.append(more)
        layers = ", ".join(str(index) for index in unfitted)
        return (f"training ended with the centroids of cluster layer{'s' if len(unfitted) > 1 else ''} {layers} never "
                f"fitted: K-Means waits for {needed} banked states per layer (min_states, at least num_clusters={k}) "
                f"and {banked} were banked; to fit them, {', or '.join(ways)}. Until then those layers route by "
                "random centroids.")

    # -- persistence ---------------------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Progress (JSON-serialisable): ``step_count``, ``last_update_step``, ``num_updates``."""
        return {
            "step_count": self.step_count,
            "last_update_step": self.last_update_step,
            "num_updates": self.num_updates,
        }

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
