"""`Trainer` parts: the callback that keeps Cluster-Former centroids up to date (paper Algorithm 1), and a
`Trainer` that trains window_cluster layers' zero-started routed projections at a rate of their own.

    trainer = Trainer(model=model, args=args, train_dataset=train, callbacks=[CentroidUpdateCallback()])

is all a training script needs: states entering every cluster layer are banked during training, the first centroids
are fitted as soon as enough states are banked, then refitted every epoch (and/or every N steps).
"""

from __future__ import annotations

import logging
import math
import os
from dataclasses import asdict
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from transformers import Trainer, TrainerCallback, TrainerControl, TrainerState, TrainingArguments
from transformers.trainer_callback import ExportableState

from .centroid_updates import CentroidUpdater, CentroidUpdateSettings, NothingBankedError, find_cluster_routers
from .kmeans import ClusterStats
from .modeling_clusterformer import ZeroInitLinear

logger = logging.getLogger(__name__)

__all__ = ["CentroidUpdateCallback", "FiniteTrainingCallback", "RoutedRateTrainer"]

#: File (one per rank) holding the memory banks inside a checkpoint folder when ``save_memory_bank=True``.
BANK_FILE = "centroid_memory_bank-rank{rank}.safetensors"


class CentroidUpdateCallback(TrainerCallback, ExportableState):
    """Refits the centroids of every cluster layer with spherical K-Means on a memory bank of recent states.

    Schedule: a warm-up fit as soon as each bank holds ``min_states`` states, then a refit every
    ``update_every_epochs`` epochs (paper: every epoch or a few) and/or every ``update_every_steps`` optimizer
    steps, counted on ``state.global_step``. Each refit warm-starts from the current centroids. An epoch's refit
    runs at the epoch's last optimizer step, before that step's log and checkpoint.

    Centroids are model buffers, so checkpoints carry them. The callback's progress (last update step and epoch,
    number of updates) is saved in the checkpoint's ``trainer_state.json`` and restored by
    ``trainer.train(resume_from_checkpoint=...)``; with ``save_memory_bank=True`` the banks are saved too (one
    safetensors file per rank, ``memory_size * hidden_size * 2`` bytes per layer) and a run resumed from any
    checkpoint (within or at the end of an epoch) computes the same centroids and weights as an uninterrupted one.
    They are looked up in ``args.output_dir/checkpoint-{global_step}``.

    Statistics of each fit (cluster sizes min/max, size entropy, mean cosine to the centroid; keys
    ``clusters/layer{i}/...``) trigger a log at that step: they are added to that log's entry in
    ``trainer.state.log_history`` and to the ``logs`` that callbacks after this one receive. The Trainer puts
    the reporting integrations (TensorBoard, W&B, ...) ahead of callbacks passed to it, so call
    ``callback.report_to_integrations(trainer)`` to send the statistics there too.

    Under torchrun / accelerate (DDP, FSDP, DeepSpeed) every rank banks its own states and takes part in every fit
    (distributed Lloyd with the torch backend); all ranks end with bit-identical centroids, whether or not DDP
    broadcasts buffers.

    Args:
        settings: the schedule and K-Means options (default `CentroidUpdateSettings()`: refit every epoch).
        **options: `CentroidUpdateSettings` fields overriding ``settings``: ``update_every_epochs`` (None: no
            epoch-based refits), ``update_every_steps``, ``memory_size`` (per layer and rank), ``min_states`` (all
            ranks together), ``max_capture_per_forward``, ``backend``, ``num_iters``, ``seed``, ``bank_dtype`` (by
            name), ``warm_start``, ``max_points_per_centroid``, ``save_memory_bank``.
    """

    def __init__(self, settings: CentroidUpdateSettings | None = None, **options: Any):
        self.settings = CentroidUpdateSettings.build(settings, **options)
        self.updater: CentroidUpdater | None = None
        self.last_update_step: int | None = None
        self.last_update_epoch: int = 0
        self.num_updates: int = 0
        #: Every fit's statistics: dicts with ``step``, ``epoch`` and ``clusters/layer{i}/...`` values.
        self.history: list[dict[str, float]] = []
        self._pending: dict[str, float] = {}
        self._model_id: int | None = None

    # -- ExportableState -----------------------------------------------------------------------------------------

    def state(self) -> dict:
        """Constructor arguments and progress, stored in ``trainer_state.json`` with every checkpoint."""
        return {
            "args": asdict(self.settings),
            "attributes": {
                "last_update_step": self.last_update_step,
                "last_update_epoch": self.last_update_epoch,
                "num_updates": self.num_updates,
            },
        }

    def _restore(self, state: TrainerState) -> None:
        saved = (state.stateful_callbacks or {}).get(type(self).__name__)
        if isinstance(saved, list):
            saved = saved[0] if saved else None
        if not saved:
            logger.warning(
                "Resuming without saved CentroidUpdateCallback progress; the update schedule restarts here."
            )
            self.last_update_step, self.last_update_epoch = state.global_step, int(round(state.epoch or 0))
            return
        attributes = saved.get("attributes", {})
        for name in ("last_update_step", "last_update_epoch", "num_updates"):
            if name in attributes:
                setattr(self, name, attributes[name])

    def report_to_integrations(self, trainer) -> CentroidUpdateCallback:
        """Move this callback (adding it if needed) ahead of the trainer's other callbacks, so that the reporting
        integrations (TensorBoard, W&B, ...) receive the cluster statistics this callback adds to a log."""
        callbacks = trainer.callback_handler.callbacks
        if self in callbacks:
            callbacks.remove(self)
        callbacks.insert(0, self)
        return self

    # -- Trainer events ------------------------------------------------------------------------------------------

    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, model=None, **kwargs
    ):
        if model is None:
            raise ValueError("CentroidUpdateCallback needs the Trainer's model.")
        if not find_cluster_routers(model):
            logger.warning(
                "%s has no K-Means cluster layers; CentroidUpdateCallback does nothing.", type(model).__name__
            )
            self.updater = None
            return
        if self.updater is None or self._model_id != id(model):
            if self.updater is not None:
                self.updater.close()
            self.updater = CentroidUpdater(model, self.settings)
            self._model_id = id(model)
        else:
            self.updater.attach()
        if state.global_step > 0:
            self._restore(state)
            if self.settings.save_memory_bank:
                self._load_banks(args, state)
        else:
            self.last_update_step, self.last_update_epoch = None, 0
        self.updater.load_state_dict(
            {
                "step_count": state.global_step,
                "last_update_step": self.last_update_step,
                "num_updates": self.num_updates,
            }
        )

    def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs):
        if self.updater is None:
            return
        stats = self.updater.step(state.global_step)
        if stats is not None:
            self._record(stats, args, state, control)
        # An epoch's refit runs at its last step (or the training's), before that step's log and checkpoint, which
        # the Trainer writes before on_epoch_end: a run resumed from that checkpoint continues like an uninterrupted
        # one.
        if float(state.epoch or 0).is_integer() or state.global_step >= state.max_steps > 0:
            self._end_epoch(args, state, control)

    def on_epoch_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs):
        # Already done at the epoch's last step unless that step was not recognisable (an iterable dataset).
        if self.updater is not None:
            self._end_epoch(args, state, control)

    def on_log(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        logs: dict[str, float] | None = None,
        **kwargs,
    ):
        if not self._pending:
            return
        if logs is not None:
            logs.update(self._pending)
        if state.log_history and state.log_history[-1].get("step") == state.global_step:
            state.log_history[-1].update(self._pending)
        self._pending = {}

    def on_save(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs):
        if self.updater is None or not self.settings.save_memory_bank:
            return
        folder = os.path.join(args.output_dir, f"checkpoint-{state.global_step}")
        os.makedirs(folder, exist_ok=True)
        tensors = {name: value.cpu().contiguous() for name, value in self.updater.banks_state_dict().items()}
        save_file(tensors, os.path.join(folder, BANK_FILE.format(rank=args.process_index)))

    def on_train_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs):
        # Stop banking (and free the banks); a later train() call starts new banks.
        if self.updater is not None:
            report = self.updater.unfitted_report()
            if report is not None:
                if state.is_world_process_zero:
                    logger.warning(report[0].upper() + report[1:])
                for router in self.updater.routers.values():
                    router._warned = True  # said here; the eval-mode forward's "train with the callback" would mislead
            self.updater.close()

    # -- helpers -------------------------------------------------------------------------------------------------

    def _end_epoch(self, args: TrainingArguments, state: TrainerState, control: TrainerControl) -> None:
        """The epoch-based refit, when ``update_every_epochs`` epochs have ended since the last one."""
        every = self.settings.update_every_epochs
        epoch = int(round(state.epoch or 0))
        if every is None or epoch - self.last_update_epoch < every:
            return
        if self.updater.last_update_step != state.global_step:
            try:
                stats = self.updater.update()
            except NothingBankedError:  # an evaluation left the model in eval mode before any state was banked
                stats = None
            if stats is None:
                return  # not enough states yet: retry at the next epoch end
            self._record(stats, args, state, control)
        self.last_update_epoch = epoch

    def _record(
        self, stats: dict[int, ClusterStats], args: TrainingArguments, state: TrainerState, control: TrainerControl
    ) -> None:
        self.last_update_step = state.global_step
        self.num_updates = self.updater.num_updates
        values: dict[str, float] = {}
        for index, layer_stats in stats.items():
            values.update(layer_stats.as_log(f"clusters/layer{index}/"))
        self.history.append({"step": state.global_step, "epoch": state.epoch or 0.0, **values})
        if state.log_history and state.log_history[-1].get("step") == state.global_step:
            state.log_history[-1].update(values)  # this step's log is written already
        else:
            self._pending = values
            control.should_log = True
        if state.is_world_process_zero:
            summary = ", ".join(
                f"layer {i}: sizes {s.size_min}-{s.size_max}, entropy {s.normalized_entropy:.3f}, "
                f"cos {s.mean_cosine:.3f} ({s.seconds:.2f} s, {s.backend})"
                for i, s in stats.items()
            )
            logger.info("Centroids updated at step %d: %s", state.global_step, summary)

    def _load_banks(self, args: TrainingArguments, state: TrainerState) -> None:
        folders = [os.path.join(args.output_dir, f"checkpoint-{state.global_step}")]
        if isinstance(args.resume_from_checkpoint, str):
            folders.insert(0, args.resume_from_checkpoint)
        for folder in folders:
            path = os.path.join(folder, BANK_FILE.format(rank=args.process_index))
            if os.path.isfile(path):
                self.updater.load_banks_state_dict(load_file(path))
                return
        logger.warning("No saved memory bank found in %s; banks restart empty.", folders)


