"""CentroidUpdateCallback inside the Hugging Face Trainer: schedule, logs, checkpoints and resume."""

from __future__ import annotations

import os

import pytest
import torch
from helpers import CentroidSnapshots, TinyQA, tiny_config
from safetensors.torch import load_file
from transformers import Trainer, TrainerCallback, TrainingArguments

from hf_clusterformer import ClusterFormerForQuestionAnswering
from hf_clusterformer.callback import BANK_FILE, CentroidUpdateCallback

CENTROIDS = "roberta.encoder.layer.2.router.centroids"


def make_trainer(
    output_dir, callback: CentroidUpdateCallback, snapshots=None, cluster_layers=(2,), train_size=16, **arguments
) -> Trainer:
    torch.manual_seed(0)
    config = tiny_config(hidden_dropout_prob=0.1, cluster_layers=list(cluster_layers))
    model = ClusterFormerForQuestionAnswering(config)
    values = dict(
        output_dir=str(output_dir),
        per_device_train_batch_size=4,
        learning_rate=1e-3,
        num_train_epochs=2,
        logging_steps=1000,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        seed=0,
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    values.update(arguments)
    callbacks = [callback] + ([snapshots] if snapshots is not None else [])
    return Trainer(
        model=model, args=TrainingArguments(**values), train_dataset=TinyQA(train_size), callbacks=callbacks
    )


def fit_steps(trainer: Trainer) -> list[int]:
    """Steps whose log entry holds centroid statistics."""
    return [entry["step"] for entry in trainer.state.log_history if "clusters/layer2/size_min" in entry]


def test_trainer_warm_up_step_and_epoch_schedule_and_logs(tmp_path):
    callback = CentroidUpdateCallback(update_every_epochs=1, update_every_steps=3, min_states=1)
    trainer = make_trainer(tmp_path, callback)
    router = trainer.model.cluster_routers()[2]
    pointer = router.centroids.data_ptr()
    trainer.train()
    # 4 steps per epoch: warm-up at step 1 (8 states suffice), step-based at 4 and 7, epoch end at 8
    # (epoch 1 ends at step 4, right after the step-based fit, and does not fit twice).
    assert [h["step"] for h in callback.history] == [1, 4, 7, 8]
    assert fit_steps(trainer) == [1, 4, 7, 8]
    entry = next(e for e in trainer.state.log_history if "clusters/layer2/size_min" in e)
    for name in ("size_min", "size_max", "entropy", "normalized_entropy", "mean_cosine", "num_states"):
        assert f"clusters/layer2/{name}" in entry
    assert 0 < entry["clusters/layer2/mean_cosine"] <= 1
    assert bool(router.fitted) and router.centroids.data_ptr() == pointer
    torch.testing.assert_close(router.centroids.norm(dim=1), torch.ones(8))
    assert callback.num_updates == 4 and callback.last_update_epoch == 2
    assert len(callback.updater.banks[2]) == 0 and not callback.updater._handles  # released after training


class LogRecorder(TrainerCallback):
    """Keeps the logs it is sent, as a reporting integration (TensorBoard, W&B) would."""

    def __init__(self):
        self.logs: list[dict] = []

    def on_log(self, args, state, control, logs=None, **kwargs):
        self.logs.append(dict(logs or {}))


def test_statistics_reach_reporters_placed_before_the_callback(tmp_path):
    # The Trainer puts integrations ahead of user callbacks; a recorder placed first stands in for them.
    for move in (False, True):
        callback, recorder = CentroidUpdateCallback(update_every_epochs=1, min_states=1), LogRecorder()
        torch.manual_seed(0)
        model = ClusterFormerForQuestionAnswering(tiny_config(cluster_layers=[2]))
        args = TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=4, num_train_epochs=1,
                                 logging_steps=1000, save_strategy="no", report_to="none", use_cpu=True,
                                 disable_tqdm=True)
        trainer = Trainer(model=model, args=args, train_dataset=TinyQA(16), callbacks=[recorder, callback])
        if move:
            assert callback.report_to_integrations(trainer) is callback
            assert trainer.callback_handler.callbacks[0] is callback
            assert trainer.callback_handler.callbacks.count(callback) == 1
        trainer.train()
        seen = [log for log in recorder.logs if "clusters/layer2/size_min" in log]
        assert len(seen) == (len(callback.history) if move else 0)
        assert len(callback.history) >= 1


