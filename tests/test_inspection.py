"""Cluster inspection (paper Table 6) on a tiny model and a generated long-range example: the report matches a
manual nearest-centroid assignment, puts the two far-apart mentions of the chain's middle person in one cluster,
accounts for every clustered state, formats and plots, and rejects layers it cannot inspect."""

from __future__ import annotations

import re
from collections import Counter

import pytest
import torch
import torch.nn.functional as F

from clusterformer_research.longrange import build_longrange_tokenizer, generate_longrange_dataset
from hf_clusterformer import ClusterFormerConfig, ClusterFormerForQuestionAnswering
from hf_clusterformer.inspection import ClusterReport, _percent, inspect_clusters
from hf_clusterformer.kmeans import spherical_kmeans
from hf_clusterformer.modeling_clusterformer import count_windows, sort_into_chunks

WINDOW, STRIDE, CLUSTERS = 32, 24, 8


@pytest.fixture(scope="module")
def tokenizer():
    return build_longrange_tokenizer(vocab_size=1300, num_examples=20)  # every generated name is one token


@pytest.fixture(scope="module")
def example() -> dict:
    """One chain "X lives with Y. ... Y lives in Z.", its facts at least 2000 tokens apart in a 3000-token context."""
    return generate_longrange_dataset(1, 0, (3000, 3000), "longrange", min_gap_tokens=2000, max_chains=1)[0]


def _config(tokenizer, **overrides) -> ClusterFormerConfig:
    values = dict(
        vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
        cluster_layers=[1], num_clusters=CLUSTERS, window_size=WINDOW, window_stride=STRIDE, max_question_length=16,
        max_context_length=8192, max_position_embeddings=64, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
        pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        type_vocab_size=1,
    )
    values.update(overrides)
    return ClusterFormerConfig(**values)


@pytest.fixture(scope="module")
def setup(tokenizer, example):
    """A random 2-layer model whose cluster layer (index 1) has centroid 0 between the states of the two mentions of
    the middle person Y and the other centroids fitted by K-Means on the remaining context states."""
    torch.manual_seed(0)
    model = ClusterFormerForQuestionAnswering(_config(tokenizer)).eval()
    encoding = tokenizer(example["question"], example["context"], return_tensors="pt")
    ids = encoding["input_ids"][0]
    middle = example["context"].split(" lives in ")[0].split()[-1]  # Y of "Y lives in Z"
    (middle_id,) = tokenizer(" " + middle, add_special_tokens=False)["input_ids"]
    first, second = (ids == middle_id).nonzero().flatten().tolist()
    prefix = (ids == tokenizer.eos_token_id).nonzero()[0].item() + 2

    with torch.no_grad():
        states = model.roberta(**encoding, output_hidden_states=True).hidden_states[1][0]  # entering layer 1
    others = [i for i in range(prefix, len(ids)) if i not in (first, second)]
    fitted = spherical_kmeans(states[others], CLUSTERS - 1, seed=0, backend="torch").centroids.float()
    centroids = torch.cat([F.normalize(states[first] + states[second], dim=-1)[None], fitted])
    router = model.cluster_routers()[1]
    router.centroids.copy_(centroids)
    router.fitted.fill_(True)
    # Nearest centroid by cosine of every token's state; context copies of a token share one state.
    manual = (F.normalize(states, dim=-1) @ F.normalize(centroids, dim=-1).T).argmax(dim=-1)
    return dict(model=model, encoding=encoding, first=first, second=second, prefix=prefix, manual=manual,
                middle=middle, length=len(ids))


@pytest.fixture(scope="module")
def report(setup, tokenizer, example) -> ClusterReport:
    return inspect_clusters(setup["model"], tokenizer, example["question"], example["context"])


def test_far_apart_mentions_share_a_cluster(setup, report):
    first, second = setup["first"], setup["second"]
    assert second - first > 2000 > WINDOW  # no sliding window holds both
    assert int(setup["manual"][first]) == int(setup["manual"][second]) == 0
    members = {m.position: (cluster, m) for cluster, ms in report.clusters.items() for m in ms if not m.is_question}
    assert members[first][0] == members[second][0] == 0
    assert members[first][1].token == members[second][1].token == setup["middle"]
    assert report.max_span(0) >= second - first > WINDOW


