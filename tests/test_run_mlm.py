"""examples/run_mlm.py end to end at tiny size (the SQuAD dev articles, a model from scratch), its own text files, its
errors, and the window breakdown of its evaluation against a direct count."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForMaskedLM

import hf_clusterformer  # noqa: F401  (registers the Auto classes)
from hf_clusterformer import ClusterFormerForMaskedLM
from hf_clusterformer.data import default_squad_path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "examples" / "run_mlm.py"
TINY = [
    "--hidden_size", "32", "--num_hidden_layers", "2", "--num_attention_heads", "2", "--intermediate_size", "64",
    "--vocab_size", "400", "--window_size", "32", "--window_stride", "24", "--cluster_layers", "1",
    "--num_clusters", "8",
    "--max_seq_length", "512", "--max_train_samples", "6", "--max_eval_samples", "2", "--initial_centroid_blocks", "2",
    "--max_steps", "4", "--per_device_train_batch_size", "2", "--centroid_update_steps", "2", "--memory_size", "2000",
    "--save_strategy", "no", "--report_to", "none", "--use_cpu", "--seed", "0", "--disable_tqdm", "true",
]


def run_script(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, env=env, timeout=600)


@pytest.fixture(scope="module")
def run_mlm():
    """The script as a module (examples/ is not a package)."""
    spec = importlib.util.spec_from_file_location("run_mlm", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["run_mlm"] = module  # its dataclasses look their module up
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        del sys.modules["run_mlm"]


@pytest.mark.skipif(not default_squad_path().exists(), reason="SQuAD v1.1 dev is not in ../shared/data")
def test_run_mlm_on_squad_articles_end_to_end(tmp_path):
    out = tmp_path / "mlm"
    proc = run_script(*TINY, "--output_dir", str(out), "--do_train", "--do_eval")
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads((out / "all_results.json").read_text())
    assert results["layer_kinds"] == "sliding,cluster" and results["train_steps"] == 4
    assert results["train_blocks"] == 6 and results["eval_blocks"] == 2
    assert results["eval_masked_tokens"] == results["eval_masked_tokens_before"] > 0  # the same masks before and after
    assert 0 < results["eval_outside_fraction"] <= 1 and results["eval_loss"] != results["eval_loss_before"]
    model = AutoModelForMaskedLM.from_pretrained(out)
    assert isinstance(model, ClusterFormerForMaskedLM)
    assert all(bool(router.fitted) for router in model.cluster_routers().values())
    assert json.loads((out / "config.json").read_text())["auto_map"]["AutoModelForMaskedLM"].endswith("ForMaskedLM")

    again = run_script(*TINY, "--output_dir", str(out), "--do_train")
    assert again.returncode == 2 and "already holds a model" in again.stderr and "--overwrite" in again.stderr


def test_run_mlm_on_text_files_continues_a_checkpoint(tmp_path):
    sentences = ["The river runs past the old mill and the bridge.", "Melka keeps bees behind the house in Tarsk.",
                 "Zorvan walks to the market every morning."]
    documents = ["\n".join(sentences[(i + j) % 3] for j in range(60)) for i in range(4)]
    (tmp_path / "train.txt").write_text("\n\n".join(documents[:3]), encoding="utf-8")
    (tmp_path / "held.jsonl").write_text(json.dumps({"text": documents[3]}) + "\n", encoding="utf-8")
    files = ["--train_file", str(tmp_path / "train.txt"), "--validation_file", str(tmp_path / "held.jsonl")]
    first = run_script(*TINY, *files, "--output_dir", str(tmp_path / "a"), "--do_train", "--min_block_length", "8")
    assert first.returncode == 0, first.stderr[-3000:]
    second = run_script("--model_name_or_path", str(tmp_path / "a"), "--max_steps", "2", "--seed", "0",
                        "--max_seq_length", "512", "--save_strategy", "no", "--report_to", "none", "--use_cpu",
                        *files, "--output_dir", str(tmp_path / "b"), "--do_train", "--do_eval")
    assert second.returncode == 0, second.stderr[-3000:]
    results = json.loads((tmp_path / "b" / "all_results.json").read_text())
    assert results["eval_blocks"] >= 1 and results["layer_kinds"] == "sliding,cluster"

    bad = run_script(*TINY, "--train_file", str(tmp_path / "missing.txt"), "--output_dir", str(tmp_path / "c"),
                     "--do_train")
    assert bad.returncode == 2 and "missing.txt does not exist" in bad.stderr


def test_train_head_only_changes_the_head_alone_and_its_folder_takes_a_cluster_layer(tmp_path):
    """``--train_head_only`` (a start for a checkpoint without an MLM head): the encoder and the tied decoder stay as
    they were, the head's own weights move; its folder then continues with a cluster layer of any size."""
    from safetensors.torch import load_file

    sentences = ["The river runs past the old mill and the bridge.", "Melka keeps bees behind the house in Tarsk."]
    text = "\n\n".join("\n".join(sentences[(i + j) % 2] for j in range(30)) for i in range(3))
    (tmp_path / "train.txt").write_text(text, encoding="utf-8")
    files = ["--train_file", str(tmp_path / "train.txt"), "--validation_file", str(tmp_path / "train.txt"),
             "--min_block_length", "8"]
    plain = [arg for arg in TINY if arg not in ("--cluster_layers", "1")] + ["--cluster_layers"]
    assert run_script(*plain, *files, "--output_dir", str(tmp_path / "start"), "--do_train").returncode == 0
    common = ["--max_steps", "2", "--learning_rate", "1e-2", "--max_seq_length", "32", "--save_strategy", "no",
              "--report_to", "none", "--use_cpu", "--seed", "0", *files]
    head = run_script("--model_name_or_path", str(tmp_path / "start"), "--train_head_only", *common,
                      "--output_dir", str(tmp_path / "head"), "--do_train", "--do_eval")
    assert head.returncode == 0, head.stderr[-3000:]
    results = json.loads((tmp_path / "head" / "all_results.json").read_text())
    assert results["trained_weights"].split(",") == ["lm_head.bias", "lm_head.dense.weight", "lm_head.dense.bias",
                                                     "lm_head.layer_norm.weight", "lm_head.layer_norm.bias"]
    before, after = (load_file(tmp_path / name / "model.safetensors") for name in ("start", "head"))
    moved = {key for key in before if not torch.equal(before[key], after[key])}
    assert moved == set(results["trained_weights"].split(",")), moved
    continued = run_script("--model_name_or_path", str(tmp_path / "head"), "--cluster_layers", "1", "--num_clusters",
                           "4", *common, "--max_steps", "1", "--output_dir", str(tmp_path / "continued"), "--do_train")
    assert continued.returncode == 0, continued.stderr[-3000:]


