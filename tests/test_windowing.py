"""Property tests of the pure window/merge and sort/unsort functions."""

import math

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hf_clusterformer.modeling_clusterformer import (
    bidirectional_mask,
    build_window_layout,
    count_routed_chunks,
    count_windows,
    merge_overlaps_,
    overlap_slots,
    share_context_states,
    sort_into_chunks,
    tokens_to_windows,
    unsort_from_chunks,
    windows_to_tokens,
)


@st.composite
def batches(draw):
    """Random (prefix lengths, total lengths, l, m) with both l < 2m and l >= 2m."""
    window_size = draw(st.integers(1, 12))
    window_stride = draw(st.integers(1, window_size))
    rows = draw(st.integers(1, 3))
    prefixes = [draw(st.integers(1, 5)) for _ in range(rows)]
    totals = [p + draw(st.integers(1, 40)) for p in prefixes]
    return prefixes, totals, window_size, window_stride


def layout_for(prefixes, totals, window_size, window_stride):
    num_windows = max(count_windows(t - p, window_size, window_stride) for p, t in zip(prefixes, totals))
    return build_window_layout(
        torch.tensor(prefixes), torch.tensor(totals), window_size, window_stride, num_windows, max(prefixes)
    )


@settings(max_examples=60, deadline=None)
@given(batches())
def test_layout_matches_paper_windows(batch):
    """Window k of example b holds [prefix; context[m*k : m*k + l]]; windows exist until one reaches the end."""
    prefixes, totals, size, stride = batch
    layout = layout_for(*batch)
    for b, (prefix, total) in enumerate(zip(prefixes, totals)):
        context = total - prefix
        for k in range(layout.num_windows):
            expected = []
            if k == 0 or (k - 1) * stride + size < context:
                window = range(k * stride, min(k * stride + size, context))
                expected = list(range(prefix)) + [prefix + j for j in window]
            got = layout.token_index[b, k][layout.valid[b, k]].tolist()
            assert got == expected
            # positions restart per window like a standalone RoBERTa input (padding_idx 1 -> first position 2)
            assert layout.position_ids[b, k][layout.valid[b, k]].tolist() == [2 + s for s in range(len(expected))]
        # every context token has exactly one owner copy: in window j // m (the paper's H_k[0 : q + m]),
        # or in the last window for the tail it alone reaches
        owners = layout.token_index[b][layout.owner[b]].tolist()
        assert sorted(owners) == list(range(prefix, total))
        owner_windows = layout.owner[b].nonzero()[:, 0].tolist()
        last = count_windows(context, size, stride) - 1
        assert all(k == min((token - prefix) // stride, last) for k, token in zip(owner_windows, owners))


@settings(max_examples=60, deadline=None)
@given(batches(), st.integers(0, 2**31 - 1))
def test_merge_is_the_mean_over_covering_windows(batch, seed):
    prefixes, totals, size, stride = batch
    layout = layout_for(*batch)
    length = max(totals) + 2
    generator = torch.Generator().manual_seed(seed)
    window_states = torch.randn(*layout.token_index.shape, 3, generator=generator, dtype=torch.float64)
    merged = windows_to_tokens(window_states, layout, layout.valid, length)
    for b, total in enumerate(totals):
        for token in range(length):
            copies = (layout.token_index[b] == token) & layout.valid[b]
            if token < total:
                expected = window_states[b][copies].mean(0)
                torch.testing.assert_close(merged[b, token], expected)
            else:
                assert not copies.any() and torch.all(merged[b, token] == 0)


@settings(max_examples=60, deadline=None)
@given(batches(), st.integers(0, 2**31 - 1))
def test_tokens_windows_round_trip_is_exact(batch, seed):
    prefixes, totals, size, stride = batch
    layout = layout_for(*batch)
    length = max(totals)
    # integer-valued states: the mean of identical copies is then exact in floating point
    generator = torch.Generator().manual_seed(seed)
    tokens = torch.randint(-1000, 1000, (len(totals), length, 4), generator=generator).float()
    back = windows_to_tokens(tokens_to_windows(tokens, layout), layout, layout.valid, length)
    for b, total in enumerate(totals):
        assert torch.equal(back[b, :total], tokens[b, :total])


@settings(max_examples=80, deadline=None)
@given(batches(), st.integers(0, 2**31 - 1), st.booleans())
def test_overlap_merge_equals_the_merge_through_tokens(batch, seed, owner_only):
    """The in-place merge of the overlapping copies gives `share_context_states` exactly, for l <= 2m."""
    prefixes, totals, size, stride = batch
    layout = layout_for(*batch)
    length = max(totals) + 1
    overlap = overlap_slots(layout, size, stride)
    if size == stride or size > 2 * stride:
        assert overlap is None
        return
    states = torch.randn(*layout.token_index.shape, 3, generator=torch.Generator().manual_seed(seed))
    sources = layout.owner if owner_only else layout.is_context
    expected = share_context_states(states, layout, sources, length)
    merged = merge_overlaps_(states.clone(), overlap, owner_only)
    assert torch.equal(merged, expected)
    index, shared = overlap
    # only the l - m overlapping copies per window pair are read and written (the last window's tail copies pair
    # with themselves and stay as they are)
    assert index.shape == (2, len(totals) * layout.num_windows * (size - stride))
    pairs = index.view(2, len(totals), layout.num_windows, size - stride)
    assert torch.equal(pairs[0, :, -1], pairs[1, :, -1]) and bool((pairs[0, :, :-1] != pairs[1, :, :-1]).all())
    assert int(shared.sum()) == int(layout.is_context.sum() - layout.owner.sum())


@settings(max_examples=60, deadline=None)
@given(batches(), st.booleans())
def test_routed_chunk_count_from_lengths_matches_the_layout(batch, question_prefix):
    prefixes, totals, size, stride = batch
    layout = layout_for(*batch)
    routed = layout.owner if question_prefix else layout.valid & (~layout.is_context | layout.owner)
    most = int(routed.view(len(totals), -1).sum(1).max())
    assert count_routed_chunks(prefixes, totals, size, stride, question_prefix) == math.ceil(most / stride)


@settings(max_examples=80, deadline=None)
@given(
    st.integers(1, 3),
    st.integers(1, 50),
    st.integers(1, 9),
    st.integers(1, 6),
    st.integers(0, 2**31 - 1),
)
def test_sort_unsort_round_trip_stable_and_pads_last(batch, length, chunk, clusters, seed):
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, clusters + 1, (batch, length), generator=generator)  # id == clusters is the sentinel
    states = torch.randn(batch, length, 5, generator=generator)
    chunks, chunk_valid, order = sort_into_chunks(states, ids, chunk, sentinel=clusters)
    assert chunks.shape == (batch * math.ceil(length / chunk), chunk, 5)
    restored = unsort_from_chunks(chunks, order, length)
    assert torch.equal(restored, states)
    for b in range(batch):
        flat_order = order[b].tolist()
        flat_ids = [ids[b, i].item() if i < length else clusters for i in flat_order]
        # sorted by (id, position): ids non-decreasing, positions increasing inside equal ids
        keys = list(zip(flat_ids, flat_order))
        assert keys == sorted(keys)
        valid = chunk_valid.view(batch, -1)[b].tolist()
        assert valid == [i != clusters for i in flat_ids]
        # sentinels (pads) never precede a real state
        assert valid == sorted(valid, reverse=True)


def test_mask_never_lets_pads_reach_real_tokens_and_no_row_is_empty():
    valid = torch.tensor([[True, True, False], [False, False, False]])
    allowed = bidirectional_mask(valid, torch.float32, "sdpa")[:, 0]
    assert allowed[0].tolist() == [[True, True, False], [True, True, False], [False, False, True]]
    assert allowed[1].tolist() == torch.eye(3, dtype=torch.bool).tolist()
    additive = bidirectional_mask(valid, torch.bfloat16, "eager")[:, 0]
    assert additive.dtype == torch.bfloat16
    assert torch.equal(additive == 0, allowed)
    assert torch.all(additive[~allowed] == torch.finfo(torch.bfloat16).min)