class NonFiniteTrainingError(ValueError):
    """Training met a non-finite (NaN or inf) gradient or weight and was stopped (`FiniteTrainingCallback`)."""


def _first_non_finite(tensors) -> str | None:
    """The name of the first of ``(name, tensor)`` pairs holding a NaN or inf (one sum over all of them first)."""
    tensors = [(name, t) for name, t in tensors if t is not None and t.is_floating_point()]
    if not tensors or math.isfinite(float(sum(t.detach().float().sum() for _, t in tensors))):
        return None
    return next((name for name, t in tensors if not bool(torch.isfinite(t.detach()).all())), tensors[0][0])


class FiniteTrainingCallback(TrainerCallback):
    """Stops training with one line (`NonFiniteTrainingError`) at the first non-finite gradient (checked before the
    optimizer step applies it) or weight (after it), before anything of that step is saved: a diverged run leaves
    its earlier checkpoints and no broken model."""

    def on_pre_optimizer_step(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                              model: Any = None, **kwargs: Any) -> None:
        if model is not None:
            self._check(args, state, "gradient", ((n, p.grad) for n, p in model.named_parameters()))

    def on_optimizer_step(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                          model: Any = None, **kwargs: Any) -> None:
        if model is not None:
            self._check(args, state, "weights", model.named_parameters())

    @staticmethod
    def _check(args: TrainingArguments, state: TrainerState, what: str, tensors) -> None:
        name = _first_non_finite(list(tensors))
        if name is not None:
            raise NonFiniteTrainingError(
                f"training stopped at step {state.global_step + 1}: the {what} of {name} became NaN or inf (the loss "
                f"diverged), so no model was saved from this run; lower --learning_rate (it is "
                f"{args.learning_rate:g}) or check the data, and train again."
            )