def test_outside_window_matches_a_direct_count(run_mlm):
    """A masked token counts as outside when a visible copy of it lies in no window that holds it."""
    generator = torch.Generator().manual_seed(0)
    size, stride, length = 8, 6, 60
    ids = torch.randint(4, 40, (length,), generator=generator)
    ids[0], ids[-1] = 0, 2
    labels = torch.full_like(ids, -100)
    masked = torch.randperm(length - 2, generator=generator)[:15] + 1
    labels[masked] = ids[masked]
    shown = ids.clone()
    shown[masked] = 3  # <mask>
    windows = 1 + -(-(length - 1 - size) // stride)
    expected = []
    for position in sorted(masked.tolist()):
        covered = set()
        for k in range(windows):
            span = range(1 + k * stride, 1 + k * stride + size)
            if position in span:
                covered |= set(span)
        expected.append(any(shown[q] == ids[position] and q not in covered for q in range(length)))
    assert run_mlm.outside_window(shown, labels, size, stride).tolist() == expected
    assert 0 < sum(expected) < len(expected)


def test_masking_never_draws_a_special_token_and_evaluation_passes_its_mask(run_mlm):
    """Row: ``--do_train --do_eval`` on ordinary text failed with "attention_mask row 0 mixes padding into the
    tokens": BERT's random replacement drew the pad id and the evaluation called the model without its mask."""
    from hf_clusterformer.data.tokenizer import build_tokenizer

    tokenizer = build_tokenizer(["a b c d e f g h i j k l m n o p"] * 4, vocab_size=300)
    special = set(tokenizer.all_special_ids) - {tokenizer.mask_token_id}
    blocks = run_mlm.cut_blocks(["a b c d e f g h i j k l m n o p " * 8], tokenizer, 64, 8, None)
    collator = run_mlm.MlmCollator(tokenizer, 0.9)
    for _ in range(20):
        batch = collator([{"input_ids": ids} for ids in blocks["input_ids"]])
        inside = batch["input_ids"][:, 1:-1][batch["labels"][:, 1:-1] != -100]
        assert not set(inside.tolist()) & special
    held_out = run_mlm.mask_once(blocks, tokenizer, 0.9, seed=0)
    masked = torch.tensor(held_out["input_ids"][0])[torch.tensor(held_out["labels"][0]) != -100]
    assert not set(masked.tolist()) & special
    row = {"input_ids": list(blocks["input_ids"][0]), "attention_mask": list(blocks["attention_mask"][0])}
    row["input_ids"][5] = tokenizer.pad_token_id  # a pad id among the tokens (as an older masking drew) is a token
    row["labels"] = [-100] * len(row["input_ids"])
    row["labels"][5] = row["input_ids"][6]
    config = dict(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                  intermediate_size=64, window_size=16, window_stride=12, cluster_layers=[1], num_clusters=4,
                  max_question_length=8, max_position_embeddings=64, pad_token_id=tokenizer.pad_token_id)
    model = ClusterFormerForMaskedLM(hf_clusterformer.ClusterFormerConfig(**config))
    import datasets

    scores = run_mlm.evaluate_blocks(model, datasets.Dataset.from_list([row]))
    assert scores["masked_tokens"] == 1 and scores["loss"] > 0


def test_a_run_with_nothing_to_do_and_a_non_utf8_file_are_one_line(run_mlm, tmp_path):
    """Rows: without --do_train / --do_eval the script exited 0 having done nothing and left an all_results.json that
    blocked the next run; a file that is not UTF-8 gave the codec's message without the file's name."""
    latin = tmp_path / "latin.txt"
    latin.write_bytes("Caf\u00e9 au lait.\n\nUn autre.".encode("latin-1"))
    with pytest.raises(ValueError, match=f"data file {latin} is not UTF-8 text"):
        run_mlm.read_documents(str(latin))
    out = tmp_path / "out"
    result = run_script("--train_file", str(latin), "--output_dir", str(out), *TINY)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stderr[-2000:]
    assert lines[0].startswith("run_mlm.py: error: nothing to do: give --do_train, --do_eval or both"), lines
    assert not out.exists()
