"""Worker for tests/test_distributed.py, run as ``torchrun --nproc_per_node=2 tests/dist_worker.py OUT_DIR``.

Each rank (gloo, CPU) writes ``OUT_DIR/rank{r}.pt`` with what it computed:

* ``trainer``: DDP training of a tiny QA model through the Trainer with `CentroidUpdateCallback`,
  ``ddp_broadcast_buffers=False``, every rank on its own share of the data: centroids used at every step,
  the final centroids, fit steps, and the rank's own bank fitted locally (to show the ranks' data differ).
* ``lloyd``: distributed `spherical_kmeans` on this rank's rows of a fixed mixture, from a fixed init and from
  k-means++, with the torch and faiss-cpu backends.
* ``errors``: what each rank raised for too few states in total, and the fit when the first rank holds none.
"""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from helpers import CentroidSnapshots, TinyQA, tiny_config  # noqa: E402
from transformers import Trainer, TrainingArguments  # noqa: E402

from hf_clusterformer import ClusterFormerForQuestionAnswering  # noqa: E402
from hf_clusterformer.callback import CentroidUpdateCallback  # noqa: E402
from hf_clusterformer.kmeans import NotEnoughStatesError, faiss_available, spherical_kmeans  # noqa: E402


def lloyd_mixture() -> tuple[torch.Tensor, torch.Tensor]:
    """The full data set (600, 16) of 6 noisy directions and a fixed start (6, 16), the same on every rank."""
    generator = torch.Generator().manual_seed(11)
    directions = F.normalize(torch.randn(6, 16, generator=generator), dim=1)
    states = directions[torch.arange(600) % 6] + 0.3 * torch.randn(600, 16, generator=generator)
    init = F.normalize(torch.randn(6, 16, generator=generator), dim=1)
    return states, init


def train(out_dir: str) -> dict:
    torch.manual_seed(0)
    model = ClusterFormerForQuestionAnswering(tiny_config(hidden_dropout_prob=0.1))
    callback = CentroidUpdateCallback(update_every_epochs=None, update_every_steps=2, min_states=1, backend="auto")
    snapshots = CentroidSnapshots()
    args = TrainingArguments(
        output_dir=out_dir,
        per_device_train_batch_size=2,
        learning_rate=1e-3,
        max_steps=5,
        logging_steps=1000,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        ddp_backend="gloo",
        ddp_broadcast_buffers=False,
        seed=0,
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    trainer = Trainer(model=model, args=args, train_dataset=TinyQA(24), callbacks=[callback, snapshots])
    # Keep the banks after training so this rank's own data can be clustered alone below.
    callback.on_train_end = lambda *a, **k: None
    trainer.train()
    assert trainer.args.parallel_mode.value == "distributed" and dist.get_world_size() == 2
    bank = callback.updater.banks[2].states()
    local_only = spherical_kmeans(bank, 8, backend="torch", init=model.cluster_routers()[2].centroids).centroids
    return {
        "by_step": snapshots.by_step,
        "final": model.cluster_routers()[2].centroids.clone(),
        "fitted": bool(model.cluster_routers()[2].fitted),
        "fit_steps": [h["step"] for h in callback.history],
        "local_only": local_only,
        "bank_size": bank.shape[0],
    }


def lloyd(rank: int) -> dict:
    states, init = lloyd_mixture()
    shard = states[rank::2] if rank == 0 else states[rank::2][:200]  # unequal shares: 300 and 200 rows
    group = dist.group.WORLD
    result = {
        "warm": spherical_kmeans(shard, 6, init=init, backend="torch", process_group=group, num_iters=10),
        "cold": spherical_kmeans(shard, 6, backend="torch", process_group=group, seed=3),
    }
    if faiss_available():
        result["faiss"] = spherical_kmeans(shard, 6, init=init, backend="faiss-cpu", process_group=group)
    return {name: (r.centroids, r.counts, r.stats.num_states) for name, r in result.items()}


def errors(rank: int) -> dict:
    outcome = {}
    try:
        spherical_kmeans(torch.randn(2 if rank == 0 else 1, 4), 4, backend="torch", process_group=dist.group.WORLD)
        outcome["too_few"] = "no error"
    except NotEnoughStatesError as error:
        outcome["too_few"] = str(error)
    # The first rank holds no states at all: k-means++ still draws from the other rank.
    states = torch.empty(0, 4) if rank == 0 else torch.randn(20, 4, generator=torch.Generator().manual_seed(1))
    fit = spherical_kmeans(states, 4, backend="torch", process_group=dist.group.WORLD)
    outcome["empty_first_rank"] = (fit.centroids, fit.stats.num_states)
    return outcome


def main() -> None:
    torch.set_num_threads(1)
    out_dir = sys.argv[1]
    record = {"trainer": train(out_dir)}
    rank = dist.get_rank()
    record["lloyd"] = lloyd(rank)
    record["errors"] = errors(rank)
    torch.save(record, os.path.join(out_dir, f"rank{rank}.pt"))
    dist.barrier()


if __name__ == "__main__":
    main()