def zero_started_parameters(model: torch.nn.Module) -> dict[str, torch.nn.Parameter]:
    """Name -> parameter of the modules that start at zero (`ZeroInitLinear`, a window_cluster layer's
    ``routed_output``), named as ``model.named_parameters()`` names them."""
    return {f"{module_name}.{name}": parameter for module_name, module in model.named_modules()
            if isinstance(module, ZeroInitLinear) for name, parameter in module.named_parameters()}


class RoutedRateTrainer(Trainer):
    """A `Trainer` whose optimizer trains the zero-started routed projections (`ZeroInitLinear`, a window_cluster
    layer's ``routed_output``) at ``routed_learning_rate_scale`` times each group's rate; the scheduler follows."""

    def __init__(self, *args: Any, routed_learning_rate_scale: float = 1.0, **kwargs: Any):
        if not routed_learning_rate_scale > 0:
            raise ValueError(f"routed_learning_rate_scale must be positive, got {routed_learning_rate_scale}.")
        if routed_learning_rate_scale != 1 and (kwargs.get("optimizers") or (None,))[0] is not None:
            raise ValueError("routed_learning_rate_scale applies to the optimizer the Trainer creates; with your own "
                             "optimizer, give the routed projections (routed_output) a group of their own instead.")
        super().__init__(*args, **kwargs)
        self.routed_learning_rate_scale = routed_learning_rate_scale

    def create_optimizer(self, model=None) -> torch.optim.Optimizer:
        created = self.optimizer is None  # split once, as it is made (a second call returns it as it is)
        optimizer = super().create_optimizer(model)
        routed = {id(p) for p in zero_started_parameters(model or self.model).values()}
        if created and self.routed_learning_rate_scale != 1 and not routed:
            logger.warning("routed_learning_rate_scale %s changes nothing: the model has no window_cluster layer.",
                           self.routed_learning_rate_scale)
        if not created or self.routed_learning_rate_scale == 1 or not routed:
            return optimizer
        groups = [{**group, "params": params, "lr": group["lr"] * scale}
                  for group in optimizer.param_groups
                  for params, scale in (([p for p in group["params"] if id(p) not in routed], 1.0),
                                        ([p for p in group["params"] if id(p) in routed],
                                         self.routed_learning_rate_scale))
                  if params]
        optimizer.param_groups.clear()  # no step taken yet: the groups are split, the optimizer's state is empty
        for group in groups:
            optimizer.add_param_group(group)
        return optimizer
