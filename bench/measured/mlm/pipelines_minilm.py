"""The fill-mask, text-classification and token-classification pipelines on one 10k-token SQuAD text in one pass,
with all-MiniLM-L6-v2 converted to each head (windows 128/112, a cluster layer at layer 3; the classification heads are
new, so only the time and the one pass mean anything). Writes pipelines_minilm.json beside this file.

Usage: OMP_NUM_THREADS=1 nice -n 10 .venv/bin/python bench/measured/mlm/pipelines_minilm.py
"""

from __future__ import annotations

import json
import platform
import tempfile
import time
from pathlib import Path

import torch
from transformers import pipeline

import hf_clusterformer  # noqa: F401  (registers the heads with the Auto classes and pipelines)
from hf_clusterformer.data.multipassage import default_squad_path, read_squad
from hf_clusterformer.conversion import convert_checkpoint
from hf_clusterformer.pretrained import fetch_pretrained

TASKS = {"mlm": "fill-mask", "sequence-classification": "text-classification",
         "token-classification": "token-classification"}


def main() -> None:
    source = fetch_pretrained()
    articles = [" ".join(p["context"] for p in a["paragraphs"]) for a in read_squad(default_squad_path())["data"]]
    results = {"torch_threads": torch.get_num_threads(), "machine": platform.processor() or platform.machine()}
    with tempfile.TemporaryDirectory() as folder:
        for task, name in TASKS.items():
            converted = convert_checkpoint(source, Path(folder) / task, task=task, window_size=128, window_stride=112,
                                           cluster_layers=[3], global_layer_type="cluster", num_clusters=16)
            run = pipeline(name, model=str(converted.path), device="cpu")
            text, count = "", 0
            for article in articles:  # whole articles until 10k tokens
                text = f"{text} {article}".strip()
                count = len(run.tokenizer(text)["input_ids"])
                if count >= 10_000:
                    break
            if task == "mlm":
                text = text[: text.rindex(" ", 0, len(text) - 20)] + " [MASK]" + text[len(text) - 20 :]
            calls = []
            run.model.register_forward_pre_hook(
                lambda module, args, kwargs: calls.append(kwargs["input_ids"].shape[-1]), with_kwargs=True)
            run(text[:200] + (" [MASK]." if task == "mlm" else ""))  # warm-up
            calls.clear()
            started = time.perf_counter()
            output = run(text)
            seconds = time.perf_counter() - started
            results[name] = {"tokens": len(run.tokenizer(text)["input_ids"]), "forward_calls": calls,
                             "seconds": round(seconds, 2), "outputs": len(output)}
            print(name, results[name], flush=True)
    out = Path(__file__).with_name("pipelines_minilm.json")
    out.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
