"""Two CPU processes (gloo) launched with torchrun: centroids stay bit-identical on every rank.

The worker (tests/dist_worker.py) trains through the Trainer with DDP and ``ddp_broadcast_buffers=False`` (so DDP
does not copy rank 0's buffers and would not hide drift), every rank on different data, and runs distributed
`spherical_kmeans` directly; each rank saves what it computed and the tests compare.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from dist_worker import lloyd_mixture

from hf_clusterformer.kmeans import faiss_available, spherical_kmeans

WORKER = Path(__file__).with_name("dist_worker.py")


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> list[dict]:
    out = tmp_path_factory.mktemp("dist")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(WORKER), str(out)
    ]
    try:
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=240)
    except subprocess.TimeoutExpired as error:
        pytest.fail(
            f"torchrun workers did not finish in 240 s (a collective deadlock?):\n{error.stdout}\n{error.stderr}"
        )
    assert done.returncode == 0, f"torchrun failed:\n{done.stdout[-3000:]}\n{done.stderr[-5000:]}"
    return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(2)]


def test_trainer_ddp_ranks_hold_bit_identical_centroids_at_every_step(ranks):
    first, second = (r["trainer"] for r in ranks)
    assert first["fit_steps"] == second["fit_steps"] == [1, 3, 5]
    assert first["fitted"] and second["fitted"]
    assert sorted(first["by_step"]) == sorted(second["by_step"]) == [1, 2, 3, 4, 5]
    for step in first["by_step"]:
        assert torch.equal(first["by_step"][step], second["by_step"][step]), step
    assert torch.equal(first["final"], second["final"])
    assert not torch.equal(first["by_step"][2], first["by_step"][4])  # the refit at step 3 changed them


def test_ranks_banked_different_states(ranks):
    first, second = (r["trainer"] for r in ranks)
    # Each rank's bank clustered alone gives different centroids: without the collective fit they would drift.
    assert not torch.allclose(first["local_only"], second["local_only"], atol=1e-3)


def test_distributed_lloyd_matches_one_process_on_all_rows(ranks):
    states, init = lloyd_mixture()
    union = torch.cat([states[0::2], states[1::2][:200]])
    single = spherical_kmeans(union, 6, init=init, backend="torch", num_iters=10)
    (c0, n0, s0), (c1, n1, s1) = (r["lloyd"]["warm"] for r in ranks)
    assert torch.equal(c0, c1) and torch.equal(n0, n1) and s0 == s1 == 500
    torch.testing.assert_close(c0, single.centroids, atol=1e-5, rtol=0)
    assert torch.equal(n0, single.counts)


def test_distributed_kmeans_plus_plus_start_is_shared(ranks):
    (c0, n0, s0), (c1, n1, s1) = (r["lloyd"]["cold"] for r in ranks)
    assert torch.equal(c0, c1) and torch.isfinite(c0).all()
    assert int(n0.sum()) == 500 and (n0 > 0).all()


@pytest.mark.skipif(not faiss_available(), reason="faiss not installed")
def test_faiss_under_a_process_group_fits_the_first_rank_and_broadcasts(ranks):
    states, init = lloyd_mixture()
    (c0, n0, s0), (c1, n1, s1) = (r["lloyd"]["faiss"] for r in ranks)
    assert torch.equal(c0, c1) and s0 == 500
    alone = spherical_kmeans(states[0::2], 6, init=init, backend="faiss-cpu")
    torch.testing.assert_close(c0, alone.centroids, atol=1e-5, rtol=0)


def test_every_rank_raises_alike_and_an_empty_first_rank_still_fits(ranks):
    for r in ranks:
        assert "at least 4 usable states, got 3 in total" in r["errors"]["too_few"]
    (c0, s0), (c1, s1) = (r["errors"]["empty_first_rank"] for r in ranks)
    assert torch.equal(c0, c1) and torch.isfinite(c0).all() and s0 == s1 == 20