def test_default_schedule_fits_each_epoch_once_banked(tmp_path):
    callback = CentroidUpdateCallback(min_states=300)
    trainer = make_trainer(tmp_path, callback, num_train_epochs=3)
    trainer.train()
    steps = [h["step"] for h in callback.history]
    # Warm-up once 300 states are banked (some step of epoch 1), then every epoch end.
    assert len(steps) in (3, 4) and steps[-2:] == [8, 12] and steps[0] <= 4
    assert all(h["clusters/layer2/num_states"] >= 300 for h in callback.history)


@pytest.mark.parametrize("restore_callback_states", [False, True])
def test_resume_continues_with_identical_centroids(tmp_path, restore_callback_states):
    def run(resume: bool):
        callback = CentroidUpdateCallback(
            update_every_epochs=None, update_every_steps=3, min_states=1, save_memory_bank=True
        )
        snapshots = CentroidSnapshots()
        trainer = make_trainer(
            tmp_path,
            callback,
            snapshots,
            max_steps=8,
            save_strategy="steps",
            save_steps=4,
            restore_callback_states_from_checkpoint=restore_callback_states,
        )
        trainer.train(resume_from_checkpoint=str(tmp_path / "checkpoint-4") if resume else None)
        active = next(cb for cb in trainer.callback_handler.callbacks if isinstance(cb, CentroidUpdateCallback))
        return trainer, active, snapshots

    full, full_callback, full_snapshots = run(resume=False)
    assert [h["step"] for h in full_callback.history] == [1, 4, 7]
    checkpoint = tmp_path / "checkpoint-4"
    assert os.path.isfile(checkpoint / BANK_FILE.format(rank=0))
    saved = load_file(checkpoint / "model.safetensors")
    assert torch.equal(saved[CENTROIDS], full_snapshots.by_step[5])  # fitted at step 4, used from step 5

    resumed, resumed_callback, resumed_snapshots = run(resume=True)
    # Progress came back: no fit at the start, the next one at step 7 (3 steps after the fit at 4), count continues.
    assert [h["step"] for h in resumed_callback.history] == [7]
    assert resumed_callback.num_updates == 3
    assert sorted(resumed_snapshots.by_step) == [5, 6, 7, 8]
    for step in (5, 6, 7, 8):
        assert torch.equal(resumed_snapshots.by_step[step], full_snapshots.by_step[step]), step
    assert torch.equal(resumed.model.cluster_routers()[2].centroids, full.model.cluster_routers()[2].centroids)


def test_resume_without_saved_banks_keeps_schedule_and_centroids(tmp_path):
    def run(resume: bool):
        callback = CentroidUpdateCallback(update_every_epochs=None, update_every_steps=3, min_states=1)
        snapshots = CentroidSnapshots()
        trainer = make_trainer(tmp_path, callback, snapshots, max_steps=8, save_strategy="steps", save_steps=4)
        trainer.train(resume_from_checkpoint=str(tmp_path / "checkpoint-4") if resume else None)
        return callback, snapshots

    full_callback, full_snapshots = run(resume=False)
    assert not (tmp_path / "checkpoint-4" / BANK_FILE.format(rank=0)).exists()
    resumed_callback, resumed_snapshots = run(resume=True)
    assert [h["step"] for h in resumed_callback.history] == [7]
    # Until the next fit the resumed model routes with the checkpoint's centroids.
    for step in (5, 6, 7):
        assert torch.equal(resumed_snapshots.by_step[step], full_snapshots.by_step[step])
    assert not torch.equal(resumed_snapshots.by_step[8], full_snapshots.by_step[7])
    # The bank restarted at step 5, so the fit at 7 saw fewer states than the uninterrupted run's.
    states = "clusters/layer2/num_states"
    assert resumed_callback.history[0][states] < full_callback.history[-1][states]


def test_callback_state_is_json_ready_and_validated():
    callback = CentroidUpdateCallback(update_every_steps=5, bank_dtype="bfloat16")
    state = callback.state()
    assert state["args"]["update_every_steps"] == 5 and state["attributes"]["num_updates"] == 0
    clone = CentroidUpdateCallback.from_state(state)
    assert clone.settings == callback.settings
    with pytest.raises(ValueError, match="update_every_steps"):
        CentroidUpdateCallback(update_every_steps=0)
    with pytest.raises(ValueError, match="bank_dtype"):
        CentroidUpdateCallback(bank_dtype="float17")
    # Row: a backend name that does not exist (or no Lloyd iteration) was refused only at the first fit
    with pytest.raises(ValueError, match="^backend must be 'auto' or one of torch, faiss-cpu, faiss-gpu, got 'cuda'"):
        CentroidUpdateCallback(backend="cuda")
    with pytest.raises(ValueError, match="^num_iters must be positive, got 0.$"):
        CentroidUpdateCallback(num_iters=0)


