"""The README's Python blocks run as written, in order, in a fresh interpreter, twice in the same folder: tiny models
stand in for the checkpoints they name (a 24-layer, 16-wide RoBERTa QA model at ``path/to/roberta-checkpoint``), and
the Hub they push to and load from is the local test server."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import torch
from support.hub_fixtures import client_env
from transformers import RobertaConfig, RobertaForQuestionAnswering

from clusterformer_research.longrange import generate_longrange_dataset
from hf_clusterformer.data import build_tokenizer

README = Path(__file__).resolve().parents[1] / "README.md"


def python_blocks(text: str) -> list[str]:
    """The ```python blocks of a Markdown text."""
    return re.findall(r"^```python\n(.*?)^```$", text, flags=re.M | re.S)


def test_readme_python_blocks_run(hub_server, tmp_path):
    blocks = python_blocks(README.read_text(encoding="utf-8"))
    assert len(blocks) >= 5 and any("Trainer(" in block for block in blocks)

    context = generate_longrange_dataset(1, 0, (2500, 2500), "longrange")[0]["context"]
    (tmp_path / "long_context.txt").write_text(context, encoding="utf-8")
    samples = [row["context"] for row in generate_longrange_dataset(4, 1, (400, 600), "longrange")]
    tokenizer = build_tokenizer([context, *samples, "Where does Zorvan live?"], vocab_size=400)
    config = RobertaConfig(vocab_size=len(tokenizer), hidden_size=16, num_hidden_layers=24, num_attention_heads=2,
                           intermediate_size=32, max_position_embeddings=514, type_vocab_size=1, pad_token_id=1,
                           bos_token_id=0, eos_token_id=2)
    torch.manual_seed(0)
    checkpoint = tmp_path / "path" / "to" / "roberta-checkpoint"
    RobertaForQuestionAnswering(config).save_pretrained(checkpoint)
    tokenizer.save_pretrained(checkpoint)

    minilm = _tiny_minilm_copy(tmp_path / "minilm", context)

    script = "import torch\ntorch.set_num_threads(1)\n" + "\n".join(blocks)
    env = dict(
        client_env(hub_server.url, tmp_path / "hf-home"), OMP_NUM_THREADS="1", HF_CLUSTERFORMER_CACHE=str(minilm)
    )
    for run in range(2):  # a user runs the blocks again in the same folder: its second run works too
        result = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True,
                                timeout=600)
        assert result.returncode == 0, (run, result.stderr[-5000:])
    assert (tmp_path / "outputs" / "trained" / "modeling_clusterformer.py").is_file()
    assert ("POST", "/api/models/user/clusterformer/commit/main") in hub_server.requests


def _tiny_minilm_copy(path: Path, text: str) -> Path:
    """A tiny random BERT laid out as a `pack_pretrained` copy of all-MiniLM-L6-v2 (its manifest names the published
    source hash and the hash of these weights), standing in for the real weights."""
    import hashlib
    import json

    from transformers import BertConfig, BertModel, BertTokenizerFast

    from hf_clusterformer.pretrained import MANIFEST, PRETRAINED_SOURCES

    words = sorted(set(re.findall(r"\w+|[^\w\s]", text.lower())))
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words]
    BertTokenizerFast(vocab={token: i for i, token in enumerate(vocab)}).save_pretrained(path)
    torch.manual_seed(0)
    BertModel(BertConfig(vocab_size=len(vocab), hidden_size=16, num_hidden_layers=6, num_attention_heads=2,
                         intermediate_size=32, pad_token_id=0)).save_pretrained(path)
    source = PRETRAINED_SOURCES["all-MiniLM-L6-v2"]
    for name in source.files:  # files a transformers 5 save does not write
        if not (path / name).exists():
            (path / name).write_text("\n".join(vocab) + "\n" if name == "vocab.txt" else "{}")
    weights = hashlib.sha256((path / "model.safetensors").read_bytes()).hexdigest()
    (path / MANIFEST).write_text(json.dumps({"source_sha256": source.weights_sha256, "sha256": weights}))
    return path


def test_readme_command_lines_name_real_options(capsys):
    """Every ``clusterformer`` line of the README's command-line block names a subcommand and options that its
    ``--help`` lists."""
    import pytest

    from hf_clusterformer_cli import main

    text = README.read_text(encoding="utf-8")
    block = text[text.index("## Command line") :].split("```")[1]
    lines = [line.split("#")[0].split() for line in block.splitlines() if line.startswith("clusterformer ")]
    commands = {"train", "evaluate", "predict", "inspect", "convert", "push", "card", "export"}
    assert {line[1] for line in lines} == commands
    for line in lines:
        with pytest.raises(SystemExit) as exit_info:
            main([line[1], "--help"])
        assert exit_info.value.code == 0
        help_text = capsys.readouterr().out
        for option in (token.strip("[]") for token in line if token.strip("[").startswith("--")):
            assert re.search(rf"{re.escape(option)}\b", help_text), (line[1], option)
