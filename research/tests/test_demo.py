"""`make demo`'s script end to end with its smoke recipe (``--quick``: a tiny random BERT, seconds of training), then
its last step again on the saved models (``--answer_only``)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ENV = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1")


def _demo(*args: str) -> str:
    done = subprocess.run([sys.executable, str(ROOT / "examples" / "demo.py"), *args], capture_output=True, text=True,
                          env=ENV, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return done.stdout


def test_the_demo_trains_saves_and_answers_then_answers_again(tmp_path):
    out = _demo("--quick", "--output_dir", str(tmp_path))
    assert "| window-cluster |" in out and "| sliding |" in out and "Positional shortcuts" in out
    first = re.findall(r"^  ([\w-]+): right on (\d+) of the 50$", out, flags=re.M)
    assert {variant for variant, _ in first} >= {"window-cluster", "sliding"}
    for variant in ("window-cluster", "sliding"):
        assert (tmp_path / variant / "model.safetensors").is_file()
    again = _demo("--quick", "--output_dir", str(tmp_path), "--answer_only")
    assert re.findall(r"^  ([\w-]+): right on (\d+) of the 50$", again, flags=re.M) == first
    alone = dict(re.findall(r"^right by ([\w-]+) alone: (\d+)$", again, flags=re.M))
    assert set(alone) >= {"window-cluster", "sliding"}  # the smoke recipe trains lsh and sparse too
    assert again.count("the first of them, Q: ") == sum(int(n) > 0 for n in alone.values())
    assert "saved to" in out and "saved to" not in again


def test_answer_only_without_saved_models_says_so_in_one_line(tmp_path):
    done = subprocess.run([sys.executable, str(ROOT / "examples" / "demo.py"), "--quick", "--answer_only",
                           "--output_dir", str(tmp_path)], capture_output=True, text=True, env=ENV, timeout=600)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip().count("\n") == 0 and "--answer_only needs the models" in done.stderr
