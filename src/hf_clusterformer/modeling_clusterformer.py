"""Cluster-Former (Wang et al., 2021): RoBERTa layers over sliding windows plus clustering-based global layers.

Reading guide, top to bottom:

1. Windowing: a pair encoding ``<s> Q </s></s> C </s>`` becomes K windows ``[<s> Q </s></s>; C[m*k : m*k + l]]``
   (`build_window_layout`); window states go back to token order by averaging every copy of a token
   (`windows_to_tokens`) and forth again by gathering (`tokens_to_windows`). Between layers, when every token lies
   in at most two windows (l <= 2m), only the l - m copies each pair of neighbouring windows shares are merged, in
   place (`overlap_slots`, `merge_overlaps_`); `share_context_states` is the general form. A single text
   ``<s> T </s>`` has only ``<s>`` as every window's prefix (`single_text_rows`, by `INPUT_FORMATS`).
2. Sorting: states with cluster ids are stably sorted by (id, position), cut into chunks of ``m``, and put
   back by scattering with the same permutation (`sort_into_chunks`, `unsort_from_chunks`).
3. Routers map states to ids: `ClusterRouter` (cosine argmax against K-Means centroids, paper eq. 4) and
   `LSHRouter` (random hyperplanes, Reformer). `order_centroids_greedy` is the paper's GetCentroids ordering.
4. `ClusterFormerModel` locates the question prefix (`locate_question_prefix`), runs RoBERTa's embeddings per
   window, and `ClusterFormerEncoder` runs every encoder layer by its type: a sliding-window layer (eq. 1-3), a
   cluster/LSH layer (eq. 4-8) or a sparse cross-window layer, each as ONE batched call.
5. Heads on `ClusterFormerModel`: `ClusterFormerForQuestionAnswering` (pairs) and, subclassing their RoBERTa
   classes, `ClusterFormerForMaskedLM` (single texts), `ClusterFormerForSequenceClassification`,
   `ClusterFormerForTokenClassification` (single texts or pairs) and `ClusterFormerForMultipleChoice` (pairs).

Weights never trained (just before `ClusterFormerPreTrainedModel`): `mark_untrained` records in the config which
weights were newly initialised, with a fingerprint of their values (`from_pretrained` records those a checkpoint
lacks); `check_trained` refuses them while they keep those values (`UntrainedModelError`), and NaN/inf weights
(`check_finite`). The QA pipeline and export read the record. It lives here, with the model, so this file's copy in a
Hub checkpoint (loaded with ``trust_remote_code=True``) records and checks as the package does.

Shapes: B batch, T input length, K windows per example, S slots per window (longest question prefix + l),
L = K * S flat slots, d hidden size, m window stride (= chunk length), p number of clusters.

This file is self-contained for the Hub: it imports only torch, transformers and the configuration.
"""

from __future__ import annotations

import hashlib
import math
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn import CrossEntropyLoss
from transformers import PretrainedConfig
from transformers import initialization as init
from transformers.modeling_outputs import (
    MaskedLMOutput,
    ModelOutput,
    MultipleChoiceModelOutput,
    SequenceClassifierOutput,
    TokenClassifierOutput,
)
from transformers.models.roberta.modeling_roberta import (
    RobertaClassificationHead,
    RobertaEmbeddings,
    RobertaForMaskedLM,
    RobertaLayer,
    RobertaLMHead,
    RobertaPooler,
    RobertaPreTrainedModel,
)
from transformers.processing_utils import Unpack
from transformers.utils import TransformersKwargs, can_return_tuple, logging

try:  # package import
    from .configuration_clusterformer import (
        QUESTION_PREFIX_SPECIAL_TOKENS,
        ROUTED_LAYER_TYPES,
        ClusterFormerConfig,
    )
except ImportError:  # Hub copy loaded with trust_remote_code
    from configuration_clusterformer import (
        QUESTION_PREFIX_SPECIAL_TOKENS,
        ROUTED_LAYER_TYPES,
        ClusterFormerConfig,
    )

logger = logging.get_logger(__name__)


# ----------------------------------------------------------------------------------------------------------------
# 1. Windowing
# ----------------------------------------------------------------------------------------------------------------


def count_windows(context_length, window_size: int, window_stride: int):
    """Windows needed to cover a context: ``1 + ceil(max(0, c - l) / m)`` (one window when ``c <= l``).

    Works on ints and on tensors of lengths.
    """
    if isinstance(context_length, torch.Tensor):
        beyond = (context_length - window_size).clamp(min=0)
        return 1 + torch.div(beyond + window_stride - 1, window_stride, rounding_mode="floor")
    return 1 + max(0, math.ceil((context_length - window_size) / window_stride))


def count_routed_chunks(
    prefix_lengths: list[int], lengths: list[int], window_size: int, window_stride: int, question_prefix: bool = False
) -> int:
    """Chunks of m slots a routed layer runs per example, from the per-example lengths (host ints, no device sync).

    A routed layer sorts each context token once (its owner copy) plus, unless the chunks get the question as a
    prefix (``question_prefix``), the question-prefix copy of every window: ``c + p * count_windows(c, l, m)``
    slots for an example with prefix p and context c = length - p. The example with the most needs
    ``ceil(most / m)`` chunks.

    Args:
        prefix_lengths, lengths: per example, the question prefix and the real tokens (prefix + context).
        window_size, window_stride: l and m.
        question_prefix: ``config.chunk_question_prefix``.
    """
    most = max(
        (total - prefix)
        + (0 if question_prefix else prefix * count_windows(total - prefix, window_size, window_stride))
        for prefix, total in zip(prefix_lengths, lengths)
    )
    return math.ceil(most / window_stride)


