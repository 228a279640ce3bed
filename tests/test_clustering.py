"""Memory bank, spherical K-Means backends and the Trainer-independent centroid updater."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from helpers import pad_batch, random_example, tiny_config
from hypothesis import given, settings
from hypothesis import strategies as st

from hf_clusterformer import ClusterFormerForQuestionAnswering, ClusterFormerModel
from hf_clusterformer.centroid_updates import CentroidUpdater, MemoryBank
from hf_clusterformer.kmeans import (
    ClusterStats,
    NotEnoughStatesError,
    available_backends,
    faiss_available,
    resolve_backend,
    spherical_kmeans,
)

BACKENDS = [b for b in ("torch", "faiss-cpu") if b in available_backends("cpu")]



def mixture(n: int, dim: int, k: int, noise: float, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """n states around k random unit directions: ((n, dim) states, (k, dim) directions)."""
    generator = torch.Generator().manual_seed(seed)
    directions = F.normalize(torch.randn(k, dim, generator=generator), dim=1)
    states = directions[torch.arange(n) % k] + noise * torch.randn(n, dim, generator=generator)
    return states, directions


def assert_greedy_order(centroids: torch.Tensor) -> None:
    """Each centroid after the first is the nearest (cosine) of those not yet placed to its predecessor."""
    unit = F.normalize(centroids.double(), dim=1)
    similarity = unit @ unit.T
    for i in range(1, unit.shape[0]):
        remaining = similarity[i - 1, i:]
        assert similarity[i - 1, i] == remaining.max(), f"centroid {i} is not the nearest unused one to {i - 1}"


# ----------------------------------------------------------------------------------------------------------------
# Memory bank
# ----------------------------------------------------------------------------------------------------------------


def test_bank_is_a_fifo_of_the_newest_unit_rows():
    bank = MemoryBank(capacity=10, dtype=torch.float32)
    rows = torch.randn(23, 4) * 5
    for start, stop in ((0, 4), (4, 8), (8, 20), (20, 23)):
        bank.add(rows[start:stop])
    assert len(bank) == 10 and bank.total_added == 23
    torch.testing.assert_close(bank.ordered(), F.normalize(rows[13:], dim=1))
    # Ring storage holds the same rows, in some rotation.
    assert sorted(map(tuple, bank.states().tolist())) == sorted(map(tuple, bank.ordered().tolist()))


def test_bank_larger_batch_than_capacity_keeps_newest():
    bank = MemoryBank(capacity=5, dtype=torch.float32)
    bank.add(torch.randn(3, 2))
    rows = torch.randn(12, 2)
    bank.add(rows)
    torch.testing.assert_close(bank.ordered(), F.normalize(rows[-5:], dim=1))


def test_bank_stores_detached_compact_copies():
    states = torch.randn(6, 8, requires_grad=True)
    bank = MemoryBank(capacity=100)
    bank.add(states * 2)
    stored = bank.states()
    assert stored.dtype == torch.float16 and not stored.requires_grad and stored.grad_fn is None
    assert bank._buffer.shape == (100, 8)  # allocated once, at full capacity
    torch.testing.assert_close(stored.float(), F.normalize(states.detach(), dim=1), atol=1e-3, rtol=0)
    with pytest.raises(ValueError, match="8-d"):
        bank.add(torch.randn(2, 4))


def test_bank_state_dict_round_trip():
    bank = MemoryBank(capacity=6, dtype=torch.float32)
    bank.add(torch.randn(9, 3))
    other = MemoryBank(capacity=6, dtype=torch.float32)
    other.load_state_dict(bank.state_dict())
    assert torch.equal(other.ordered(), bank.ordered()) and other.total_added == 9
    other.add(torch.ones(1, 3))
    bank.add(torch.ones(1, 3))
    assert torch.equal(other.ordered(), bank.ordered())


# ----------------------------------------------------------------------------------------------------------------
# Spherical K-Means
# ----------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
def test_kmeans_recovers_separated_directions(backend):
    states, directions = mixture(800, 16, 8, noise=0.05, seed=0)
    result = spherical_kmeans(states * 3.0, 8, backend=backend, seed=0)
    centroids = result.centroids
    assert centroids.shape == (8, 16) and centroids.dtype == torch.float32
    torch.testing.assert_close(centroids.norm(dim=1), torch.ones(8))
    match = (centroids @ directions.T).max(dim=1).values
    assert match.min() > 0.99, match
    assert sorted(result.counts.tolist()) == [100] * 8
    assert result.stats.backend == backend and result.stats.num_states == 800


@pytest.mark.parametrize("backend", BACKENDS)
def test_kmeans_result_follows_get_centroids_order(backend):
    states, _ = mixture(600, 12, 20, noise=0.3, seed=1)
    result = spherical_kmeans(states, 12, backend=backend, seed=3)
    assert_greedy_order(result.centroids)


@pytest.mark.parametrize("backend", BACKENDS)
def test_kmeans_is_seeded(backend):
    states, _ = mixture(500, 10, 10, noise=0.5, seed=2)
    first = spherical_kmeans(states, 6, backend=backend, seed=5).centroids
    again = spherical_kmeans(states, 6, backend=backend, seed=5).centroids
    assert torch.equal(first, again)


@pytest.mark.parametrize("backend", BACKENDS)
def test_kmeans_stats_match_a_direct_assignment(backend):
    states, _ = mixture(300, 8, 5, noise=0.4, seed=3)
    result = spherical_kmeans(states, 5, backend=backend, seed=0)
    cosine = F.normalize(states, dim=1) @ result.centroids.T
    best, ids = cosine.max(dim=1)
    counts = torch.bincount(ids, minlength=5)
    assert torch.equal(result.counts, counts)
    s = result.stats
    assert (s.size_min, s.size_max, s.num_empty) == (int(counts.min()), int(counts.max()), 0)
    assert s.mean_cosine == pytest.approx(float(best.mean()), abs=1e-5)
    p = counts.double() / 300
    assert s.entropy == pytest.approx(float(-(p * p.log()).sum()))
    assert s.normalized_entropy == pytest.approx(s.entropy / math.log(5))
    log = s.as_log("layer/")
    assert log["layer/size_min"] == s.size_min and "layer/backend" not in log


def test_torch_warm_start_from_converged_centroids_stops_at_once():
    states, directions = mixture(400, 16, 4, noise=0.05, seed=4)
    cold = spherical_kmeans(states, 4, backend="torch", seed=0)
    warm = spherical_kmeans(states, 4, backend="torch", init=cold.centroids, num_iters=20)
    assert warm.stats.num_iters <= 2
    torch.testing.assert_close(warm.centroids, cold.centroids)


@pytest.mark.skipif(not faiss_available(), reason="faiss not installed")
def test_faiss_warm_start_uses_the_given_centroids():
    states, directions = mixture(400, 16, 4, noise=0.05, seed=4)
    # One iteration from the true directions lands next to them, whatever faiss' own init would have picked.
    result = spherical_kmeans(states, 4, backend="faiss-cpu", init=directions, num_iters=1, order=False)
    assert (result.centroids * directions).sum(dim=1).min() > 0.99


def test_torch_reseeds_empty_clusters():
    states, directions = mixture(200, 8, 4, noise=0.02, seed=5)
    # One starting centroid is opposite to every state, another duplicates a direction: both start empty.
    far = -F.normalize(directions.sum(0), dim=0)
    init = torch.stack([directions[0], directions[0], directions[1], far])
    result = spherical_kmeans(states, 4, backend="torch", init=init, num_iters=20)
    assert result.stats.num_empty == 0
    assert (result.centroids @ directions.T).max(dim=0).values.min() > 0.99


@pytest.mark.parametrize("backend", BACKENDS)
def test_kmeans_drops_non_finite_rows_with_a_warning(backend):
    states, _ = mixture(100, 8, 4, noise=0.1, seed=6)
    states[3, 2] = float("nan")
    states[10] = float("inf")
    states[20] = 0.0
    with pytest.warns(UserWarning, match="dropped 3 of 100"):
        result = spherical_kmeans(states, 4, backend=backend)
    assert torch.isfinite(result.centroids).all() and result.stats.num_states == 97


@pytest.mark.parametrize("backend", BACKENDS)
def test_fewer_states_than_clusters_is_a_clear_error(backend):
    with pytest.raises(NotEnoughStatesError, match="at least 8 usable states, got 5"):
        spherical_kmeans(torch.randn(5, 4), 8, backend=backend)
    states = torch.randn(9, 4)
    states[:2] = float("nan")
    with pytest.warns(UserWarning), pytest.raises(NotEnoughStatesError, match="got 7"):
        spherical_kmeans(states, 8, backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_identical_states_give_finite_unit_centroids(backend):
    states = torch.ones(20, 6)
    result = spherical_kmeans(states, 4, backend=backend)
    assert torch.isfinite(result.centroids).all()
    torch.testing.assert_close(result.centroids.norm(dim=1), torch.ones(4))
    assert result.stats.mean_cosine == pytest.approx(1.0, abs=1e-5)


def test_half_precision_bank_contents_cluster_in_float32():
    states, directions = mixture(400, 16, 4, noise=0.05, seed=7)
    bank = MemoryBank(capacity=1000)
    bank.add(states)
    result = spherical_kmeans(bank.states(), 4, backend="torch")
    assert result.centroids.dtype == torch.float32
    assert (result.centroids @ directions.T).max(dim=1).values.min() > 0.99


@pytest.mark.parametrize("backend", BACKENDS)
def test_max_points_per_centroid_subsamples_the_fit_not_the_stats(backend):
    states, directions = mixture(2000, 8, 4, noise=0.05, seed=8)
    result = spherical_kmeans(states, 4, backend=backend, max_points_per_centroid=20)
    assert result.stats.num_states == 2000 and int(result.counts.sum()) == 2000
    assert (result.centroids @ directions.T).max(dim=1).values.min() > 0.98


def test_backend_resolution():
    assert resolve_backend("auto", "cpu", distributed=True) == "torch"
    assert resolve_backend("auto", "cpu") == ("faiss-cpu" if faiss_available() else "torch")
    assert resolve_backend("torch", "cpu") == "torch"
    with pytest.raises(ValueError, match="Unknown K-Means backend"):
        resolve_backend("kmcuda", "cpu")
    if "faiss-gpu" not in available_backends("cuda"):
        with pytest.raises(ImportError, match="faiss built with GPU support"):
            resolve_backend("faiss-gpu", "cpu")


@settings(max_examples=25, deadline=None)
@given(
    n=st.integers(1, 60),
    dim=st.integers(1, 6),
    k=st.integers(1, 8),
    seed=st.integers(0, 2**16),
    backend=st.sampled_from(BACKENDS),
)
def test_kmeans_invariants(n, dim, k, seed, backend):
    states = torch.randn(n, dim, generator=torch.Generator().manual_seed(seed))
    if n < k:
        with pytest.raises(NotEnoughStatesError):
            spherical_kmeans(states, k, backend=backend, seed=seed)
        return
    result = spherical_kmeans(states, k, backend=backend, seed=seed, num_iters=5)
    assert torch.isfinite(result.centroids).all()
    torch.testing.assert_close(result.centroids.norm(dim=1), torch.ones(k))
    assert int(result.counts.sum()) == n and result.stats.num_states == n
    assert 0.0 <= result.stats.normalized_entropy <= 1.0 + 1e-9
    assert -1.0 - 1e-6 <= result.stats.mean_cosine <= 1.0 + 1e-6
    assert_greedy_order(result.centroids)


# ----------------------------------------------------------------------------------------------------------------
# CentroidUpdater on a tiny model
# ----------------------------------------------------------------------------------------------------------------


def batch(seed: int, size: int = 2) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return pad_batch([random_example(generator, 4, 30 + 11 * i) for i in range(size)])


def tiny_qa(**overrides) -> ClusterFormerForQuestionAnswering:
    torch.manual_seed(0)
    return ClusterFormerForQuestionAnswering(tiny_config(**overrides))


def test_capture_holds_exactly_the_representative_states():
    model = tiny_qa().train()
    router = model.cluster_routers()[2]
    seen = []
    router.register_forward_hook(lambda module, args, output: seen.append(args[0][args[1]].detach().clone()))
    updater = CentroidUpdater(model, memory_size=1000, bank_dtype=torch.float32)
    ids, mask = batch(0)
    model(input_ids=ids, attention_mask=mask)
    model(input_ids=ids[:1], attention_mask=mask[:1])
    expected = F.normalize(torch.cat(seen), dim=1)
    torch.testing.assert_close(updater.banks[2].ordered(), expected)
    assert not updater.banks[2].states().requires_grad


def test_capture_skips_eval_mode_and_detach_stops_it():
    model = tiny_qa()
    updater = CentroidUpdater(model)
    ids, mask = batch(1)
    model.eval()
    with torch.no_grad():
        model(input_ids=ids, attention_mask=mask)
    assert len(updater.banks[2]) == 0
    model.train()
    model(input_ids=ids, attention_mask=mask)
    captured = len(updater.banks[2])
    assert captured > 0
    updater.detach()
    model(input_ids=ids, attention_mask=mask)
    assert len(updater.banks[2]) == captured


def test_capture_does_not_change_training_forward_or_backward():
    """With dropout on and a random subsample per forward, outputs and gradients match a model without capture."""
    config = dict(hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1)
    plain, hooked = tiny_qa(**config).train(), tiny_qa(**config).train()
    CentroidUpdater(hooked, max_capture_per_forward=7)
    ids, mask = batch(2)
    starts, ends = torch.tensor([5, 9]), torch.tensor([6, 12])
    results = []
    for model in (plain, hooked):
        torch.manual_seed(123)
        out = model(input_ids=ids, attention_mask=mask, start_positions=starts, end_positions=ends)
        out.loss.backward()
        results.append((out.start_logits.detach(), [p.grad.clone() for p in model.parameters() if p.grad is not None]))
    assert torch.equal(results[0][0], results[1][0])
    assert all(torch.equal(a, b) for a, b in zip(results[0][1], results[1][1]))


def test_max_capture_per_forward_subsamples():
    model = tiny_qa().train()
    updater = CentroidUpdater(model, max_capture_per_forward=10)
    ids, mask = batch(3)
    model(input_ids=ids, attention_mask=mask)
    assert len(updater.banks[2]) == 10


def test_update_writes_centroids_in_place_and_reports_balance():
    model = tiny_qa().train()
    router = model.cluster_routers()[2]
    pointer, before = router.centroids.data_ptr(), router.centroids.clone()
    updater = CentroidUpdater(model, min_states=50)
    ids, mask = batch(4, size=3)
    model(input_ids=ids, attention_mask=mask)
    stats = updater.update()
    assert set(stats) == {2} and isinstance(stats[2], ClusterStats)
    s = stats[2]
    assert s.num_states == len(updater.banks[2]) and s.num_clusters == 8
    assert 0 <= s.size_min <= s.size_max and 0 < s.normalized_entropy <= 1 and 0 < s.mean_cosine <= 1
    assert router.centroids.data_ptr() == pointer and not router.centroids.requires_grad
    assert bool(router.fitted) and not torch.equal(router.centroids, before)
    torch.testing.assert_close(router.centroids.norm(dim=1), torch.ones(8))
    assert_greedy_order(router.centroids)
    # The model routes with the new centroids.
    model.eval()
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask, output_cluster_assignments=True)
    assert out.cluster_assignments[0].max() < 8


def test_step_schedule_warm_up_then_every_n_steps():
    model = tiny_qa().train()
    updater = CentroidUpdater(model, min_states=150, update_every_steps=3, max_capture_per_forward=40)
    ids, mask = batch(5)
    fitted_at = []
    for step in range(1, 12):
        model(input_ids=ids, attention_mask=mask)
        if updater.step() is not None:
            fitted_at.append(step)
    # 40 states per step: 150 banked after step 4 (warm-up), then every third step.
    assert fitted_at == [4, 7, 10]
    assert updater.num_updates == 3 and updater.last_update_step == 10
    assert updater.state_dict() == {"step_count": 11, "last_update_step": 10, "num_updates": 3}


def test_step_follows_an_explicit_global_step_and_restores_progress():
    model = tiny_qa().train()
    updater = CentroidUpdater(model, min_states=8, update_every_steps=5)
    ids, mask = batch(6)
    model(input_ids=ids, attention_mask=mask)
    assert updater.step(global_step=10) is not None  # warm-up fit
    assert updater.step(global_step=14) is None
    assert updater.step(global_step=15) is not None
    fresh = CentroidUpdater(tiny_qa(), min_states=8, update_every_steps=5)
    fresh.load_state_dict(updater.state_dict())
    assert (fresh.step_count, fresh.last_update_step, fresh.num_updates) == (15, 15, 2)


def test_updater_without_enough_states_waits():
    model = tiny_qa().train()
    updater = CentroidUpdater(model, min_states=10_000)
    ids, mask = batch(7)
    model(input_ids=ids, attention_mask=mask)
    assert updater.step() is None and updater.update() is None and not updater.fitted


def test_updater_finds_routers_of_the_base_model_and_rejects_other_models():
    base = ClusterFormerModel(tiny_config(cluster_layers=[1, 2]))
    updater = CentroidUpdater(base, layers=[2])
    assert list(updater.routers) == [2]
    with pytest.raises(ValueError, match="not cluster layers"):
        CentroidUpdater(base, layers=[0])
    with pytest.raises(TypeError, match="cluster_routers"):
        CentroidUpdater(torch.nn.Linear(2, 2))


def test_updater_memory_size_caps_every_bank():
    model = tiny_qa().train()
    updater = CentroidUpdater(model, memory_size=50)
    ids, mask = batch(8)
    for _ in range(3):
        model(input_ids=ids, attention_mask=mask)
    assert len(updater.banks[2]) == 50 and updater.banks[2].total_added > 50


def test_settings_are_validated_and_shared_with_keyword_overrides():
    from hf_clusterformer.centroid_updates import CentroidUpdateSettings

    settings = CentroidUpdateSettings(update_every_steps=4, memory_size=64, bank_dtype=torch.float32)
    assert settings.bank_dtype == "float32" and settings.torch_bank_dtype is torch.float32
    updater = CentroidUpdater(tiny_qa(), settings, seed=3)
    assert updater.settings.seed == 3 and updater.settings.update_every_steps == 4 and settings.seed == 0
    assert updater.banks[2].capacity == 64 and updater.banks[2].dtype is torch.float32
    assert CentroidUpdater(tiny_qa(), update_every_steps=2).settings.update_every_steps == 2
    with pytest.raises(ValueError, match="update_every_steps must be positive"):
        CentroidUpdater(tiny_qa(), update_every_steps=0)
    with pytest.raises(ValueError, match="Unknown centroid update option.*memory_sise.*valid options: .*memory_size"):
        CentroidUpdater(tiny_qa(), memory_sise=10)
    with pytest.raises(ValueError, match=r"Unknown centroid update option\(s\) \['update_every'\]"):
        CentroidUpdater(tiny_qa(), update_every=2)  # one spelling: update_every_steps
    with pytest.raises(ValueError, match="settings must be a CentroidUpdateSettings"):
        CentroidUpdater(tiny_qa(), 5)