def test_report_matches_nearest_centroid_assignment(setup, report):
    prefix, length = setup["prefix"], setup["length"]
    context = {m.position: cluster for cluster, ms in report.clusters.items() for m in ms if not m.is_question}
    assert sorted(context) == list(range(prefix, length))  # every context token exactly once (its owner copy)
    assert all(context[p] == int(setup["manual"][p]) for p in context)
    windows = count_windows(length - prefix, WINDOW, STRIDE)
    for members in report.clusters.values():
        positions = [m.position for m in members if not m.is_question]
        assert positions == sorted(positions)  # sorted (chunk) order
        for m in members:
            if m.is_question:
                assert m.position < prefix
            else:  # the owner copy: window j // m, or the last window
                assert m.window == min((m.position - prefix) // STRIDE, windows - 1)


def test_sizes_count_every_clustered_state(setup, report):
    with torch.no_grad():
        out = setup["model"](**setup["encoding"], output_cluster_assignments=True)
    clustered = int((out.cluster_assignments[0] >= 0).sum())
    windows = count_windows(setup["length"] - setup["prefix"], WINDOW, STRIDE)
    assert sum(report.sizes.values()) == clustered == (setup["length"] - setup["prefix"]) + windows * setup["prefix"]
    questions = sum(m.is_question for ms in report.clusters.values() for m in ms)
    assert questions == windows * setup["prefix"]  # the question prefix is clustered once per window
    assert set(report.sizes) <= set(range(CLUSTERS)) and all(size > 0 for size in report.sizes.values())
    assert report.layer == 1 and report.chunk_size == STRIDE


def test_format(report):
    text = report.format(max_clusters=3, max_members=4)
    lines = text.splitlines()
    assert lines[0] == f"Cluster layer 1: {len(report.clusters)} non-empty clusters, chunks of {STRIDE} states"
    listed = [re.fullmatch(r"  cluster +(\d+) size +(\d+) span +(\d+) tokens: (.*)", line) for line in lines[1:4]]
    assert all(listed)
    spans = [int(m[3]) for m in listed]
    assert spans == sorted(spans, reverse=True) and spans[0] == max(report.max_span(c) for c in report.clusters)
    for match in listed:
        cluster = int(match[1])
        assert int(match[2]) == report.sizes[cluster] and int(match[3]) == report.max_span(cluster)
        assert match[4].count("@") == min(4, report.sizes[cluster])
        if report.sizes[cluster] > 4:
            assert match[4].endswith(f", … +{report.sizes[cluster] - 4}")
    assert lines[4] == "Cluster size histogram (size: clusters):"
    shared, pairs, chance = report.repeated_token_colocation()
    assert pairs > 0
    assert lines[-1] == (f"Same token at least {STRIDE} tokens apart, same chunk: {shared} of {pairs} pairs "
                         f"({_percent(shared / pairs)}; {_percent(chance)} if chunks were drawn at random)")
    histogram = [re.fullmatch(r" +(\d+)-(\d+): #+ (\d+)", line) for line in lines[5:-1]]
    assert all(histogram) and sum(int(m[3]) for m in histogram) == len(report.clusters)
    for match in histogram:
        low, high = int(match[1]), int(match[2])
        assert int(match[3]) == sum(low <= s <= high for s in report.sizes.values())


def test_chunks_are_the_layers_own_chunks(setup, report):
    """Each member's chunk is where the layer's stable sort puts it, so co-location counts are the layer's."""
    with torch.no_grad():
        out = setup["model"](**setup["encoding"], output_cluster_assignments=True)
    ids = out.cluster_assignments[0]  # (1, K*S), -1 for states the layer does not sort in
    flat_positions = out.window_token_index.reshape(-1)
    states = torch.zeros(*ids.shape, 1)
    _, _, order = sort_into_chunks(states, ids.masked_fill(ids < 0, CLUSTERS), STRIDE, CLUSTERS)
    rank = torch.empty_like(order[0])
    rank[order[0]] = torch.arange(order.shape[1])
    expected = {}
    for flat in (ids[0] >= 0).nonzero().flatten().tolist():
        position = int(flat_positions[flat])
        if position >= setup["prefix"]:
            expected[position] = int(rank[flat]) // STRIDE
    members = {m.position: m.chunk for ms in report.clusters.values() for m in ms if not m.is_question}
    assert members == expected


def test_repeated_token_colocation_counts_pairs(setup, report):
    first, second = setup["first"], setup["second"]
    members = {m.position: m for ms in report.clusters.values() for m in ms if not m.is_question}
    assert members[first].chunk == members[second].chunk  # the far-apart mentions meet in one chunk
    shared, pairs, chance = report.repeated_token_colocation()
    by_token = {}
    for m in members.values():
        by_token.setdefault(m.token, []).append(m)
    manual = [(a.chunk == b.chunk) for ms in by_token.values() for i, a in enumerate(ms) for b in ms[i + 1:]
              if abs(a.position - b.position) >= STRIDE]
    assert (shared, pairs) == (sum(manual), len(manual)) and shared >= 1
    chunk_counts = Counter(m.chunk for ms in report.clusters.values() for m in ms)
    total = sum(chunk_counts.values())
    assert chance == pytest.approx(sum((n / total) ** 2 for n in chunk_counts.values()))
    assert 0 < chance < 1
    assert report.repeated_token_colocation(min_distance=10**9) == (0, 0, chance)


def test_plot_writes_a_png(report, tmp_path):
    pytest.importorskip("matplotlib")
    path = report.plot(tmp_path / "clusters.png")
    assert path == tmp_path / "clusters.png"
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_lsh_layers_are_inspected_too(tokenizer, example):
    torch.manual_seed(0)
    model = ClusterFormerForQuestionAnswering(_config(tokenizer, global_layer_type="lsh")).eval()
    report = inspect_clusters(model, tokenizer, example["question"], example["context"], layer=1)
    assert set(report.clusters) <= set(range(CLUSTERS)) and len(report.clusters) > 1


def test_bad_layers_and_inputs(setup, tokenizer, example):
    model = setup["model"]
    with pytest.raises(ValueError, match=r"^Layer 0 cannot be inspected: it is a sliding layer, which routes nothing; "
                                         r"choose a routed layer, one of \[1\]\.$"):
        inspect_clusters(model, tokenizer, example["question"], example["context"], layer=0)
    depth = model.config.num_hidden_layers  # Row: a layer past the last was called "not a cluster/LSH layer"
    with pytest.raises(ValueError, match=rf"^Layer 5 cannot be inspected: the model has {depth} layers \(0 to "):
        inspect_clusters(model, tokenizer, example["question"], example["context"], layer=5)
    with pytest.raises(ValueError, match="The context is empty"):
        inspect_clusters(model, tokenizer, example["question"], "  ")
    for overrides in (dict(cluster_layers=[]), dict(global_layer_type="sparse")):
        plain = ClusterFormerForQuestionAnswering(_config(tokenizer, **overrides))
        with pytest.raises(ValueError, match="no cluster or LSH layers"):
            inspect_clusters(plain, tokenizer, example["question"], example["context"])
    diverged = ClusterFormerForQuestionAnswering(_config(tokenizer))
    with torch.no_grad():
        diverged.roberta.encoder.layer[0].output.dense.weight[0, 0] = float("nan")
    with pytest.raises(ValueError, match=r"holds weights that are NaN or inf \(1 tensors: roberta\.encoder\.layer\.0"
                                         r"\.output\.dense\.weight\)") as error:
        inspect_clusters(diverged, tokenizer, example["question"], example["context"])
    assert "\n" not in str(error.value)


def test_pairs_apart_matches_counting_every_pair():
    from itertools import combinations

    from hf_clusterformer.inspection import _pairs_apart

    generator = torch.Generator().manual_seed(0)
    for _ in range(100):
        shuffled = torch.randperm(200, generator=generator)  # drawn before the count, as the draws always were
        positions = shuffled[: int(torch.randint(0, 15, (1,), generator=generator))].tolist()
        distance = int(torch.randint(1, 40, (1,), generator=generator))
        assert _pairs_apart(positions, distance) == sum(abs(a - b) >= distance for a, b in combinations(positions, 2))