@dataclass(frozen=True)
class BatchSizes:
    """The sizes a forward pass lays its batch out with: K windows, the prefix width S - l and C routed chunks per
    example.

    Eager forwards fill them from the batch (`of_rows`). An exported program gets K and S - l from the shapes of its
    size inputs and runs them with ``bounds`` (`for_program`): then nothing is read back or checked, every routed
    slot gets a chunk (C m > K S) and routed slots sort by the unique key id * L + position (ONNX has no stable
    sort); the extra windows and chunks are empty, so outputs are the same.
    """

    num_windows: int
    prefix_width: int
    routed_chunks: int
    bounds: bool = False

    @classmethod
    def of_rows(cls, config: ClusterFormerConfig, prefixes: list[int], totals: list[int]) -> BatchSizes:
        """The batch's own sizes from its per-example question prefix and real lengths (`locate_rows`)."""
        size, stride = config.window_size, config.window_stride
        return cls(
            num_windows=max(count_windows(t - p, size, stride) for p, t in zip(prefixes, totals)),
            prefix_width=max(prefixes),
            routed_chunks=count_routed_chunks(prefixes, totals, size, stride, config.chunk_question_prefix),
        )

    @classmethod
    def for_program(cls, config: ClusterFormerConfig, num_windows, prefix_width) -> BatchSizes:
        """What an exported program runs for K windows of prefix width S - l (ints or symbolic sizes): C = floor(K S
        / m) + 1 routed chunks, so every slot of the K S has one (C m > K S); at least as many as the batch's own."""
        slots = num_windows * (prefix_width + config.window_size)
        return cls(num_windows, prefix_width, slots // config.window_stride + 1, bounds=True)


@dataclass
class WindowLayout:
    """Where every window slot's token comes from.

    token_index: (B, K, S) long, position in the input sequence of each slot (0 for empty slots).
    valid: (B, K, S) bool, the slot holds a real token.
    is_context: (B, K, S) bool, the slot holds a context token (not the question prefix); implies ``valid``.
    owner: (B, K, S) bool, the slot is the copy of a context token that the cluster layer uses (the paper's
        ``H_k[0 : q + m]``: the first ``m`` context slots of window k, and the whole last window, so that every
        context token has exactly one owner copy, in window ``j // m`` or the last one).
    position_ids: (B, K, S) long, RoBERTa positions of a standalone ``<s> Q </s></s> window`` input.
    """

    token_index: torch.Tensor
    valid: torch.Tensor
    is_context: torch.Tensor
    owner: torch.Tensor
    position_ids: torch.Tensor

    @property
    def num_windows(self) -> int:
        return self.token_index.shape[1]


def locate_question_prefix(
    is_separator: torch.Tensor, starts: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Find the question prefix of pair encodings from their separators.

    The prefix ends at the first separator, plus the next token when it is a separator too, so both
    ``<s> Q </s></s> C </s>`` (RoBERTa) and ``[CLS] Q [SEP] C [SEP]`` (BERT) work. The question is what lies
    between the first token and the first separator.

    Args:
        is_separator: (B, T) bool, real tokens that are the separator.
        starts: optional (B,) long, index of each row's first real token (left padding); default 0.

    Returns:
        prefix_lengths: (B,) long, tokens of the question prefix.
        question_lengths: (B,) long, question tokens without special tokens.
        found: (B,) bool, the row has a separator (the other values of rows without one mean nothing).
    """
    length = is_separator.shape[1]
    positions = torch.arange(length, device=is_separator.device)
    first = torch.where(is_separator, positions, length).min(dim=1).values  # (B,)
    next_is_sep = torch.gather(is_separator, 1, (first + 1).clamp(max=length - 1).unsqueeze(1)).squeeze(1)
    next_is_sep = next_is_sep & (first + 1 < length)
    if starts is not None:
        first = first - starts
    return first + 1 + next_is_sep.long(), first - 1, is_separator.any(dim=1)


#: How a model reads its rows (the ``input_format`` argument of every forward, default: the class's
#: ``input_format``): ``"pair"`` a question/context pair ``<s> Q </s></s> C </s>`` whose question prefix every window
#: repeats (question answering, multiple choice); ``"single"`` one text ``<s> T </s>`` with only ``<s>`` (BERT:
#: ``[CLS]``) as every window's prefix (the masked-LM head: masked inputs may hold a separator anywhere, as the
#: collator's random replacements draw from the whole vocabulary); ``"auto"`` a pair when the row has a separator
#: before its last token (as ``tokenizer(text, text_pair)`` makes), else one text (``tokenizer(text)``); the base
#: model and the sequence and token classification heads.
INPUT_FORMATS = ("pair", "single", "auto")


def single_text_rows(
    input_format: str, found: torch.Tensor, prefix_lengths: torch.Tensor, lengths: torch.Tensor
) -> torch.Tensor:
    """Which rows are one text (prefix ``<s>``) rather than a question/context pair: the one rule of `INPUT_FORMATS`.

    Args:
        input_format: one of `INPUT_FORMATS`.
        found: (B,) bool, the row has a separator (`locate_question_prefix`).
        prefix_lengths: (B,) long, the question prefix `locate_question_prefix` found.
        lengths: (B,) long, real tokens of each row.

    Returns:
        (B,) bool. Under ``"auto"`` a row is a pair when its question prefix ends before its last token, so
        ``<s> T </s>`` and a row without any separator are single texts.
    """
    if input_format not in INPUT_FORMATS:
        raise ValueError(f"input_format must be one of {INPUT_FORMATS}, got {input_format!r}.")
    if input_format == "pair":
        return torch.zeros_like(found)
    if input_format == "single":
        return torch.ones_like(found)
    return ~(found & (prefix_lengths < lengths))


def build_window_layout(
    prefix_lengths: torch.Tensor,
    lengths: torch.Tensor,
    window_size: int,
    window_stride: int,
    num_windows: int,
    prefix_width: int,
    padding_idx: int = 1,
    starts: torch.Tensor | None = None,
) -> WindowLayout:
    """Lay out sliding windows ``[prefix; context[m*k : m*k + l]]`` for a batch.

    Args:
        prefix_lengths: (B,) tokens of the question prefix ``<s> Q </s></s>`` of each example.
        lengths: (B,) real tokens of each example (prefix + context).
        window_size: l, context tokens per window.
        window_stride: m, step between windows.
        num_windows: K, windows per example (at least `count_windows` of the longest context).
        prefix_width: longest prefix in the batch; S = prefix_width + l.
        padding_idx: RoBERTa's padding index; positions start at ``padding_idx + 1``.
        starts: optional (B,) index of each example's first token (left padding); default 0.

    Returns:
        `WindowLayout` with (B, K, S) tensors. Example b has ``count_windows(c_b, l, m)`` windows, the last one
        ending at or after its last token; the rest are empty.
    """
    device = lengths.device
    slots = torch.arange(prefix_width + window_size, device=device)  # (S,)
    windows = torch.arange(num_windows, device=device)  # (K,)
    prefix = prefix_lengths.view(-1, 1, 1)  # (B, 1, 1)
    context_length = (lengths - prefix_lengths).view(-1, 1, 1)
    windows_per_example = count_windows(context_length, window_size, window_stride)

    offset = slots.view(1, 1, -1) - prefix  # (B, 1, S) index into the window's context slice
    context_position = windows.view(1, -1, 1) * window_stride + offset  # (B, K, S)
    window_exists = windows.view(1, -1, 1) < windows_per_example  # (B, K, 1)
    in_prefix = offset < 0
    is_context = (offset >= 0) & (offset < window_size) & (context_position < context_length) & window_exists
    valid = (in_prefix & window_exists) | is_context
    token_index = torch.where(in_prefix, slots.view(1, 1, -1), prefix + context_position)
    if starts is not None:
        token_index = token_index + starts.view(-1, 1, 1)
    token_index = torch.where(valid, token_index, torch.zeros_like(token_index))
    last_window = windows.view(1, -1, 1) == windows_per_example - 1
    owner = is_context & ((offset < window_stride) | last_window)
    position_ids = torch.where(
        valid, slots.view(1, 1, -1) + padding_idx + 1, torch.full_like(token_index, padding_idx)
    )
    return WindowLayout(token_index, valid, is_context, owner, position_ids)


def windows_to_tokens(
    window_states: torch.Tensor, layout: WindowLayout, weight: torch.Tensor, length: int
) -> torch.Tensor:
    """Average the window copies of every token: (B, K, S, d) -> (B, T, d).

    Args:
        window_states: (B, K, S, d) states in window layout.
        layout: the `WindowLayout` of those windows.
        weight: (B, K, S) bool, which copies take part (e.g. ``layout.valid``); tokens with none get zeros.
        length: T, the input length.
    """
    batch, _, _, hidden = window_states.shape
    weight = weight.to(window_states.dtype).unsqueeze(-1)  # (B, K, S, 1)
    index = layout.token_index.reshape(batch, -1, 1)
    sums = window_states.new_zeros(batch, length, hidden).scatter_add(
        1, index.expand(-1, -1, hidden), (window_states * weight).reshape(batch, -1, hidden)
    )
    counts = window_states.new_zeros(batch, length, 1).scatter_add(1, index, weight.reshape(batch, -1, 1))
    return sums / counts.clamp(min=1)


def tokens_to_windows(token_states: torch.Tensor, layout: WindowLayout) -> torch.Tensor:
    """Gather token states into window layout: (B, T, d) -> (B, K, S, d)."""
    batch, _, hidden = token_states.shape
    index = layout.token_index.reshape(batch, -1, 1).expand(-1, -1, hidden)
    return torch.gather(token_states, 1, index).view(*layout.token_index.shape, hidden)


def share_context_states(
    window_states: torch.Tensor, layout: WindowLayout, sources: torch.Tensor, length: int
) -> torch.Tensor:
    """Give every copy of a context token the mean of its ``sources`` copies; question copies stay per window.

    Args:
        window_states: (B, K, S, d).
        layout: their `WindowLayout`.
        sources: (B, K, S) bool, the copies to average (all valid context copies after a sliding-window layer,
            the owner copies after a cluster layer).
        length: T.

    Returns:
        (B, K, S, d).
    """
    merged = tokens_to_windows(windows_to_tokens(window_states, layout, sources, length), layout)
    return torch.where(layout.is_context.unsqueeze(-1), merged, window_states)


def overlap_slots(
    layout: WindowLayout, window_size: int, window_stride: int
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The window slots whose tokens two neighbouring windows share, when every token lies in at most two windows.

    With ``m < l <= 2m``, window k's context offsets ``m .. l-1`` (its tail) hold the same tokens as window k+1's
    offsets ``0 .. l-m-1`` (its head), and no other token has two copies. The head copy is the owner (the token
    lies at ``(k+1) m + i`` with ``i < m``); the tail copy is not.

    Args:
        layout: the `WindowLayout` (B, K, S).
        window_size, window_stride: l and m.

    Returns:
        None when no token has two copies (``l == m``) or some have more than two (``l > 2m``); else
        index: (2, B * N) long slots ``(b * K + k) * S + s`` of the flattened (B * K * S) window slots: row 0 the tail
            copies of windows 0 .. K-1, row 1 the head copies of windows 1 .. K-1, pair by pair (N = K (l - m); the
            last window's tails pair with themselves, so no size is K - 1, which an exported program could not
            take for one or two windows);
        shared: (B * N, 1) bool, both copies of the pair hold a context token (the next window exists and the
            token is inside the context); other pairs are a single copy or padding and stay as they are.
    """
    width = window_size - window_stride
    if width <= 0 or width > window_stride:
        return None
    batch, windows, slots = layout.token_index.shape
    device = layout.token_index.device
    prefix = (layout.valid[:, 0] & ~layout.is_context[:, 0]).sum(-1)  # (B,) context starts at this slot
    example_start = torch.arange(batch, device=device) * (windows * slots)  # (B,)
    window = torch.arange(windows, device=device)  # (K,)
    offset = torch.arange(width, device=device) + window_stride  # (l-m,) tail offsets in the context slice
    tail = (example_start + prefix).view(-1, 1, 1) + (window * slots).view(1, -1, 1) + offset.view(1, 1, -1)
    has_next = (window < windows - 1).view(1, -1, 1).expand_as(tail).reshape(-1)  # (B * N,)
    tail = tail.reshape(-1)  # (B * N,)
    head = torch.where(has_next, tail + (slots - window_stride), tail)
    shared = (layout.is_context.reshape(-1)[head] & has_next).unsqueeze(-1)
    return torch.stack([tail, head]), shared


def merge_overlaps_(
    window_states: torch.Tensor, overlap: tuple[torch.Tensor, torch.Tensor], owner_only: bool
) -> torch.Tensor:
    """`share_context_states` for ``m < l <= 2m``, reading and writing only the overlapping copies (in place).

    One gather of the 2N overlapping copies and one scatter back (`index_select` / `index_copy_` over the flattened
    slots, whose backward needs no saved states, so the update can be in place): with ``owner_only`` (after a
    routed layer) the tail copy takes its owner's (the head's) state; otherwise (sliding and sparse layers) both
    take their mean.
    Single copies, question copies and padding are untouched, so the result equals `share_context_states` with
    ``sources = layout.owner`` or ``layout.is_context``.

    Args:
        window_states: (B, K, S, d); updated in place when it is contiguous, so pass a tensor the caller owns.
        overlap: ``(index (2, B * N), shared (B * N, 1))`` from `overlap_slots`.
        owner_only: copy the owner's state instead of averaging.

    Returns:
        (B, K, S, d), ``window_states`` itself when the update was in place.
    """
    index, shared = overlap
    flat = window_states.reshape(-1, window_states.shape[-1])  # (B * K * S, d)
    copies = flat.index_select(0, index.view(-1))  # (2 * B * N, d): tails, then heads
    tail, head = copies.chunk(2)
    if owner_only:
        flat.index_copy_(0, index[0], torch.where(shared, head, tail))
    else:
        mean = (tail + head) / 2
        new_tail, new_head = torch.where(shared.repeat(2, 1), torch.cat([mean, mean]), copies).chunk(2)
        # the last window's tails are listed as their own heads too: the second write of the same value carries no
        # gradient, so each copy's gradient is counted once
        new_head = torch.where((index[0] == index[1]).unsqueeze(-1), new_head.detach(), new_head)
        flat.index_copy_(0, index.view(-1), torch.cat([new_tail, new_head]))
    return flat.view_as(window_states)


# ----------------------------------------------------------------------------------------------------------------
# 2. Sorting into chunks
# ----------------------------------------------------------------------------------------------------------------


def sort_into_chunks(
    states: torch.Tensor, ids: torch.Tensor, chunk_size: int, sentinel: int, num_chunks: int | None = None,
    bounded: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Stably sort states by (id, position) and cut them into uniform chunks (paper eq. 6-7).

    Args:
        states: (B, L, d).
        ids: (B, L) long cluster ids; slots with ``sentinel`` (the largest id) sort last and are marked invalid.
        chunk_size: m.
        sentinel: id of slots that take no part.
        num_chunks: C, the leading chunks to keep (enough for every row's non-sentinel slots); default all,
            ``ceil(L / m)``. Chunks after them hold only sentinel slots.
        bounded: ``num_chunks`` is a bound with C m >= L (`BatchSizes.bounds`): keep C chunks as they are and sort
            the unique keys id * L + position (the same order; ONNX has no stable sort).

    Returns:
        chunks: (B * C, m, d);
        chunk_valid: (B * C, m) bool;
        order: (B, C * m) long, the flat slot each chunk position came from (the sorting permutation,
        padded with indices >= L that point at appended empty slots).

    Chunk positions of appended empty slots hold a copy of slot L - 1 (no padded copy of ``states`` is made);
    they are invalid, so attention never lets them reach a valid slot, and `unsort_from_chunks` drops them.
    """
    batch, length, hidden = states.shape
    if bounded:  # `BatchSizes.for_program`: C m > L
        total_chunks = num_chunks
    else:
        total_chunks = max(1, -(-length // chunk_size))  # integer ceil: exportable sizes
        num_chunks = total_chunks if num_chunks is None else max(1, min(num_chunks, total_chunks))
    padded = total_chunks * chunk_size
    if padded > length:
        ids = F.pad(ids, (0, padded - length), value=sentinel)
    if bounded:  # ONNX has no stable sort: sort the unique keys id * L + position instead
        keys = ids * ids.shape[1] + torch.arange(ids.shape[1], device=ids.device)
        order = torch.sort(keys, dim=1).indices[:, : num_chunks * chunk_size]
    else:
        order = torch.sort(ids, dim=1, stable=True).indices[:, : num_chunks * chunk_size]  # (B, C*m)
    source = order.clamp(max=length - 1) if padded > length else order
    sorted_states = torch.gather(states, 1, source.unsqueeze(-1).expand(-1, -1, hidden))
    chunk_valid = torch.gather(ids, 1, order) != sentinel
    return (
        sorted_states.view(batch * num_chunks, chunk_size, hidden),
        chunk_valid.view(batch * num_chunks, chunk_size),
        order,
    )


def unsort_from_chunks(
    chunks: torch.Tensor, order: torch.Tensor, length: int, fill: torch.Tensor | None = None, bounded: bool = False,
) -> torch.Tensor:
    """Invert `sort_into_chunks` by scattering (eq. 8): (B * C, m, d) -> (B, L, d).

    ``fill`` (B, L, d) gives the slots that no kept chunk holds; needed when `sort_into_chunks` kept fewer
    than all chunks. ``bounded``: as `sort_into_chunks` was given (every chunk kept, C m >= L).
    """
    batch, kept = order.shape
    hidden = chunks.shape[-1]
    flat = chunks.reshape(batch, kept, hidden)
    if bounded and kept >= length:  # `BatchSizes.for_program`: every chunk kept, C m > L, ``order`` a permutation
        # gather through the inverse permutation: an exported scatter of (B, L, d) states is slow in onnxruntime
        inverse = torch.empty_like(order).scatter_(1, order, torch.arange(kept, device=order.device).expand(batch, -1))
        return torch.gather(flat, 1, inverse[:, :length].unsqueeze(-1).expand(-1, -1, hidden))
    padded = max(kept, -(-length // max(1, chunks.shape[1])) * chunks.shape[1])
    if fill is None:
        if kept < length:
            raise ValueError(f"unsort_from_chunks got {kept} of {length} slots; pass fill for the others.")
        base = torch.empty_like(flat)
    else:  # a new tensor (``fill`` stays as it is), written in place below
        base = F.pad(fill, (0, 0, 0, padded - length)) if padded > length else fill.clone()
    restored = base.scatter_(1, order.unsqueeze(-1).expand(-1, -1, hidden), flat)
    return restored[:, :length].contiguous()  # the slice of a padded batch is not; later layers view it


def bidirectional_mask(valid: torch.Tensor, dtype: torch.dtype, implementation: str | None) -> torch.Tensor:
    """Attention mask over one sequence axis: real queries see real keys, empty slots see only themselves.

    The self-key for empty slots means no row is fully masked (no NaN, no uniform attention over pads) while
    a pad never reaches a real token.

    Args:
        valid: (N, S) bool.
        dtype: dtype of the attention scores, for the additive form.
        implementation: ``config._attn_implementation``; "eager" gets an additive float mask, others bool.

    Returns:
        (N, 1, S, S) bool (True = attend) or float (0 / dtype min).
    """
    size = valid.shape[-1]
    eye = torch.eye(size, dtype=torch.bool, device=valid.device)
    allowed = (valid[:, None, None, :] & valid[:, None, :, None]) | eye
    if implementation in (None, "eager"):
        return torch.zeros(allowed.shape, dtype=dtype, device=valid.device).masked_fill(
            ~allowed, torch.finfo(dtype).min
        )
    return allowed


# ----------------------------------------------------------------------------------------------------------------
# 3. Routers
# ----------------------------------------------------------------------------------------------------------------


@torch.no_grad()
def order_centroids_greedy(centroids: torch.Tensor) -> torch.Tensor:
    """The paper's GetCentroids ordering: start at row 0, then repeatedly the nearest unused row by cosine.

    Neighbouring ids then hold similar states, so uniform chunks of the id-sorted sequence join related clusters.

    Args:
        centroids: (p, d).

    Returns:
        (p, d), the same rows reordered.
    """
    unit = F.normalize(centroids.float(), dim=-1)
    similarity = unit @ unit.T  # (p, p)
    count = centroids.shape[0]
    used = torch.zeros(count, dtype=torch.bool, device=centroids.device)
    order = [0]
    used[0] = True
    for _ in range(count - 1):
        scores = similarity[order[-1]].masked_fill(used, -math.inf)
        nxt = int(scores.argmax())
        order.append(nxt)
        used[nxt] = True
    return centroids[torch.tensor(order, device=centroids.device)]


class Float32BuffersModule(nn.Module):
    """Keeps floating buffers in fp32 through ``model.to(dtype)`` / ``.half()``; devices still follow.

    A buffer that a conversion turned into another dtype is taken again from its fp32 original (no round trip
    through the lower precision); conversions that keep fp32 (device moves, ``to_empty``) stand as they are.
    """

    def _apply(self, fn, recurse=True):
        kept = {name: b for name, b in self._buffers.items() if b is not None and b.is_floating_point()}
        result = super()._apply(fn, recurse)
        for name, original in kept.items():
            converted = self._buffers[name]
            if converted.dtype != torch.float32:
                self._buffers[name] = original.to(device=converted.device, dtype=torch.float32)
        return result


class ClusterRouter(Float32BuffersModule):
    """Assigns states to the nearest centroid by cosine similarity (paper eq. 4), in fp32 with autocast off.

    Buffers (saved with the weights): ``centroids`` (p, d) float32 unit rows in GetCentroids order, and
    ``fitted`` (0-dim bool), False until K-Means has written centroids.
    """

    def __init__(self, config: ClusterFormerConfig, layer_index: int):
        super().__init__()
        self.num_clusters = config.num_clusters
        self.layer_index = layer_index
        self.seed = config.centroid_seed + layer_index
        self._shape = (config.num_clusters, config.hidden_size)
        self.register_buffer("centroids", self.initial_centroids())
        self.register_buffer("fitted", torch.zeros((), dtype=torch.bool))
        self._warned = False  # the never-fitted warning was given
        self._seen_fitted = False  # an eval-mode forward found `fitted` set (reset when buffers are loaded)
        self._seen_closed = False  # ... or its layer's routed path closed (reset when weights load or training starts)

    def initial_centroids(self) -> torch.Tensor:
        """Seeded random unit vectors in GetCentroids order (Algorithm 1, ``GetCentroids(RandomVector)``): (p, d).

        Drawn on the CPU (the same values on every device) and returned on the default device.
        """
        generator = torch.Generator().manual_seed(self.seed)
        vectors = torch.randn(self._shape, generator=generator, device="cpu")
        return order_centroids_greedy(F.normalize(vectors, dim=-1)).to(torch.get_default_device())

    def forward(self, states: torch.Tensor, representative: torch.Tensor) -> torch.Tensor:
        """Cluster ids of the representative slots: (B, L, d), (B, L) bool -> (B, L) long, p for the rest."""
        with torch.autocast(device_type=states.device.type, enabled=False):
            unit_states = F.normalize(states.float(), dim=-1)
            unit_centroids = F.normalize(self.centroids.float(), dim=-1)
            ids = (unit_states @ unit_centroids.T).argmax(dim=-1)
        return ids.masked_fill(~representative, self.num_clusters)


    def check_fitted(self, routing_matters: Callable[[], bool] = lambda: True) -> None:
        """Warn once that the centroids were never fitted, if ``routing_matters()``. Its layer's eval-mode forwards
        call it (outside compiled code); once it has warned, found them fitted, or found the routing taking no part in
        the outputs, it returns at once until weights load or training starts, so reading ``fitted`` (or the layer's
        weights) back from the device is not a per-forward cost."""
        if self._warned or self._seen_fitted or self._seen_closed:
            return
        if bool(self.fitted):
            self._seen_fitted = True
        elif routing_matters():
            logger.warning(
                f"Cluster layer {self.layer_index} runs with centroids that were never fitted by K-Means; "
                "train with hf_clusterformer.CentroidUpdateCallback (or CentroidUpdater) first."
            )
            self._warned = True
        else:
            self._seen_closed = True

    def train(self, mode: bool = True):
        if mode:
            self._seen_closed = False  # training may open the routed path
        return super().train(mode)

    def _load_from_state_dict(self, *args, **kwargs):
        self._seen_fitted = self._seen_closed = False  # loaded weights may be unfitted, or open the path: check again
        super()._load_from_state_dict(*args, **kwargs)


class LSHRouter(Float32BuffersModule):
    """Reformer-style hashing: bucket = argmax over ``[x R; -x R]`` with fixed random ``hash_vectors`` (d, p / 2)."""

    def __init__(self, config: ClusterFormerConfig, layer_index: int):
        super().__init__()
        self.num_clusters = config.num_clusters
        self.seed = config.centroid_seed + layer_index
        self._shape = (config.hidden_size, config.num_clusters // 2)
        self.register_buffer("hash_vectors", self.initial_hash_vectors())

    def initial_hash_vectors(self) -> torch.Tensor:
        """Seeded Gaussian projections, drawn on the CPU and returned on the default device: (d, p / 2)."""
        generator = torch.Generator().manual_seed(self.seed)
        return torch.randn(self._shape, generator=generator, device="cpu").to(torch.get_default_device())

    def forward(self, states: torch.Tensor, representative: torch.Tensor) -> torch.Tensor:
        """Bucket ids: (B, L, d), (B, L) bool -> (B, L) long, p for non-representative slots."""
        with torch.autocast(device_type=states.device.type, enabled=False):
            rotated = states.float() @ self.hash_vectors.float()
            ids = torch.cat([rotated, -rotated], dim=-1).argmax(dim=-1)
        return ids.masked_fill(~representative, self.num_clusters)


# ----------------------------------------------------------------------------------------------------------------
# 4. Model
# ----------------------------------------------------------------------------------------------------------------


class ClusterFormerLayer(RobertaLayer):
    """`RobertaLayer` (same parameter names) that also returns its attention weights."""

    def forward(self, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None = None, **kwargs):
        """(N, S, d), mask (N, 1, S, S) -> ((N, S, d), attention weights (N, h, S, S) or None).

        With ``config.chunk_size_feed_forward`` set, the feed-forward block runs on pieces of that many slots (the
        last one may be shorter; slot counts vary by layer type), which bounds its activations, not its outputs.
        """
        attention_output, attention_weights = self.attention(hidden_states, attention_mask, **kwargs)
        return self.feed_forward(attention_output), attention_weights

    def feed_forward(self, attention_output: torch.Tensor) -> torch.Tensor:
        """The feed-forward block, on pieces of ``chunk_size_feed_forward`` slots when set: (N, S, d) -> (N, S, d)."""
        chunk = self.chunk_size_feed_forward
        if not chunk or attention_output.shape[self.seq_len_dim] <= chunk:
            return self.feed_forward_chunk(attention_output)
        pieces = attention_output.split(chunk, dim=self.seq_len_dim)
        return torch.cat([self.feed_forward_chunk(piece) for piece in pieces], dim=self.seq_len_dim)


class LayerMasks:
    """The attention masks and routed-slot facts of one forward pass, built on first use and shared by layers.

    Args:
        layout: the batch's `WindowLayout` (B, K, S).
        dtype: dtype of the attention scores.
        implementation: ``config._attn_implementation``.
        chunk_size: m, the window stride, which is also the chunk length of the routed (cluster/LSH) layers.
        question_prefix: routed chunks get the question prefix in front (``config.chunk_question_prefix``).
        window_size: l (the prefix is the first ``S - l`` slots of a window).
        routed_chunks: chunks per example of the routed layers when the caller knows it (`count_routed_chunks`);
            default: counted from the layout, which reads a number back from the device.
        bounded: ``routed_chunks`` is an export bound (`BatchSizes.bounds`), given to `sort_into_chunks`.
    """

    def __init__(
        self, layout: WindowLayout, dtype: torch.dtype, implementation: str | None, chunk_size: int,
        question_prefix: bool = False, window_size: int = 0, routed_chunks: int | None = None, bounded: bool = False,
    ):
        self.window_size = window_size
        self.layout = layout
        self.dtype = dtype
        self.implementation = implementation
        self.chunk_size = chunk_size
        self.question_prefix = question_prefix
        self.bounded = bounded
        self._cache: dict[str, torch.Tensor | int] = {}
        if routed_chunks is not None:
            self._cache["routed_chunks"] = routed_chunks

    def _cached(self, name: str, build):
        if name not in self._cache:
            self._cache[name] = build()
        return self._cache[name]

    @property
    def window(self) -> torch.Tensor:
        """Mask of the sliding-window layers over (B * K, S) slots."""
        valid = self.layout.valid
        return self._cached(
            "window", lambda: bidirectional_mask(valid.view(-1, valid.shape[-1]), self.dtype, self.implementation)
        )

    @property
    def across(self) -> torch.Tensor:
        """Mask of the sparse layers over (B * S, K) slots at equal in-window position."""
        valid = self.layout.valid
        return self._cached(
            "across",
            lambda: bidirectional_mask(
                valid.transpose(1, 2).reshape(-1, valid.shape[1]), self.dtype, self.implementation
            ),
        )

    @property
    def representative(self) -> torch.Tensor:
        """(B, L) bool, the slots a routed layer sorts: each context token once, plus every window's question copy
        unless the chunks get the question as a prefix (``chunk_question_prefix``)."""
        layout = self.layout
        routed = layout.owner if self.question_prefix else layout.valid & (~layout.is_context | layout.owner)
        return self._cached("representative", lambda: routed.view(layout.valid.shape[0], -1))

    @property
    def routed_chunks(self) -> int:
        """Chunks a routed layer runs per example: enough for the example with the most representative slots."""
        return self._cached(
            "routed_chunks", lambda: math.ceil(int(self.representative.sum(dim=1).max()) / self.chunk_size)
        )

    @property
    def overlap(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The shared copies of neighbouring windows (`overlap_slots`), or None when l == m or l > 2m."""
        return self._cached("overlap", lambda: overlap_slots(self.layout, self.window_size, self.chunk_size))

    def share(self, window_states: torch.Tensor, owner_only: bool, length: int) -> torch.Tensor:
        """Every context copy takes the mean of its copies, or its owner's state with ``owner_only``: (B, K, S, d).

        Touches only the overlapping copies (`merge_overlaps_`, in place on ``window_states``, which the caller
        owns) when every token lies in at most two windows; else `share_context_states`.
        """
        if self.window_size <= self.chunk_size:  # l == m: every token has one copy
            return window_states
        overlap = self.overlap
        if overlap is None:
            sources = self.layout.owner if owner_only else self.layout.is_context
            return share_context_states(window_states, self.layout, sources, length)
        return merge_overlaps_(window_states, overlap, owner_only)

    def chunk(self, chunk_valid: torch.Tensor) -> torch.Tensor:
        """Mask of the routed layers over (B * C, m) chunks, or (B * C, P + m) with the question prefix in front;
        the same for all of them (representatives sort first)."""
        return self._cached("chunk", lambda: bidirectional_mask(chunk_valid, self.dtype, self.implementation))

    @property
    def prefix_slots(self) -> torch.Tensor:
        """(B, K, P) bool, the valid question-prefix slots of every window (P = S - l, the longest prefix)."""
        layout = self.layout
        width = layout.valid.shape[-1] - self.window_size
        return self._cached("prefix_slots", lambda: (layout.valid & ~layout.is_context)[..., :width])


@dataclass
class ClusterFormerEncoderOutput(ModelOutput):
    """Outputs of `ClusterFormerEncoder`.

    last_hidden_state: (B, K, S, d) window states after the last layer.
    hidden_states, attentions, cluster_assignments: see `ClusterFormerModelOutput`.
    """

    last_hidden_state: torch.Tensor | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None
    attentions: tuple[torch.Tensor | None, ...] | None = None
    cluster_assignments: tuple[torch.Tensor, ...] | None = None


class SlidingWindowLayer(ClusterFormerLayer):
    """A sliding-window layer: attention within every window, then every context token the mean of its copies
    (paper eq. 1-3)."""

    def forward_windows(
        self, states: torch.Tensor, masks: LayerMasks, length: int
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """(B, K, S, d) -> ((B, K, S, d), weights (B * K, h, S, S) or None, None)."""
        batch, windows, slots, hidden = states.shape
        out, weights = self(states.view(-1, slots, hidden), masks.window)
        return masks.share(out.view_as(states), False, length), weights, None


class SparseLayer(ClusterFormerLayer):
    """Attention across windows over the states at the same in-window slot (the paper's Sparse Attention)."""

    def forward_windows(
        self, states: torch.Tensor, masks: LayerMasks, length: int
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """(B, K, S, d) -> ((B, K, S, d), weights (B * S, h, K, K) or None, None)."""
        batch, windows, slots, hidden = states.shape
        across = states.transpose(1, 2).reshape(-1, windows, hidden)  # (B*S, K, d)
        out, weights = self(across, masks.across)
        out = out.view(batch, slots, windows, hidden).transpose(1, 2).contiguous()
        return masks.share(out, False, length), weights, None


class RoutedLayer(ClusterFormerLayer):
    """A cluster or LSH layer (paper eq. 4-8): its ``router`` (`ClusterRouter` or `LSHRouter`, by the layer's kind)
    gives each representative slot an id; slots are sorted by (id, position) into chunks of m, attend within chunks and
    are put back."""

    def __init__(self, config: ClusterFormerConfig, layer_idx: int):
        super().__init__(config, layer_idx=layer_idx)
        self.router = ROUTER_CLASSES[config.layer_kinds[layer_idx]](config, layer_idx)
        self.route_by = config.route_by

    def route(self, flat: torch.Tensor, masks: LayerMasks) -> torch.Tensor:
        """Cluster (bucket) ids of the representative slots by ``config.route_by``: the states themselves or their key
        projections: (B, L, d) -> (B, L) long."""
        if not self.training and isinstance(self.router, ClusterRouter) and not torch.compiler.is_compiling():
            self.router.check_fitted(self.routing_changes_outputs)
        routed = flat if self.route_by == "states" else self.attention.self.key(flat)
        return self.router(routed, masks.representative)

    def routing_changes_outputs(self) -> bool:
        """Whether the routing takes part in the outputs: always, but in a window_cluster layer whose routed path is
        still closed."""
        return True

    def forward_windows(
        self, states: torch.Tensor, masks: LayerMasks, length: int
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
        """Only chunks holding a representative slot run; the other slots keep their input states and take no part
        (repeated context copies take their owner's state, padding stays padding).

        (B, K, S, d) -> ((B, K, S, d), weights (B * C, h, m, m) or None, ids (B, L) with -1 for slots that took
        no part).
        """
        batch, _, _, hidden = states.shape
        flat = states.reshape(batch, -1, hidden)
        ids = self.route(flat, masks)
        chunks, chunk_valid, order = sort_into_chunks(flat, ids, masks.chunk_size, self.router.num_clusters,
                                                      masks.routed_chunks, masks.bounded)
        if masks.question_prefix:
            states, weights = self._attend_with_question_prefix(states, masks, chunks, chunk_valid, order)
        else:
            out, weights = self(chunks, masks.chunk(chunk_valid))
            states = unsort_from_chunks(out, order, flat.shape[1], fill=flat, bounded=masks.bounded).view_as(states)
        return masks.share(states, True, length), weights, ids.masked_fill(~masks.representative, -1)

    def _attend_with_question_prefix(
        self, states: torch.Tensor, masks: LayerMasks, chunks: torch.Tensor, chunk_valid: torch.Tensor,
        order: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """With ``chunk_question_prefix``: every chunk is ``[question prefix; m sorted context states]``.

        The prefix is the mean of the example's window copies of its question prefix; afterwards every window's
        copy takes the mean of the prefix outputs of the example's chunks that hold context (not empty ones).

        states (B, K, S, d); chunks (B * C, m, d), chunk_valid (B * C, m), order (B, C * m) as `sort_into_chunks`
        gives them -> (unshared states (B, K, S, d), weights (B * C, h, P + m, P + m) or None).
        """
        batch, _, _, hidden = states.shape
        prefix_valid = masks.prefix_slots  # (B, K, P)
        width = prefix_valid.shape[-1]
        weight = prefix_valid.unsqueeze(-1).to(states.dtype)
        prefix = (states[:, :, :width] * weight).sum(1) / weight.sum(1).clamp(min=1)  # (B, P, d)
        num_chunks = chunks.shape[0] // batch
        prefix_mask = prefix_valid.any(1).repeat_interleave(num_chunks, dim=0)  # (B * C, P)
        joined = torch.cat([prefix.repeat_interleave(num_chunks, dim=0), chunks], dim=1)  # (B * C, P + m, d)
        out, weights = self(joined, masks.chunk(torch.cat([prefix_mask, chunk_valid], dim=1)))
        flat = states.reshape(batch, -1, hidden)
        flat_out = unsort_from_chunks(
            out[:, width:], order, flat.shape[1], fill=flat, bounded=masks.bounded
        ).view_as(states)
        has_context = chunk_valid.any(1).view(batch, num_chunks, 1, 1).to(out.dtype)  # (B, C, 1, 1)
        prefix_out = (out[:, :width].view(batch, num_chunks, width, hidden) * has_context).sum(1)
        prefix_out = prefix_out / has_context.sum(1).clamp(min=1)  # (B, P, d)
        question = F.pad(prefix_valid, (0, states.shape[2] - width)).unsqueeze(-1)  # (B, K, S, 1)
        padded_prefix = F.pad(prefix_out, (0, 0, 0, states.shape[2] - width)).unsqueeze(1)  # (B, 1, S, d)
        return torch.where(question, padded_prefix.to(flat_out.dtype), flat_out), weights


class ZeroInitLinear(nn.Linear):
    """A linear map whose weight and bias start at zero (`ClusterFormerPreTrainedModel._init_weights`): a path added
    through it changes nothing until training moves it, and it is never recorded as untrained."""


class WindowClusterLayer(RoutedLayer):
    """A sliding-window layer with a cluster layer's attention added (kind ``window_cluster``, beyond the paper).

    Every slot attends within its window (`SlidingWindowLayer`) and, with the same query, key and value weights, within
    its cluster chunk (`RoutedLayer`'s routing, sort and chunks); the chunk's attention output enters beside the
    window's through ``routed_output`` (a `ZeroInitLinear`) before the residual sum and LayerNorm. With
    ``routed_output`` at zero the layer is its sliding-window layer exactly, so a converted checkpoint reads as the
    sliding-window model until training opens the routed path.
    """

    def __init__(self, config: ClusterFormerConfig, layer_idx: int):
        super().__init__(config, layer_idx=layer_idx)
        self.routed_output = ZeroInitLinear(config.hidden_size, config.hidden_size)

    def routing_changes_outputs(self) -> bool:
        """False while ``routed_output`` is all zero (the layer is its sliding-window layer, whatever the routing);
        reads it back from the device."""
        return bool(self.routed_output.weight.any() or self.routed_output.bias.any())

    def forward(self, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None = None,
                routed_context: torch.Tensor | None = None, **kwargs):
        """(N, S, d), mask (N, 1, S, S), the routed attention output of every slot (N, S, d) -> ((N, S, d), attention
        weights (N, h, S, S) or None)."""
        context, weights = self.attention.self(hidden_states, attention_mask, **kwargs)
        output = self.attention.output
        mixed = output.dropout(output.dense(context) + self.routed_output(routed_context))
        return self.feed_forward(output.LayerNorm(mixed + hidden_states)), weights

    def forward_windows(
        self, states: torch.Tensor, masks: LayerMasks, length: int
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
        """(B, K, S, d) -> ((B, K, S, d), window weights (B * K, h, S, S) or None, ids (B, L) with -1 for slots that
        took no part in the routed path). Repeated context copies take their owner's routed output, padding zeros."""
        batch, windows, slots, hidden = states.shape
        flat = states.reshape(batch, -1, hidden)
        ids = self.route(flat, masks)
        chunks, chunk_valid, order = sort_into_chunks(flat, ids, masks.chunk_size, self.router.num_clusters,
                                                      masks.routed_chunks, masks.bounded)
        routed, _ = self.attention.self(chunks, masks.chunk(chunk_valid))  # (B * C, m, d)
        routed = unsort_from_chunks(routed, order, flat.shape[1], fill=torch.zeros_like(flat), bounded=masks.bounded)
        routed = masks.share(routed.view_as(states), True, length).masked_fill(~masks.layout.valid.unsqueeze(-1), 0)
        # routed context positional: reentrant activation checkpointing takes only positional tensors as its inputs
        out, weights = self(states.view(-1, slots, hidden), masks.window, routed.view(-1, slots, hidden))
        return masks.share(out.view_as(states), False, length), weights, ids.masked_fill(~masks.representative, -1)


#: The router of each routed layer kind.
ROUTER_CLASSES = {"cluster": ClusterRouter, "lsh": LSHRouter, "window_cluster": ClusterRouter}
#: The module class of each layer kind (`ClusterFormerConfig.layer_kinds`), chosen when the model is built.
LAYER_CLASSES = {"sliding": SlidingWindowLayer, "sparse": SparseLayer, "cluster": RoutedLayer, "lsh": RoutedLayer,
                 "window_cluster": WindowClusterLayer}


def _rename_legacy_router_keys(module: nn.Module, state_dict: dict, prefix: str, *args) -> None:
    """``load_state_dict`` of a state dict from before routers lived in their layers: ``routers.{i}.*`` becomes
    ``layer.{i}.router.*`` (`LEGACY_KEY_MAPPING` does the same for ``from_pretrained``)."""
    legacy = prefix + "routers."
    for key in [k for k in state_dict if k.startswith(legacy)]:
        index, rest = key[len(legacy):].split(".", 1)
        state_dict[f"{prefix}layer.{index}.router.{rest}"] = state_dict.pop(key)


class ClusterFormerEncoder(nn.Module):
    """RoBERTa's layer stack (``layer.{i}``, the same parameter names), each layer of its kind's class
    (`LAYER_CLASSES`); a routed layer owns its router (``layer.{i}.router``).

    Every layer's ``forward`` is RoBERTa's layer (what gradient checkpointing recomputes); its ``forward_windows``
    runs it over the windows the way its kind does (routing stays outside the recomputed part).
    """

    def __init__(self, config: ClusterFormerConfig):
        super().__init__()
        self.config = config
        self.layer = nn.ModuleList(
            [LAYER_CLASSES[kind](config, layer_idx=i) for i, kind in enumerate(config.layer_kinds)]
        )
        self.register_load_state_dict_pre_hook(_rename_legacy_router_keys)

    @property
    def routers(self) -> dict[str, nn.Module]:
        """The routers of the routed layers by layer index (as a string)."""
        return {str(i): layer.router for i, layer in enumerate(self.layer) if isinstance(layer, RoutedLayer)}

    def forward(
        self,
        states: torch.Tensor,
        layout: WindowLayout,
        length: int,
        output_hidden_states: bool = False,
        output_attentions: bool = False,
        output_cluster_assignments: bool = False,
        routed_chunks: int | None = None,
        bounded: bool = False,
    ) -> ClusterFormerEncoderOutput:
        """Run the layers over embedded windows.

        Args:
            states: (B, K, S, d) window embeddings.
            layout: their `WindowLayout`.
            length: T, the input length (for token-aligned hidden states).
            output_hidden_states / output_attentions / output_cluster_assignments: extra outputs.
            routed_chunks: chunks per example of the routed layers (`count_routed_chunks`); default: counted from
                the layout, which reads a number back from the device.
            bounded: ``routed_chunks`` is an export bound (`BatchSizes.bounds`).

        Returns:
            `ClusterFormerEncoderOutput` with (B, K, S, d) ``last_hidden_state``.
        """
        masks = LayerMasks(layout, states.dtype, self.config._attn_implementation, self.config.window_stride,
                           self.config.chunk_question_prefix, self.config.window_size, routed_chunks, bounded)
        all_hidden = (windows_to_tokens(states, layout, layout.valid, length),) if output_hidden_states else None
        all_attentions = () if output_attentions else None
        assignments = () if output_cluster_assignments else None
        for layer in self.layer:
            states, weights, ids = layer.forward_windows(states, masks, length)
            if output_hidden_states:
                all_hidden = all_hidden + (windows_to_tokens(states, layout, layout.valid, length),)
            if output_attentions:
                all_attentions = all_attentions + (weights,)
            if output_cluster_assignments and ids is not None:
                assignments = assignments + (ids,)
        return ClusterFormerEncoderOutput(
            last_hidden_state=states,
            hidden_states=all_hidden,
            attentions=all_attentions,
            cluster_assignments=assignments,
        )


@dataclass
class ClusterFormerModelOutput(ModelOutput):
    """Outputs of `ClusterFormerModel`.

    last_hidden_state: (B, T, d) aligned with the input; context tokens merged over windows, question tokens the
        mean of their per-window copies, padding zeros.
    pooler_output: (B, d) the mean of the windows' ``<s>`` states (through RoBERTa's pooler when present).
    hidden_states: optional tuple of (B, T, d), embeddings and every layer, aligned like ``last_hidden_state``.
    attentions: optional tuple per layer of (N, h, S, S) in that layer's own layout (windows, chunks or positions);
        None entries under attention implementations that return no weights (sdpa).
    cluster_assignments: optional tuple per cluster/LSH layer of (B, L) ids over flat window slots, -1 where the slot
        took no part (padding or a repeated context copy).
    window_token_index: optional (B, K, S) input position of every window slot, -1 for empty slots; flattened to
        (B, L) it maps ``cluster_assignments`` to tokens.
    """

    last_hidden_state: torch.Tensor | None = None
    pooler_output: torch.Tensor | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None
    attentions: tuple[torch.Tensor | None, ...] | None = None
    cluster_assignments: tuple[torch.Tensor, ...] | None = None
    window_token_index: torch.Tensor | None = None


class ClusterFormerKwargs(TransformersKwargs, total=False):
    """Keyword arguments of every Cluster-Former forward, beside its inputs and labels.

    question_lengths: (B,) length of each row's question prefix ``<s> Q </s></s>`` in tokens; by default it ends at
        the first separator and the separator right after it.
    input_format: one of `INPUT_FORMATS`: ``"pair"``, ``"single"`` or ``"auto"`` (default: the class's
        ``input_format``; ``"auto"``: rows of ``tokenizer(text)`` are single texts, of ``tokenizer(text, pair)``
        pairs).
    output_cluster_assignments: return the routed layers' ids per slot and every slot's token index.
    batch_sizes: the layout's sizes (`BatchSizes`); default: the batch's own (export passes its bounds).
    """

    question_lengths: torch.Tensor | list[int] | None
    input_format: str | None
    output_cluster_assignments: bool
    batch_sizes: BatchSizes | None


#: Checkpoint key renames applied on load: router buffers saved beside the layer stack now live in their layer.
LEGACY_KEY_MAPPING = {r"encoder\.routers\.(\d+)\.": r"encoder.layer.\1.router."}


# ----------------------------------------------------------------------------------------------------------------
# Weights never trained, or broken: the record of newly initialised weights, and NaN/inf weights refused
# ----------------------------------------------------------------------------------------------------------------

#: Config attribute naming the weights that were newly initialised (a QA head added to an encoder) and a fingerprint
#: of their initial values: while the weights still have those values, the model was never trained. The record is
#: kept by this file, so a checkpoint's own copy of it (loaded with ``trust_remote_code=True``) keeps and reads it too.
UNTRAINED_WEIGHTS = "untrained_weights"


class UntrainedModelError(ValueError):
    """The model's QA head was newly initialised and never trained, so its answers would be random."""


def _same_file_content(first: str, second: str) -> bool:
    """Whether both files exist and hold the same bytes."""
    if not (os.path.isfile(first) and os.path.isfile(second)):
        return False
    with open(first, "rb") as a, open(second, "rb") as b:
        return a.read() == b.read()


def non_finite_weights(model: nn.Module) -> list[str]:
    """Names of the floating-point parameters and buffers of ``model`` holding a NaN or inf (empty when all are
    finite; tensors on the meta device are skipped)."""
    tensors = [(name, t) for name, t in [*model.named_parameters(), *model.named_buffers()]
               if t.is_floating_point() and t.device.type != "meta"]
    if not tensors or math.isfinite(float(sum(t.detach().float().sum() for _, t in tensors))):
        return []
    return [name for name, t in tensors if not bool(torch.isfinite(t.detach()).all())]


def _weights_fingerprint(model: nn.Module, names: list[str]) -> str:
    """sha256 of the named weights, rounded to bfloat16 (so that float32, float16 and bfloat16 loads agree)."""
    tensors = dict(model.named_parameters())
    digest = hashlib.sha256()
    for name in sorted(names):
        digest.update(name.encode())
        values = tensors[name].detach().to(device="cpu", dtype=torch.bfloat16).float().contiguous()
        digest.update(values.numpy().tobytes())
    return digest.hexdigest()


def mark_untrained(model: nn.Module, names: list[str]) -> None:
    """Record in ``model.config`` that the parameters ``names`` were newly initialised (nothing when none are)."""
    parameters = dict(model.named_parameters())
    names = sorted(name for name in names if name in parameters)
    if names:
        setattr(model.config, UNTRAINED_WEIGHTS, {"names": names, "sha256": _weights_fingerprint(model, names)})


def untrained_weights(model: nn.Module) -> list[str]:
    """The newly initialised parameters of ``model`` that still hold their initial values (empty once trained, or
    when nothing was recorded)."""
    record = getattr(model.config, UNTRAINED_WEIGHTS, None)
    if not isinstance(record, dict) or not record.get("names"):
        return []
    parameters = dict(model.named_parameters())
    names = [name for name in record["names"] if name in parameters]
    if names and _weights_fingerprint(model, names) == record.get("sha256"):
        return names
    return []


def check_trained(model: nn.Module, allow_untrained: bool = False, head: str = "QA") -> None:
    """Raise `UntrainedModelError` when ``model`` answers with weights that were never trained (see
    `mark_untrained`), unless ``allow_untrained`` (smoke tests); then `check_finite`."""
    names = untrained_weights(model)
    check_finite(model)
    if names and not allow_untrained:
        source = getattr(model, "name_or_path", None) or "DIR"
        how = f" (`clusterformer train --model_name_or_path {source} ...`)" if head == "QA" else ""
        raise UntrainedModelError(
            f"the {head} head of this model ({', '.join(names)}) was newly initialised and never trained, so its "
            f"answers would be random; fine-tune it first{how}, or pass "
            "allow_untrained=True (--allow-untrained) for a smoke test."
        )


def check_finite(model: nn.Module) -> None:
    """Raise `ValueError` in one line when a weight of ``model`` is NaN or inf (every output would be meaningless)."""
    broken = non_finite_weights(model)
    if broken:
        raise ValueError(f"this {type(model).__name__} holds weights that are NaN or inf ({len(broken)} tensors: "
                         f"{', '.join(broken[:3])}{', ...' if len(broken) > 3 else ''}), so every output would be "
                         "meaningless; load an earlier checkpoint, or train again (with a lower learning rate).")


def check_finite_outputs(model: nn.Module, *outputs: torch.Tensor | None) -> None:
    """Raise `ValueError` in one line when one of ``outputs`` (of ``model``) holds a NaN or inf: for its weights
    (`check_finite`, weights that turned NaN after it was loaded) or, with finite weights, for the outputs."""
    if all(t is None or bool(torch.isfinite(t.detach()).all()) for t in outputs):
        return
    check_finite(model)
    raise ValueError(f"this {type(model).__name__} gave NaN or inf outputs although its weights are finite (an "
                     "overflow, e.g. in float16), so no answer can be read from them; run it in float32.")


#: Parts of parameter names whose fresh values belong to the model's design, never recorded as untrained: the router
#: buffers (centroids are fitted, not trained) and a window_cluster layer's routed projection (its zero is the start).
DESIGNED_STARTS = (".router.", ".routed_output.")


def drawn_weights(keys) -> list[str]:
    """The names among ``keys`` (parameters a model had to initialise) that were drawn at random: all but
    `DESIGNED_STARTS`."""
    return [key for key in keys if not any(part in key for part in DESIGNED_STARTS)]


class _HeldLoadReport:
    """A filter of transformers' loading logger that holds back its load report (and its note on tied weights that a
    drawn head lacks) of one ``from_pretrained``, so that it shows only where this file says less (`release`)."""

    def __init__(self):
        self.logger, self.held = logging.get_logger("transformers.modeling_utils"), []

    def filter(self, record) -> bool:
        message = record.getMessage()
        if "LOAD REPORT" in message or "seem corrupted. The tied weights" in message:
            self.held.append(record)
            return False
        return True

    def __enter__(self) -> _HeldLoadReport:
        if self.logger.getEffectiveLevel() > logging.INFO:  # asked for details (-v, info): the report as it is
            self.logger.addFilter(self)
        return self

    def __exit__(self, kind, *exc) -> None:
        self.logger.removeFilter(self)
        if kind is not None:
            self.release()

    def release(self, info: dict | None = None, prefix: str = "") -> None:
        """Let the held report through, unless ``info`` (the load's) holds only what this file says itself: weights
        drawn for a head (`_record_new_weights`), router buffers (`DESIGNED_STARTS`) and another head's weights."""
        if info is not None and not info.get("mismatched_keys") and not any(
                key.startswith(f"{prefix}.") for key in drawn_weights(info.get("missing_keys", ()))):
            return
        for record in self.held:
            self.logger.handle(record)


#: Marks the log record of a head drawn at load (`_record_new_weights`), for callers that say it themselves to drop.
DRAWN_HEAD_RECORD = "clusterformer_drawn_head"


def _record_new_weights(model: nn.Module, missing_keys) -> None:
    """Record the parameters `from_pretrained` initialised because the checkpoint lacks them (`drawn_weights`)
    as untrained in ``model.config`` (`mark_untrained`), with those recorded before that are still untrained, so that
    a head drawn at load and saved as it is (through the Auto classes too) is known as untrained: export and the QA
    pipeline refuse it until the weights change. A checkpoint's own copy of this file records the same way.

    A head drawn at load is also said in one warning, for callers that check nothing (``transformers.pipeline`` of
    another head on a folder)."""
    new = drawn_weights(missing_keys)
    if new:
        mark_untrained(model, sorted(set(new) | set(untrained_weights(model))))
    head = sorted(key for key in new if not key.startswith(f"{model.base_model_prefix}."))
    if head:
        logger.warning(
            f"{type(model).__name__}: the checkpoint has no weights for {', '.join(head[:4])}"
            f"{', ...' if len(head) > 4 else ''}, so this head was drawn at random and its outputs mean nothing until "
            "it is trained; fine-tune it first, or load the class of the checkpoint's own head.",
            extra={DRAWN_HEAD_RECORD: True},
        )


class ClusterFormerPreTrainedModel(RobertaPreTrainedModel):
    """Weight initialisation and loading shared by the Cluster-Former models.

    Router buffers (centroids, hash vectors) stay fp32 under any ``dtype``: ``_keep_in_fp32_modules_strict``
    names the routers when the model has any.
    """

    config_class = ClusterFormerConfig
    config: ClusterFormerConfig
    _supports_flash_attn = False
    _supports_flex_attn = False
    _supports_attention_backend = False
    _keep_in_fp32_modules_strict = ["router"]
    # Hidden states are token-aligned means over window copies, which no module returns: they are built in
    # ClusterFormerEncoder.forward, not recorded by transformers' output-capture hooks.
    _can_record_outputs = None

    def __init__(self, config: ClusterFormerConfig, *inputs, **kwargs):
        super().__init__(config, *inputs, **kwargs)
        if not any(kind in ROUTED_LAYER_TYPES for kind in config.layer_kinds):
            self._keep_in_fp32_modules_strict = []  # no routers to keep

    def _init_weights(self, module):
        if isinstance(module, ClusterRouter):
            init.copy_(module.centroids, module.initial_centroids())
            init.copy_(module.fitted, torch.zeros((), dtype=torch.bool))
            module._seen_fitted = module._seen_closed = False
        elif isinstance(module, LSHRouter):
            init.copy_(module.hash_vectors, module.initial_hash_vectors())
        elif isinstance(module, ZeroInitLinear):
            init.zeros_(module.weight)
            init.zeros_(module.bias)
        else:
            super()._init_weights(module)

    @classmethod
    def from_pretrained(cls, *args, **kwargs):
        """`PreTrainedModel.from_pretrained`, with a clear error when saved centroids do not fit the options; router
        buffers saved under ``encoder.routers.{i}`` (checkpoints from before routers lived in their layers) load into
        ``encoder.layer.{i}.router``. Weights the checkpoint lacks (a head added to an encoder or to another head's
        checkpoint, as the Auto classes load one) are recorded as untrained (`_record_new_weights`)."""
        if args and not kwargs.get("ignore_mismatched_sizes") and kwargs.get("config") is None:
            try:
                cls._check_shape_overrides(args[0], kwargs)
            except ValueError as error:  # a value of the file (ConfigValueError) is named with the file
                if not hasattr(error, "at"):
                    raise
                raise error.at(args[0]) from None
        kwargs["key_mapping"] = {**LEGACY_KEY_MAPPING, **(kwargs.get("key_mapping") or {})}
        loading_info = kwargs.get("output_loading_info", False)
        with _HeldLoadReport() as report:  # transformers' table only where the one-line note below says less
            model, info = super().from_pretrained(*args, **{**kwargs, "output_loading_info": True})
        report.release(info, model.base_model_prefix)
        # transformers saves a model with the reverse of the renames it was loaded with: the legacy one is load-only
        conversions = getattr(model, "_weight_conversions", None)
        if conversions:
            kept = [
                c for c in conversions if not set(getattr(c, "source_patterns", None) or ()) & set(LEGACY_KEY_MAPPING)
            ]
            model._weight_conversions = kept or None
        _record_new_weights(model, info["missing_keys"])
        broken = non_finite_weights(model)
        if broken:
            raise ValueError(
                f"{args[0] if args else 'the checkpoint'} holds weights that are NaN or inf ({len(broken)} tensors: "
                f"{', '.join(broken[:3])}{', ...' if len(broken) > 3 else ''}), so every answer from it would be "
                "meaningless; use an earlier checkpoint, or train again (with a lower learning rate if it diverged)."
            )
        return (model, info) if loading_info else model

    @classmethod
    def _check_shape_overrides(cls, source, kwargs: dict) -> None:
        """One line instead of transformers' size-mismatch error when ``num_clusters`` or ``hidden_size`` given to
        `from_pretrained` differ from a Cluster-Former checkpoint's (its centroids have the saved shape)."""
        overrides = {name: kwargs[name] for name in ("num_clusters", "hidden_size") if name in kwargs}
        if not overrides:
            return
        hub = {name: kwargs[name] for name in ("revision", "token", "cache_dir", "local_files_only") if name in kwargs}
        saved, _ = PretrainedConfig.get_config_dict(source, **hub)
        if saved.get("model_type") != cls.config_class.model_type:
            return  # a RoBERTa checkpoint has no centroids: its options may be set freely
        saved_kinds = cls.config_class.from_dict(dict(saved)).layer_kinds
        new_kinds = cls.config_class.from_dict(dict(saved), return_unused_kwargs=True, **kwargs)[0].layer_kinds
        # only a layer routed in the checkpoint and in the model loads saved router tensors (a new one is drawn)
        routed = any(
            old in ROUTED_LAYER_TYPES and new in ROUTED_LAYER_TYPES for old, new in zip(saved_kinds, new_kinds)
        )
        for name, value in overrides.items():
            if saved.get(name) not in (None, value) and (routed or name == "hidden_size"):
                raise ValueError(
                    f"{source} was saved with {name}={saved[name]}, so its tensors (centroids or weights) do not fit "
                    f"{name}={value}; load without overriding {name}, or pass ignore_mismatched_sizes=True to "
                    "re-initialise the mismatched centroids (then fit them again)."
                )

    def save_pretrained(self, save_directory, *args, **kwargs):
        """`PreTrainedModel.save_pretrained` (the Trainer's checkpoints included) through the package's one writer of
        a model folder, `hf_clusterformer_model_folder.write_model_folder`, into the folder as it is: weights and
        config with every ``auto_map`` entry, the code files (``pipeline.py`` and its ``custom_pipelines`` entry for a
        QA model; code files of the user's there are refused unless ``overwrite=True``), usual modes. A Hub copy of
        this file used without the package writes the folder on its own (`_save_on_its_own`)."""
        try:
            from hf_clusterformer_model_folder import write_model_folder
        except ImportError:  # a Hub copy, used without the package
            return self._save_on_its_own(save_directory, *args, **kwargs)
        write_model_folder(self, save_directory, in_place=True, save_args=args, **kwargs)

    def _save_on_its_own(self, save_directory, *args, **kwargs):
        """`save_pretrained` without the package: a folder complete for what its ``config.json`` promises:
        ``pipeline.py`` beside it when ``custom_pipelines`` names it (a config loaded from a Hub checkpoint does), or
        no such entry when that file is not at hand or the model has no QA head; and weight files with the usual mode
        under the umask (transformers writes them 0600). Code files of the user's there (other than the ones this copy
        writes) are refused unless ``overwrite=True``."""
        overwrite = kwargs.pop("overwrite", False)
        here = os.path.dirname(os.path.abspath(__file__))
        theirs = [name for name in ("configuration_clusterformer.py", "modeling_clusterformer.py", "pipeline.py")
                  if os.path.isfile(os.path.join(save_directory, name)) and not _same_file_content(
                      os.path.join(save_directory, name), os.path.join(here, name))]
        if theirs and not overwrite:
            raise FileExistsError(f"{save_directory} holds code files of its own ({', '.join(theirs)}), which saving "
                                  "this model would replace; save to another folder, or pass overwrite=True.")
        pipelines = getattr(self.config, "custom_pipelines", None) or {}
        code = os.path.join(here, "pipeline.py")
        names_code = any(str(entry.get("impl", "")).startswith("pipeline.") for entry in pipelines.values()
                         if isinstance(entry, dict))
        dropped = names_code and (not os.path.isfile(code) or not isinstance(self, ClusterFormerForQuestionAnswering))
        if dropped:
            del self.config.custom_pipelines
        try:
            super().save_pretrained(save_directory, *args, **kwargs)
        finally:
            if dropped:
                self.config.custom_pipelines = pipelines
        if kwargs.get("is_main_process", True) and os.path.isdir(save_directory):
            if names_code and not dropped:
                shutil.copyfile(code, os.path.join(save_directory, "pipeline.py"))
            umask = os.umask(0)
            os.umask(umask)
            for name in os.listdir(save_directory):
                if name.endswith(".safetensors"):
                    os.chmod(os.path.join(save_directory, name), 0o666 & ~umask)

    def _encode(
        self, input_ids: torch.Tensor | None, attention_mask: torch.Tensor | None, token_type_ids: torch.Tensor | None,
        inputs_embeds: torch.Tensor | None, kwargs: dict,
    ) -> ClusterFormerModelOutput:
        """A head's pass through ``self.roberta`` with the head's default ``input_format``: (B, T) inputs ->
        `ClusterFormerModelOutput`."""
        kwargs["input_format"] = kwargs.get("input_format") or self.input_format
        return self.roberta(input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids,
                            inputs_embeds=inputs_embeds, return_dict=True, **kwargs)

    def cluster_routers(self) -> dict[int, ClusterRouter]:
        """The K-Means routers of this model by encoder layer index (what centroid updates write to)."""
        return {index: layer.router for index, layer in enumerate(self.base_model.encoder.layer)
                if isinstance(getattr(layer, "router", None), ClusterRouter)}


# ----------------------------------------------------------------------------------------------------------------
# The input contract: where every row's question prefix and context lie, checked in one line per fault
# ----------------------------------------------------------------------------------------------------------------


def locate_rows(
    config: ClusterFormerConfig,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None,
    question_lengths: torch.Tensor | list[int] | None = None,
    input_format: str = "pair",
    read_back: bool = True,
    is_separator: torch.Tensor | None = None,
    token_type_ids: torch.Tensor | None = None,
    takes_question_lengths: bool = True,
) -> tuple[list[int] | None, list[int] | None, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Validate a batch and locate every example in it (what every forward pass and the exported runner do first).

    Args:
        config: the model's configuration (special token ids, limits).
        input_ids: (B, T) token ids (for embeddings: any (B, T) tensor, with ``is_separator`` given).
        attention_mask: optional (B, T); one block of ones per row (right or left padding).
        question_lengths: optional (B,) question prefix lengths (then every row is a pair).
        input_format: one of `INPUT_FORMATS`; single-text rows (`single_text_rows`) get the prefix ``<s>``.
        read_back: read the lengths back and check the rows; without it (export, `BatchSizes.bounds`) the ints are
            None and nothing is checked.
        is_separator: optional (B, T) bool, where the separators are (default: ``input_ids == separator id``, and
            the ids are checked against the vocabulary).
        token_type_ids: optional (B, T) token types, checked against ``config.type_vocab_size``.
        takes_question_lengths: whether the caller takes ``question_lengths`` (the exported program does not), so
            that a fault's fix may offer them.

    Returns:
        Per example, as Python ints: prefix lengths and real lengths (prefix + context); and as (B,) tensors:
        prefix lengths, real lengths, the index of the first real token (long) and which rows are one text (bool).
    """
    (batch, length), device = input_ids.shape, input_ids.device
    ids = input_ids if is_separator is None else None
    mask = real_tokens(config, ids, input_ids, attention_mask)
    lengths = mask.sum(dim=1)
    positions = torch.arange(length, device=device)
    starts = torch.where(mask, positions, length).min(dim=1).values.clamp(max=length - 1)
    in_block = (positions >= starts.unsqueeze(1)) & (positions < (starts + lengths).unsqueeze(1))
    one_block = (mask == in_block).all(dim=1)
    is_sep = (input_ids == config.separator_token_id if is_separator is None else is_separator) & mask
    if question_lengths is None:
        prefix, question, found = locate_question_prefix(is_sep, starts)
        single = single_text_rows(input_format, found, prefix, lengths)
        prefix = torch.where(single, torch.ones_like(prefix), prefix)  # <s> alone
        question, found = question.masked_fill(single, 0), found | single
    else:
        prefix = torch.as_tensor(question_lengths, device=device).view(-1)
        if prefix.shape[0] != batch:
            raise ValueError(f"question_lengths has {prefix.shape[0]} entries for a batch of {batch}.")
        question, found = prefix - QUESTION_PREFIX_SPECIAL_TOKENS, torch.ones_like(one_block)
        single = torch.zeros_like(one_block)
    if not read_back:  # export: sizes given, nothing read back (nor checked)
        return None, None, prefix, lengths, starts, single
    last = (starts + lengths - 1).clamp(min=0).unsqueeze(1)
    context = lengths - prefix - torch.gather(is_sep, 1, last).squeeze(1).long()  # without the closing separator
    stats = row_facts(ids, prefix, lengths, question, context, one_block, found, token_type_ids).tolist()  # one read
    check_vocabularies(config, [row[0] for row in stats[6:]], ids is not None and ids.numel() > 0)
    check_question_lengths(question_lengths, stats[0], stats[1])
    check_rows(config, *stats[1:6], "input_ids" if is_separator is None else "inputs_embeds", takes_question_lengths)
    return stats[0], stats[1], prefix, lengths, starts, single


def real_tokens(
    config: ClusterFormerConfig, input_ids: torch.Tensor | None, reference: torch.Tensor,
    attention_mask: torch.Tensor | None,
) -> torch.Tensor:
    """(B, T) bool of the real tokens: the given mask, else the non-padding ids (every token for embeddings)."""
    if attention_mask is None:
        if input_ids is not None and config.pad_token_id is not None:
            return input_ids.ne(config.pad_token_id)
        return torch.ones(reference.shape, dtype=torch.bool, device=reference.device)
    if attention_mask.shape != reference.shape:
        raise ValueError(
            f"attention_mask has shape {tuple(attention_mask.shape)} but the input has {tuple(reference.shape)}; "
            "pass the attention_mask the tokenizer returned with these inputs."
        )
    return attention_mask.bool()


def row_facts(
    input_ids: torch.Tensor | None, prefix: torch.Tensor, lengths: torch.Tensor, question: torch.Tensor,
    context: torch.Tensor, one_block: torch.Tensor, found: torch.Tensor, token_type_ids: torch.Tensor | None = None,
) -> torch.Tensor:
    """(6 + 2n, B) long: the (B,) row facts stacked to come back in one transfer, then two rows (smallest, largest)
    for each of ``input_ids`` and ``token_type_ids`` that is given and not empty, for the vocabulary checks."""
    stats = torch.stack([prefix, lengths, question, context, one_block.long(), found.long()])
    for values in (input_ids, token_type_ids):
        if values is not None and values.numel() > 0:
            bounds = torch.stack([values.min(), values.max()]).to(stats.dtype)
            stats = torch.cat([stats, bounds.view(2, 1).expand(2, prefix.shape[0])])
    return stats


def check_input_tensors(input_ids: torch.Tensor | None, inputs_embeds: torch.Tensor | None) -> None:
    """One of (B, T) integer ``input_ids`` or (B, T, d) ``inputs_embeds``, else one line."""
    if (input_ids is None) == (inputs_embeds is None):
        raise ValueError("ClusterFormerModel needs exactly one of input_ids and inputs_embeds; pass one of them.")
    if inputs_embeds is not None:
        if inputs_embeds.dim() != 3:
            raise ValueError(f"inputs_embeds must be (batch, length, hidden), got shape {tuple(inputs_embeds.shape)}.")
        return
    if input_ids.dim() != 2:
        raise ValueError(f"input_ids must be (batch, length), got shape {tuple(input_ids.shape)}.")
    if input_ids.is_floating_point() or input_ids.is_complex() or input_ids.dtype == torch.bool:
        raise TypeError(f"input_ids must hold integer token ids, got dtype {input_ids.dtype}; pass the "
                        "tokenizer's ids (e.g. return_tensors='pt') or input_ids.long().")


def check_vocabularies(config: ClusterFormerConfig, bounds: list[int], with_ids: bool) -> None:
    """``bounds`` (the extra rows of `row_facts`): the smallest and largest input id when ``with_ids``, then the
    smallest and largest token type if given; each within its vocabulary, else one line."""
    if with_ids:
        check_token_ids(config, *bounds[:2])
        bounds = bounds[2:]
    if bounds:
        check_token_types(config, *bounds)


def check_token_ids(config: ClusterFormerConfig, low: int, high: int) -> None:
    """The smallest and largest input id lie within the vocabulary, else one line naming the id."""
    if low < 0 or high >= config.vocab_size:
        raise ValueError(f"input_ids holds token id {low if low < 0 else high}, outside the vocabulary "
                         f"(0..{config.vocab_size - 1}); encode the text with this model's tokenizer.")


def check_token_types(config: ClusterFormerConfig, low: int, high: int) -> None:
    """The smallest and largest token type lie within ``config.type_vocab_size``, else one line naming the type."""
    if low < 0 or high >= config.type_vocab_size:
        raise ValueError(
            f"token_type_ids holds type {low if low < 0 else high}, but the model has {config.type_vocab_size} token "
            f"type{'s' if config.type_vocab_size != 1 else ''} (0..{config.type_vocab_size - 1}); encode the text "
            "with this model's tokenizer (a BERT-style tokenizer marks the context with type 1), or pass no "
            "token_type_ids."
        )


def check_question_lengths(given: object, prefixes: list[int], lengths: list[int]) -> None:
    """Where ``question_lengths`` were ``given``: each row's prefix (``prefixes``) at least its first token and
    shorter than its row's ``lengths``, else one line naming the row."""
    for row, (prefix, length) in enumerate(zip(prefixes, lengths) if given is not None else ()):
        if not 1 <= prefix < length:
            raise ValueError(
                f"question_lengths[{row}] is {prefix}, but a question prefix (<s> Q </s></s>: the question's tokens + "
                f"{QUESTION_PREFIX_SPECIAL_TOKENS}) takes at least 1 and fewer than the row's {length} tokens; give "
                "each row's prefix length, or leave question_lengths out."
            )


def check_rows(config: ClusterFormerConfig, lengths: list[int], questions: list[int], contexts: list[int],
               one_block_ok: list[int], found_ok: list[int], what: str, takes_question_lengths: bool = True) -> None:
    """Every row one block of tokens with a separator, a question/context pair, its question and context within
    the configured limits; the fixes offer ``question_lengths`` where the caller takes it."""
    or_lengths = ", or pass question_lengths" if takes_question_lengths else ""
    if 0 in lengths:
        raise ValueError(
            f"attention_mask row {lengths.index(0)} is all zeros, so the row has no tokens; drop that row from the "
            "batch, or pass the attention_mask the tokenizer returned."
        )
    if not all(one_block_ok):
        raise ValueError(
            f"attention_mask row {one_block_ok.index(0)} mixes padding into the tokens; pad on one side only "
            "(right-padded or left-padded, as tokenizers do)."
        )
    if not all(found_ok):
        raise ValueError(
            f"{what} row {found_ok.index(0)} has no separator token, so the question cannot be found; encode inputs "
            f"as tokenizer(question, context){or_lengths}."
        )
    if min(contexts) < 0:  # the first separator closes the row: one text, no context after a question
        raise ValueError(
            f"{what} row {contexts.index(min(contexts))} holds one text, not a question/context pair (its first "
            f"separator ends it), or a pair with an empty context; encode inputs as tokenizer(question, context) with "
            f"a context{or_lengths}."
        )
    for row in {questions.index(max(questions)), contexts.index(min(contexts)), contexts.index(max(contexts))}:
        check_input_lengths(config, questions[row], contexts[row], where=f"row {row}")


def check_input_lengths(config: ClusterFormerConfig, question_tokens: int, context_tokens: int,
                        where: str = "the input") -> None:
    """`ValueError` unless question and (non-empty) context fit the config's limits, counted without special
    tokens."""
    if question_tokens > config.max_question_length:
        raise ValueError(f"the question of {where} has {question_tokens} tokens, more than max_question_length="
                         f"{config.max_question_length}; shorten the question or use a model with a larger "
                         "max_question_length (max_question_length + 3 + window_size must fit "
                         "max_position_embeddings - 2).")
    if context_tokens <= 0:
        raise ValueError(f"{where} has an empty context; give a non-empty context after the question.")
    if context_tokens > config.max_context_length:
        raise ValueError(f"the context of {where} has {context_tokens} tokens, more than max_context_length="
                         f"{config.max_context_length}; truncate it or raise max_context_length.")


def check_centroid_memory(config: ClusterFormerConfig, option: str = "num_clusters") -> None:
    """Raise `ValueError` when the centroids (or LSH projections) would take more than a quarter of this machine's
    memory, naming ``option`` and the largest value that fits (instead of an allocator error). Checked where a model is
    built on this machine, not by its config (which loads on any machine)."""
    routed = sum(kind in ROUTED_LAYER_TYPES for kind in config.layer_kinds)
    per_cluster = config.hidden_size * 4 * routed  # float32 rows, one table per cluster/LSH layer
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        memory = 16 << 30  # where the system does not say
    bound = max(1, memory // 4 // max(per_cluster, 1))
    if routed and config.num_clusters > bound:
        raise ValueError(
            f"{option} {config.num_clusters} needs {_size(config.num_clusters * per_cluster)} of centroids "
            f"({config.num_clusters} x hidden size {config.hidden_size} x 4 bytes x {routed} layers), more than a "
            f"quarter of this machine's memory ({_size(memory)}); give at most {bound} (the paper uses 64 to 512)."
        )


def _size(count: float) -> str:
    """``count`` bytes in decimal units (``512 bytes``, ``1.2 GB``)."""
    for unit in ("bytes", "KB", "MB", "GB", "TB"):
        if count < 1000:
            return f"{count:.0f} {unit}" if unit == "bytes" else f"{count:.1f} {unit}"
        count /= 1000
    return f"{count:.1f} PB"


class ClusterFormerModel(ClusterFormerPreTrainedModel):
    """Cluster-Former encoder over ``<s> question </s></s> context </s>`` pairs or single texts ``<s> text </s>`` of
    any length (`INPUT_FORMATS`).

    Parameter names match `RobertaModel`, so RoBERTa checkpoints load 1:1 (centroids come from initialisation).
    """

    _no_split_modules = ["RobertaEmbeddings", "SlidingWindowLayer", "SparseLayer", "RoutedLayer"]
    #: How rows are read when forward gets no ``input_format`` (see `INPUT_FORMATS`).
    input_format = "auto"

    def __init__(self, config: ClusterFormerConfig, add_pooling_layer: bool = True):
        config.validate_architecture()  # options set after the config was built (from_pretrained overrides)
        config.check_position_budget()
        check_centroid_memory(config)
        super().__init__(config)
        self.config = config
        self.gradient_checkpointing = False
        self.embeddings = RobertaEmbeddings(config)
        self.encoder = ClusterFormerEncoder(config)
        self.pooler = RobertaPooler(config) if add_pooling_layer else None
        self.post_init()

    def get_input_embeddings(self):
        return self.embeddings.word_embeddings

    def set_input_embeddings(self, value):
        self.embeddings.word_embeddings = value

    # -- input contract -----------------------------------------------------------------------------------------

    def _locate_inputs(
        self,
        input_ids: torch.Tensor | None,
        inputs_embeds: torch.Tensor | None,
        attention_mask: torch.Tensor | None,
        question_lengths: torch.Tensor | list[int] | None,
        input_format: str = "pair",
        read_back: bool = True,
        token_type_ids: torch.Tensor | None = None,
    ) -> tuple[list[int] | None, list[int] | None, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """`locate_rows` of ``input_ids``, or of ``inputs_embeds`` (B, T, d), whose separators are the rows equal to
        the separator's word embedding; ``token_type_ids`` (B, T) are checked too."""
        check_input_tensors(input_ids, inputs_embeds)
        is_separator = None
        if inputs_embeds is not None:
            separator = self.embeddings.word_embeddings.weight[self.config.separator_token_id]
            is_separator = (inputs_embeds == separator.to(inputs_embeds.dtype)).all(dim=-1)
        return locate_rows(self.config, input_ids if input_ids is not None else inputs_embeds[..., 0], attention_mask,
                           question_lengths, input_format, read_back, is_separator, token_type_ids)

    # -- forward ------------------------------------------------------------------------------------------------

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        **kwargs: Unpack[ClusterFormerKwargs],
    ) -> ClusterFormerModelOutput:
        r"""
        Args:
            input_ids: (B, T) pair encodings ``<s> Q </s></s> C </s>`` (or ``[CLS] Q [SEP] C [SEP]``), or single texts
                ``<s> T </s>`` (see ``input_format``), padded on one side.
            attention_mask: (B, T) 1 for real tokens, 0 for padding.
            token_type_ids: optional (B, T); by default 0, or with ``config.pair_token_types`` 0 for the question
                prefix and 1 for the context (BERT's pair template).
            inputs_embeds: (B, T, d) word embeddings instead of ``input_ids``; positions restart in every window as
                for ids. Separators are found where a row equals the separator's embedding, or pass
                ``question_lengths``.
            kwargs: `ClusterFormerKwargs` (``question_lengths``, ``input_format``, the extra outputs, ``batch_sizes``).

        Returns:
            `ClusterFormerModelOutput`.
        """
        options = self._forward_options(kwargs)
        layout, sizes, single = self._layout_batch(input_ids, inputs_embeds, attention_mask, options, token_type_ids)
        length = (input_ids if input_ids is not None else inputs_embeds).shape[1]
        states = self._embed_windows(input_ids, inputs_embeds, token_type_ids, layout, single)
        encoded = self.encoder(
            states,
            layout,
            length,
            output_hidden_states=options["output_hidden_states"],
            output_attentions=options["output_attentions"],
            output_cluster_assignments=options["output_cluster_assignments"],
            routed_chunks=sizes.routed_chunks,
            bounded=sizes.bounds,
        )
        states = encoded.last_hidden_state
        window_exists = layout.valid[:, :, 0].unsqueeze(-1).to(states.dtype)  # (B, K, 1)
        window_starts = (states[:, :, 0] * window_exists).sum(1) / window_exists.sum(1)  # (B, d), mean <s> state
        return ClusterFormerModelOutput(
            last_hidden_state=windows_to_tokens(states, layout, layout.valid, length),
            pooler_output=self.pooler(window_starts.unsqueeze(1)) if self.pooler is not None else window_starts,
            hidden_states=encoded.hidden_states,
            attentions=encoded.attentions,
            cluster_assignments=encoded.cluster_assignments,
            window_token_index=layout.token_index.masked_fill(~layout.valid, -1)
            if options["output_cluster_assignments"] else None,
        )

    def _forward_options(self, kwargs: dict) -> dict:
        """``kwargs`` of `forward` with the config's defaults filled in; anything else is refused in one line
        (RoBERTa's cache arguments and the Trainer's ``num_items_in_batch`` are ignored; ``position_ids`` are
        refused)."""
        config = self.config
        unknown = set(kwargs) - set(ClusterFormerKwargs.__annotations__) - {"cache", "use_cache", "past_key_values"}
        if unknown:
            raise TypeError(f"ClusterFormerModel.forward got unexpected arguments {sorted(unknown)}.")
        if kwargs.get("position_ids") is not None:
            raise ValueError("position_ids are not supported: positions restart in every window; leave them out.")
        options = {
            "output_hidden_states": kwargs.get("output_hidden_states"),
            "output_attentions": kwargs.get("output_attentions"),
            "output_cluster_assignments": bool(kwargs.get("output_cluster_assignments")),
            "question_lengths": kwargs.get("question_lengths"), "batch_sizes": kwargs.get("batch_sizes"),
            "input_format": kwargs.get("input_format") or self.input_format,
        }
        for name in ("output_hidden_states", "output_attentions"):
            options[name] = getattr(config, name) if options[name] is None else options[name]
        if options["output_attentions"] and config._attn_implementation != "eager":
            logger.warning_once(
                f"The {config._attn_implementation} attention implementation returns no attention weights, so "
                "`attentions` holds None for every layer; load the model with attn_implementation='eager' for them."
            )
        return options

    def _layout_batch(
        self, input_ids: torch.Tensor | None, inputs_embeds: torch.Tensor | None, attention_mask: torch.Tensor | None,
        options: dict, token_type_ids: torch.Tensor | None = None,
    ) -> tuple[WindowLayout, BatchSizes, torch.Tensor]:
        """Locate every row (`_locate_inputs`) and lay out its windows with the batch's `BatchSizes` (or the given
        ones): -> (the (B, K, S) layout, the sizes, (B,) bool single-text rows)."""
        config, sizes = self.config, options["batch_sizes"]
        size, stride = config.window_size, config.window_stride
        prefixes, totals, prefix, lengths, starts, single = self._locate_inputs(
            input_ids, inputs_embeds, attention_mask, options["question_lengths"], options["input_format"],
            read_back=sizes is None or not sizes.bounds, token_type_ids=token_type_ids,
        )
        if sizes is None:
            sizes = BatchSizes.of_rows(config, prefixes, totals)
        layout = build_window_layout(prefix, lengths, size, stride, sizes.num_windows, sizes.prefix_width,
                                     padding_idx=config.pad_token_id, starts=starts)
        return layout, sizes, single

    def _embed_windows(
        self, input_ids: torch.Tensor | None, inputs_embeds: torch.Tensor | None, token_type_ids: torch.Tensor | None,
        layout: WindowLayout, single: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """RoBERTa's embeddings of every window as a standalone input: (B, T) ids or (B, T, d) embeddings ->
        (B, K, S, d).

        Token types: the given (B, T) ones, else with ``config.pair_token_types`` 0 for the question prefix and 1 for
        the context of pair rows (BERT's pair template) and 0 for single-text rows (``single``, (B,) bool), else
        RoBERTa's default.
        """
        config = self.config
        batch, windows, slots = layout.token_index.shape
        flat_index = layout.token_index.view(batch, -1)
        window_ids = window_embeds = window_types = None
        if input_ids is not None:
            window_ids = torch.gather(input_ids, 1, flat_index).view(batch, windows, slots)
            window_ids = window_ids.masked_fill(~layout.valid, config.pad_token_id).view(-1, slots)
        else:
            window_embeds = tokens_to_windows(inputs_embeds, layout).view(batch * windows, slots, -1)
        if token_type_ids is not None:
            window_types = torch.gather(token_type_ids, 1, flat_index).view(-1, slots)
        elif config.pair_token_types:
            is_context = layout.is_context if single is None else layout.is_context & ~single.view(-1, 1, 1)
            window_types = is_context.long().view(-1, slots)
        return self.embeddings(
            input_ids=window_ids,
            position_ids=layout.position_ids.view(-1, slots),
            token_type_ids=window_types,
            inputs_embeds=window_embeds,
        ).view(batch, windows, slots, -1)


@dataclass
class ClusterFormerQuestionAnsweringOutput(ModelOutput):
    """Outputs of `ClusterFormerForQuestionAnswering`.

    loss: span loss (+ answerability loss when that head exists and labels are given).
    start_logits, end_logits: (B, T), like `RobertaForQuestionAnswering`.
    answerable_logits: optional (B, 2) [no answer, has answer] from the pooled window ``<s>`` states.
    hidden_states, attentions, cluster_assignments, window_token_index: see `ClusterFormerModelOutput`.
    """

    loss: torch.Tensor | None = None
    start_logits: torch.Tensor | None = None
    end_logits: torch.Tensor | None = None
    answerable_logits: torch.Tensor | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None
    attentions: tuple[torch.Tensor, ...] | None = None
    cluster_assignments: tuple[torch.Tensor, ...] | None = None
    window_token_index: torch.Tensor | None = None


class ClusterFormerForQuestionAnswering(ClusterFormerPreTrainedModel):
    """Extractive QA head (start/end logits over every input token) on `ClusterFormerModel`.

    Loads `RobertaForQuestionAnswering` checkpoints 1:1 (``roberta.*`` and ``qa_outputs.*``). Inputs are
    question/context pairs (``input_format="pair"``).
    """

    input_format = "pair"

    def __init__(self, config: ClusterFormerConfig):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.roberta = ClusterFormerModel(config, add_pooling_layer=False)
        self.qa_outputs = nn.Linear(config.hidden_size, config.num_labels)
        self.answerability = nn.Linear(config.hidden_size, 2) if config.use_answerability_head else None
        self.post_init()

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        start_positions: torch.Tensor | None = None,
        end_positions: torch.Tensor | None = None,
        answerable_labels: torch.Tensor | None = None,
        **kwargs: Unpack[ClusterFormerKwargs],
    ) -> ClusterFormerQuestionAnsweringOutput:
        r"""
        Args:
            input_ids, attention_mask, token_type_ids, inputs_embeds, kwargs: see `ClusterFormerModel.forward`
                (``input_format`` defaults to ``"pair"``).
            start_positions, end_positions: (B,) token indices of the answer span; out-of-range values are ignored.
            answerable_labels: (B,) 1 if the context holds an answer, 0 if not (needs ``use_answerability_head``).

        Returns:
            `ClusterFormerQuestionAnsweringOutput` with (B, T) start/end logits.
        """
        outputs = self._encode(input_ids, attention_mask, token_type_ids, inputs_embeds, kwargs)
        logits = self.qa_outputs(outputs.last_hidden_state)
        start_logits, end_logits = (part.squeeze(-1).contiguous() for part in logits.split(1, dim=-1))
        answerable_logits = self.answerability(outputs.pooler_output) if self.answerability is not None else None
        loss = None
        if start_positions is not None and end_positions is not None:
            loss = self.loss_function(start_logits, end_logits, start_positions.view(-1), end_positions.view(-1))
        if answerable_labels is not None:
            if answerable_logits is None:
                raise ValueError("answerable_labels need config.use_answerability_head=True.")
            answer_loss = CrossEntropyLoss()(answerable_logits, answerable_labels.view(-1).long())
            loss = answer_loss if loss is None else loss + answer_loss
        return ClusterFormerQuestionAnsweringOutput(
            loss=loss, start_logits=start_logits, end_logits=end_logits, answerable_logits=answerable_logits,
            **_extras(outputs),
        )


# ----------------------------------------------------------------------------------------------------------------
# 5. The other RoBERTa heads: masked LM, sequence / token classification, multiple choice
# ----------------------------------------------------------------------------------------------------------------


@dataclass
class ClusterFormerMaskedLMOutput(MaskedLMOutput):
    """`MaskedLMOutput` (loss, (B, T, V) logits, hidden_states, attentions) plus ``cluster_assignments`` and
    ``window_token_index`` (see `ClusterFormerModelOutput`)."""

    cluster_assignments: tuple[torch.Tensor, ...] | None = None
    window_token_index: torch.Tensor | None = None


@dataclass
class ClusterFormerSequenceClassifierOutput(SequenceClassifierOutput):
    """`SequenceClassifierOutput` (loss, (B, num_labels) logits, ...) plus ``cluster_assignments`` and
    ``window_token_index``."""

    cluster_assignments: tuple[torch.Tensor, ...] | None = None
    window_token_index: torch.Tensor | None = None


@dataclass
class ClusterFormerTokenClassifierOutput(TokenClassifierOutput):
    """`TokenClassifierOutput` (loss, (B, T, num_labels) logits, ...) plus ``cluster_assignments`` and
    ``window_token_index``."""

    cluster_assignments: tuple[torch.Tensor, ...] | None = None
    window_token_index: torch.Tensor | None = None


@dataclass
class ClusterFormerMultipleChoiceOutput(MultipleChoiceModelOutput):
    """`MultipleChoiceModelOutput` (loss, (B, C) logits, ...; the extras over the B * C flattened rows) plus
    ``cluster_assignments`` and ``window_token_index``."""

    cluster_assignments: tuple[torch.Tensor, ...] | None = None
    window_token_index: torch.Tensor | None = None


def _extras(outputs: ClusterFormerModelOutput) -> dict:
    """The encoder outputs every head passes on unchanged."""
    return dict(hidden_states=outputs.hidden_states, attentions=outputs.attentions,
                cluster_assignments=outputs.cluster_assignments, window_token_index=outputs.window_token_index)


class ClusterFormerForMaskedLM(ClusterFormerPreTrainedModel):
    """`RobertaForMaskedLM`'s head on `ClusterFormerModel`: (B, T, V) logits for every token of a long input in one
    pass.

    The decoder is tied to the word embeddings. Loads `RobertaForMaskedLM` checkpoints 1:1 (``roberta.*``,
    ``lm_head.*``); reads single texts ``<s> T </s>`` (``input_format="single"``: a separator that masking drew in
    the middle of a text does not make it a pair; pass ``input_format="pair"`` or ``"auto"`` for pairs).
    """

    _tied_weights_keys = RobertaForMaskedLM._tied_weights_keys
    input_format = "single"

    def __init__(self, config: ClusterFormerConfig):
        super().__init__(config)
        self.roberta = ClusterFormerModel(config, add_pooling_layer=False)
        self.lm_head = RobertaLMHead(config)
        self.post_init()

    def get_output_embeddings(self):
        return self.lm_head.decoder

    def set_output_embeddings(self, new_embeddings):
        self.lm_head.decoder = new_embeddings

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        **kwargs: Unpack[ClusterFormerKwargs],
    ) -> ClusterFormerMaskedLMOutput:
        r"""
        Args:
            input_ids, attention_mask, token_type_ids, inputs_embeds, kwargs: see `ClusterFormerModel.forward`
                (``input_format`` defaults to ``"single"``); ``num_items_in_batch`` from the `Trainer` sums the loss
                over the labelled tokens of the accumulated batches.
            labels: optional (B, T) token ids to predict, -100 where no loss is taken.

        Returns:
            `ClusterFormerMaskedLMOutput` with (B, T, V) logits.
        """
        num_items_in_batch = kwargs.pop("num_items_in_batch", None)
        outputs = self._encode(input_ids, attention_mask, token_type_ids, inputs_embeds, kwargs)
        logits = self.lm_head(outputs.last_hidden_state)
        loss = None
        if labels is not None:
            loss = self.loss_function(logits, labels, vocab_size=self.config.vocab_size,
                                      num_items_in_batch=num_items_in_batch)
        return ClusterFormerMaskedLMOutput(loss=loss, logits=logits, **_extras(outputs))


class ClusterFormerForSequenceClassification(ClusterFormerPreTrainedModel):
    """`RobertaForSequenceClassification`'s head on `ClusterFormerModel`: `RobertaClassificationHead` over the mean of
    the windows' ``<s>`` states (the pooled output, as the answerability head reads it), so in one window it equals
    RoBERTa.

    Loads `RobertaForSequenceClassification` checkpoints 1:1 (``roberta.*``, ``classifier.*``); single texts or
    ``tokenizer(text, text_pair)`` pairs (``input_format="auto"``).
    """

    input_format = "auto"

    def __init__(self, config: ClusterFormerConfig):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.roberta = ClusterFormerModel(config, add_pooling_layer=False)
        self.classifier = RobertaClassificationHead(config)
        self.post_init()

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        **kwargs: Unpack[ClusterFormerKwargs],
    ) -> ClusterFormerSequenceClassifierOutput:
        r"""
        Args:
            input_ids, attention_mask, token_type_ids, inputs_embeds, kwargs: see `ClusterFormerModel.forward`.
            labels: optional (B,) class ids (``num_labels > 1``) or values (``num_labels == 1``, regression), or (B, n)
                multi-label targets (``config.problem_type`` as RoBERTa sets it).

        Returns:
            `ClusterFormerSequenceClassifierOutput` with (B, num_labels) logits.
        """
        kwargs.pop("num_items_in_batch", None)  # a mean over examples, as RoBERTa's
        outputs = self._encode(input_ids, attention_mask, token_type_ids, inputs_embeds, kwargs)
        logits = self.classifier(outputs.pooler_output.unsqueeze(1))  # the head reads position 0 of (B, 1, d)
        loss = self.loss_function(labels, logits, self.config) if labels is not None else None
        return ClusterFormerSequenceClassifierOutput(loss=loss, logits=logits, **_extras(outputs))


class ClusterFormerForTokenClassification(ClusterFormerPreTrainedModel):
    """`RobertaForTokenClassification`'s head on `ClusterFormerModel`: (B, T, num_labels) logits for every token of a
    long input. Loads `RobertaForTokenClassification` checkpoints 1:1 (``roberta.*``, ``classifier.*``); single texts
    by default (``input_format="auto"``)."""

    input_format = "auto"

    def __init__(self, config: ClusterFormerConfig):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.roberta = ClusterFormerModel(config, add_pooling_layer=False)
        dropout = config.classifier_dropout if config.classifier_dropout is not None else config.hidden_dropout_prob
        self.dropout = nn.Dropout(dropout)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        self.post_init()

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        **kwargs: Unpack[ClusterFormerKwargs],
    ) -> ClusterFormerTokenClassifierOutput:
        r"""
        Args:
            input_ids, attention_mask, token_type_ids, inputs_embeds, kwargs: see `ClusterFormerModel.forward`;
                ``num_items_in_batch`` from the `Trainer` sums the loss over the labelled tokens of the accumulated
                batches.
            labels: optional (B, T) label ids, -100 where no loss is taken.

        Returns:
            `ClusterFormerTokenClassifierOutput` with (B, T, num_labels) logits.
        """
        num_items_in_batch = kwargs.pop("num_items_in_batch", None)
        outputs = self._encode(input_ids, attention_mask, token_type_ids, inputs_embeds, kwargs)
        logits = self.classifier(self.dropout(outputs.last_hidden_state))
        loss = None
        if labels is not None:
            loss = self.loss_function(logits, labels, self.config, num_items_in_batch=num_items_in_batch)
        return ClusterFormerTokenClassifierOutput(loss=loss, logits=logits, **_extras(outputs))


class ClusterFormerForMultipleChoice(ClusterFormerPreTrainedModel):
    """`RobertaForMultipleChoice`'s head on `ClusterFormerModel`: every choice is a pair ``<s> question option </s></s>
    context </s>`` (``tokenizer(question + " " + option, context)``), the question and option the prefix of every
    window of the long context; a linear score on RoBERTa's pooler over the windows' mean ``<s>`` state.

    Loads `RobertaForMultipleChoice` checkpoints 1:1 (``roberta.*`` with its pooler, ``classifier.*``).
    """

    input_format = "pair"

    def __init__(self, config: ClusterFormerConfig):
        super().__init__(config)
        self.roberta = ClusterFormerModel(config)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        self.classifier = nn.Linear(config.hidden_size, 1)
        self.post_init()

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        **kwargs: Unpack[ClusterFormerKwargs],
    ) -> ClusterFormerMultipleChoiceOutput:
        r"""
        Args:
            input_ids: (B, C, T) pair encodings, one per choice; attention_mask, token_type_ids: (B, C, T);
                inputs_embeds: (B, C, T, d); ``question_lengths`` (kwargs): optional (B, C). Choices run as B * C rows
                of `ClusterFormerModel.forward` (``input_format`` defaults to ``"pair"``).
            labels: optional (B,) index of the right choice.

        Returns:
            `ClusterFormerMultipleChoiceOutput` with (B, C) logits.
        """
        kwargs.pop("num_items_in_batch", None)  # a mean over examples, as RoBERTa's
        num_choices = (input_ids if input_ids is not None else inputs_embeds).shape[1]

        def flat(tensor):  # (B, C, ...) -> (B * C, ...)
            return tensor.reshape(-1, *tensor.shape[2:]) if isinstance(tensor, torch.Tensor) else tensor

        if kwargs.get("question_lengths") is not None:
            kwargs["question_lengths"] = flat(torch.as_tensor(kwargs["question_lengths"]))
        outputs = self._encode(
            flat(input_ids), flat(attention_mask), flat(token_type_ids), flat(inputs_embeds), kwargs
        )
        logits = self.classifier(self.dropout(outputs.pooler_output)).view(-1, num_choices)
        loss = CrossEntropyLoss()(logits, labels.to(logits.device).view(-1)) if labels is not None else None
        return ClusterFormerMultipleChoiceOutput(loss=loss, logits=logits, **_extras(outputs))


__all__ = [
    "ClusterFormerPreTrainedModel",
    "ClusterFormerModel",
    "ClusterFormerForMaskedLM",
    "ClusterFormerForSequenceClassification",
    "ClusterFormerForMultipleChoice",
    "ClusterFormerForTokenClassification",
    "ClusterFormerForQuestionAnswering",
    "UntrainedModelError",
]

# Every save_pretrained (the Trainer's checkpoints included) writes auto_map and copies this file and the
# configuration file next to the weights, so a saved folder loads with trust_remote_code=True without this package.
ClusterFormerConfig.register_for_auto_class()
ClusterFormerModel.register_for_auto_class("AutoModel")
ClusterFormerForQuestionAnswering.register_for_auto_class("AutoModelForQuestionAnswering")
ClusterFormerForMaskedLM.register_for_auto_class("AutoModelForMaskedLM")
ClusterFormerForSequenceClassification.register_for_auto_class("AutoModelForSequenceClassification")
ClusterFormerForTokenClassification.register_for_auto_class("AutoModelForTokenClassification")
ClusterFormerForMultipleChoice.register_for_auto_class("AutoModelForMultipleChoice")
