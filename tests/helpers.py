"""Small builders shared by the tests: tiny configs, pair-encoded and single-text batches made from token ids,
SQuAD-format data files, a tiny world for the commands, and a QA data set and callback for the Trainer."""

from __future__ import annotations

import contextlib
import json
import logging
import os
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
    """Save a tiny RoBERTa checkpoint (2 layers, 32 wide) with ``head`` (a transformers RoBERTa class; default the
    plain encoder, no pooler) and ``tokenizer`` to ``path``."""
    from transformers import RobertaConfig, RobertaModel

    config = RobertaConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                           intermediate_size=64, max_position_embeddings=514, type_vocab_size=1, **config)
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
