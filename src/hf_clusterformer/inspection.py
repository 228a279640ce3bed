"""Which tokens share a cluster (paper Table 6): cluster contents, sizes and a cluster-vs-position plot."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from hf_clusterformer_files import check_not_a_file

from .configuration_clusterformer import ROUTED_LAYER_TYPES
from .modeling_clusterformer import ClusterFormerPreTrainedModel, check_finite, locate_question_prefix


@dataclass
class ClusterMember:
    """One clustered state: its token text, its position in the input, its window, whether it is a question
    copy, and the chunk (of the sorted states) the layer processes it in."""

    token: str
    position: int
    window: int
    is_question: bool
    chunk: int = 0


@dataclass
class ClusterReport:
    """Clusters of one cluster layer for one input.

    clusters: cluster id -> members in sorted (chunk) order.
    sizes: cluster id -> number of members.
    chunk_size: m, members are processed in consecutive chunks of this many states.
    """

    layer: int
    clusters: dict[int, list[ClusterMember]] = field(default_factory=dict)
    chunk_size: int = 0

    @property
    def sizes(self) -> dict[int, int]:
        return {cluster: len(members) for cluster, members in self.clusters.items()}

    def max_span(self, cluster: int) -> int:
        """Largest distance in tokens between two context members of a cluster."""
        positions = [m.position for m in self.clusters[cluster] if not m.is_question]
        return max(positions) - min(positions) if len(positions) > 1 else 0

    def repeated_token_colocation(self, min_distance: int | None = None) -> tuple[int, int, float]:
        """How often far-apart occurrences of the same token meet: the mechanism the layer relies on.

        Counts the pairs of context states with the same token text at least ``min_distance`` tokens apart
        (default: the chunk size) and how many of them share a chunk. Returns ``(shared, pairs, chance)``,
        ``chance`` being the share expected if states fell into chunks at random (sum of squared chunk shares).
        """
        min_distance = max(1, self.chunk_size if min_distance is None else min_distance)
        by_token: dict[str, list[ClusterMember]] = {}
        by_token_chunk: dict[tuple[str, int], list[int]] = {}
        chunk_sizes: Counter[int] = Counter()
        for members in self.clusters.values():
            for member in members:
                chunk_sizes[member.chunk] += 1
                if not member.is_question:
                    by_token.setdefault(member.token, []).append(member.position)
                    by_token_chunk.setdefault((member.token, member.chunk), []).append(member.position)
        pairs = sum(_pairs_apart(positions, min_distance) for positions in by_token.values())
        shared = sum(_pairs_apart(positions, min_distance) for positions in by_token_chunk.values())
        total = sum(chunk_sizes.values())
        chance = sum((n / total) ** 2 for n in chunk_sizes.values()) if total else 0.0
        return shared, pairs, chance

    def format(self, max_clusters: int = 20, max_members: int = 12) -> str:
        """Text listing: the clusters with the widest spread first, a size histogram, and how often
        repeated tokens meet in a chunk."""
        if not self.clusters:
            return (f"Cluster layer {self.layer}: nothing was routed (no state of the input took part in a cluster), "
                    "so there are no clusters to list.")
        lines = [
            f"Cluster layer {self.layer}: {len(self.clusters)} non-empty clusters, chunks of {self.chunk_size} states"
        ]
        ranked = sorted(self.clusters, key=self.max_span, reverse=True)
        for cluster in ranked[:max_clusters]:
            members = self.clusters[cluster]
            shown = ", ".join(
                f"{m.token!r}@{m.position}{'(q)' if m.is_question else ''}" for m in members[:max_members]
            )
            more = f", … +{len(members) - max_members}" if len(members) > max_members else ""
            lines.append(
                f"  cluster {cluster:4d} size {len(members):5d} span {self.max_span(cluster):6d} tokens: {shown}{more}"
            )
        lines.append("Cluster size histogram (size: clusters):")
        histogram = Counter(_bucket(size) for size in self.sizes.values())
        for bucket in sorted(histogram, key=lambda b: int(b.split("-")[0])):
            lines.append(f"  {bucket:>11}: {'#' * histogram[bucket]} {histogram[bucket]}")
        shared, pairs, chance = self.repeated_token_colocation()
        if pairs:
            lines.append(
                f"Same token at least {self.chunk_size} tokens apart, same chunk: {shared} of {pairs} pairs "
                f"({_percent(shared / pairs)}; {_percent(chance)} if chunks were drawn at random)"
            )
        return "\n".join(lines)

    def plot(self, path: str | Path, overwrite: bool = False) -> Path:
        """Scatter of cluster id against token position, written to ``path`` (a ``.png``, ``.pdf`` or ``.svg``
        file; an existing one only with ``overwrite``: see `check_plot_path`). Needs matplotlib:
        ``pip install hf-clusterformer[plot]``."""
        path = check_plot_path(path, overwrite)
        try:
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError as error:
            raise ImportError("Plotting needs matplotlib: pip install 'hf-clusterformer[plot]'") from error
        figure, axis = plt.subplots(figsize=(10, 4))
        # Question copies (all near position 0) are drawn large and on top, so that they stay visible.
        for is_question, style in ((False, dict(s=4, c="tab:blue", label="context", zorder=2)),
                                   (True, dict(s=30, c="tab:red", marker="x", label="question copies", zorder=3))):
            xs = [m.position for members in self.clusters.values() for m in members if m.is_question == is_question]
            ys = [c for c, members in self.clusters.items() for m in members if m.is_question == is_question]
            axis.scatter(xs, ys, **style)
        axis.set_xlabel("token position")
        axis.set_ylabel("cluster id")
        axis.set_title(f"Cluster layer {self.layer}")
        axis.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)  # outside the points
        path.parent.mkdir(parents=True, exist_ok=True)  # a new folder, as export and train make theirs
        figure.savefig(path, dpi=120, bbox_inches="tight")
        plt.close(figure)
        return path


#: File suffixes a cluster plot can be written as (the suffix picks the format).
PLOT_FORMATS = (".png", ".pdf", ".svg")


def check_plot_path(path: str | Path, overwrite: bool = False) -> Path:
    """``path`` as a `Path` where a plot may be written: a ``.png``, ``.pdf`` or ``.svg`` file (its folder made when
    missing), not a folder itself, and not an existing file unless ``overwrite``; else one-line errors naming it
    (`IsADirectoryError`, `FileExistsError`, `NotADirectoryError`, `ValueError`)."""
    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(f"{path} is a folder; give an image file name such as {path / 'clusters.png'}.")
    if path.suffix.lower() not in PLOT_FORMATS:
        raise ValueError(f"{path} is not a {', '.join(PLOT_FORMATS)} file name; the suffix picks the image format.")
    if path.exists() and not overwrite:
        raise FileExistsError(
            f"{path} exists; pass --overwrite (overwrite=True) to replace it, or give another file name."
        )
    check_not_a_file(path.resolve().parent)
    return path


def _pairs_apart(positions: list[int], min_distance: int) -> int:
    """Number of pairs of distinct ``positions`` at least ``min_distance`` (>= 1) apart, in O(n log n)."""
    ordered = np.sort(np.asarray(positions))
    return int((len(ordered) - np.searchsorted(ordered, ordered + min_distance, side="left")).sum())


def _percent(share: float) -> str:
    """``share`` as a percentage, whole below 100% and down to 1%, with two significant digits below (0.13%), so
    that a small share is not shown as 0%."""
    if share == 0 or share >= 0.01:
        return f"{share:.0%}"
    return f"{share * 100:.{1 - int(np.floor(np.log10(share * 100)))}f}%"


def _bucket(size: int) -> str:
    low = 1
    while low * 2 <= size:
        low *= 2
    return f"{low}-{low * 2 - 1}"


@torch.no_grad()
def _routed_layers(model: ClusterFormerPreTrainedModel, question: str, context: str) -> list[int]:
    """The routed layers of ``model``; `ValueError` (one line) for none, an empty input, or NaN / inf weights."""
    routed_layers = [i for i, kind in enumerate(model.config.layer_kinds) if kind in ROUTED_LAYER_TYPES]
    if not routed_layers:
        raise ValueError(
            f"This model has no cluster or LSH layers to inspect, nor window_cluster ones (layer_kinds "
            f"{model.config.layer_kinds}); give a model with a cluster layer."
        )
    if not context.strip():
        raise ValueError("The context is empty.")
    if not question.strip():
        raise ValueError("The question is empty.")
    check_finite(model)  # NaN states would sort into arbitrary clusters: a report of nothing
    return routed_layers


def inspect_clusters(
    model: ClusterFormerPreTrainedModel,
    tokenizer,
    question: str,
    context: str,
    layer: int | None = None,
) -> ClusterReport:
    """Run one question + context and report the clusters of a routed layer (cluster, LSH or window_cluster: its
    router's ids, with the chunks of m its sorted states fall into).

    Args:
        model: a Cluster-Former model (base or QA).
        tokenizer: its tokenizer.
        question, context: the input.
        layer: encoder layer index of a routed layer (default: the first one).

    `ValueError` (one line) for a layer that is not routed, an empty input, or weights that are NaN or inf.
    """
    config = model.config
    routed_layers = _routed_layers(model, question, context)
    if layer is None:
        layer = routed_layers[0]
    if layer not in routed_layers:
        depth = config.num_hidden_layers
        what = (f"the model has {depth} layers (0 to {depth - 1})" if not 0 <= layer < depth else
                f"it is a {config.layer_kinds[layer]} layer, which routes nothing")
        raise ValueError(f"Layer {layer} cannot be inspected: {what}; choose a routed layer, one of {routed_layers}.")
    encoding = tokenizer(question, context, return_tensors="pt")
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    base = model.base_model
    outputs = base(
        encoding["input_ids"].to(device),
        attention_mask=encoding["attention_mask"].to(device),
        output_cluster_assignments=True,
    )
    model.train(was_training)
    ids = outputs.cluster_assignments[routed_layers.index(layer)][0].cpu()  # (L,)
    token_index = outputs.window_token_index[0].cpu()  # (K, S)
    slots = token_index.shape[1]
    tokens = tokenizer.convert_ids_to_tokens(encoding["input_ids"][0])
    prefix = int(locate_question_prefix(encoding["input_ids"] == config.separator_token_id)[0][0])
    report = ClusterReport(layer=layer, chunk_size=config.window_stride)
    order = torch.sort(ids.masked_fill(ids < 0, torch.iinfo(ids.dtype).max), stable=True).indices
    for rank, flat in enumerate(order.tolist()):  # clustered states sort first, so rank // m is their chunk
        cluster = int(ids[flat])
        if cluster < 0:
            continue
        position = int(token_index.view(-1)[flat])
        text = tokenizer.convert_tokens_to_string([tokens[position]]).strip() or tokens[position]
        report.clusters.setdefault(cluster, []).append(
            ClusterMember(token=text, position=position, window=flat // slots, is_question=position < prefix,
                          chunk=rank // config.window_stride)
        )
    return report


__all__ = ["inspect_clusters"]