def test_model_without_cluster_layers_trains_untouched(tmp_path, caplog):
    callback = CentroidUpdateCallback(update_every_steps=1)
    trainer = make_trainer(tmp_path, callback, cluster_layers=(), max_steps=2)
    with caplog.at_level("WARNING", logger="hf_clusterformer.callback"):
        trainer.train()
    assert "no K-Means cluster layers" in caplog.text
    assert callback.updater is None and callback.history == []


def test_qa_trainer_puts_the_callback_ahead_of_reporters(tmp_path):
    from hf_clusterformer.data import build_tokenizer
    from hf_clusterformer.qa_training import make_trainer as make_qa_trainer

    callback, recorder = CentroidUpdateCallback(), LogRecorder()
    model = ClusterFormerForQuestionAnswering(tiny_config(cluster_layers=[2]))
    args = TrainingArguments(output_dir=str(tmp_path), report_to="none", use_cpu=True)
    tokenizer = build_tokenizer(["Where does Anna live? Anna lives in Paris."] * 20, vocab_size=300)
    trainer = make_qa_trainer(model, args, TinyQA(4), tokenizer, [recorder, callback])
    assert trainer.callback_handler.callbacks[0] is callback and recorder in trainer.callback_handler.callbacks


def test_callback_updater_and_run_qa_flags_share_one_settings_object(tmp_path):
    from hf_clusterformer.centroid_updates import CentroidUpdateSettings
    from hf_clusterformer.qa_training import CentroidArguments, parse_args

    settings = CentroidUpdateSettings(update_every_epochs=None, update_every_steps=2, memory_size=300, min_states=1)
    callback = CentroidUpdateCallback(settings, seed=5)
    assert callback.settings == CentroidUpdateSettings(**{**vars(settings), "seed": 5})
    trainer = make_trainer(tmp_path, callback, max_steps=2)
    trainer.train()
    assert callback.updater.settings == callback.settings and callback.updater.banks[2].capacity == 300
    assert [h["step"] for h in callback.history] == [1]

    _, _, centroid_args, _ = parse_args(["--output_dir", str(tmp_path), "--centroid_update_steps", "3",
                                         "--centroid_update_epochs", "2", "--centroid_backend", "torch"])
    expected = CentroidUpdateSettings(update_every_steps=3, update_every_epochs=2, backend="torch")
    assert centroid_args.settings() == expected
    assert CentroidArguments().settings() == CentroidUpdateSettings()
    with pytest.raises(ValueError, match="memory_size must be positive"):
        CentroidArguments(memory_size=0).settings()


@pytest.mark.parametrize(
    "save, checkpoint",
    [({"save_strategy": "epoch"}, 10), ({"save_strategy": "steps", "save_steps": 5}, 10),
     ({"save_strategy": "steps", "save_steps": 4}, 8)],
    ids=["epoch-end-by-epoch", "epoch-end-by-steps", "mid-epoch"],
)
def test_resume_at_any_checkpoint_reproduces_the_uninterrupted_run(tmp_path, save, checkpoint):
    # 5 steps per epoch, 4 epochs; refits at epoch ends and every 3 steps, logs every 5 steps (at epoch ends).
    def run(resume: bool):
        callback = CentroidUpdateCallback(
            update_every_epochs=1, update_every_steps=3, min_states=1, save_memory_bank=True
        )
        trainer = make_trainer(tmp_path, callback, train_size=20, num_train_epochs=4, logging_steps=5, **save)
        trainer.train(resume_from_checkpoint=str(tmp_path / f"checkpoint-{checkpoint}") if resume else None)
        return trainer, callback

    full, full_callback = run(resume=False)
    schedule = [1, 4, 5, 8, 10, 13, 15, 18, 20]
    assert [h["step"] for h in full_callback.history] == schedule
    assert fit_steps(full) == schedule  # epoch-end statistics reach log_history, in the log of their step
    assert full_callback.num_updates == len(schedule)

    resumed, resumed_callback = run(resume=True)
    assert [h["step"] for h in resumed_callback.history] == [s for s in schedule if s > checkpoint]
    assert fit_steps(resumed) == schedule
    assert resumed_callback.num_updates == len(schedule)
    for ours, theirs in zip(resumed_callback.history, full_callback.history[-len(resumed_callback.history):]):
        assert {k: v for k, v in ours.items() if k != "clusters/layer2/seconds"} == {
            k: v for k, v in theirs.items() if k != "clusters/layer2/seconds"
        }
    full_weights, resumed_weights = full.model.state_dict(), resumed.model.state_dict()
    assert full_weights.keys() == resumed_weights.keys()
    for name in full_weights:
        assert torch.equal(full_weights[name], resumed_weights[name]), name
