"""Re-try, as a user would (the CLI, the examples and a few Python calls on tiny models), every trap listed by the
"nothing a user made is lost, round four" study, and print one row per trap: what was run, the exit status, the last
line it printed and whether the folder/result is what the rule asks for.

    .venv/bin/python bench/measured/safety/retrial.py [WORKDIR] > bench/measured/safety/retrial.md

Runs in about five minutes on one core; nothing outside WORKDIR (default: a fresh temporary folder) is touched.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
PY = sys.executable
ENV = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1")
SENTENCES = ["Zorvan lives with Melka in the old house by the river.",
             "Melka lives in Tarsk, a town known for its bridge.",
             "The market was quiet that morning and the road was wet."]
QUESTION = "Where does Melka live?"
CONTEXT = " ".join(SENTENCES[i % 3] for i in range(12))
SMALL = ["--cluster-layers", "1", "--num-clusters", "4", "--window-size", "32", "--window-stride", "24",
         "--max-question-length", "16"]
TINY_TRAIN = ["--hidden_size", "32", "--num_hidden_layers", "2", "--num_attention_heads", "2",
              "--intermediate_size", "64", "--window_size", "32", "--window_stride", "24", "--max_question_length", "16",
              "--cluster_layers", "1", "--num_clusters", "4", "--vocab_size", "300", "--per_device_train_batch_size",
              "2", "--report_to", "none", "--use_cpu", "--seed", "0", "--disable_tqdm", "true"]
ROWS: list[tuple[str, str, int | None, str, bool]] = []


def run(args: list[str], timeout: int = 600) -> tuple[int, str]:
    """Run ``args`` (``clusterformer ...`` or a script) and return its status and its last stderr/stdout line."""
    command = [PY, "-m", "hf_clusterformer_cli", *args[1:]] if args[0] == "clusterformer" else [PY, *args]
    done = subprocess.run(command, capture_output=True, text=True, env=ENV, timeout=timeout, cwd=WORK)
    lines = [line for line in (done.stderr + done.stdout).splitlines() if line.strip()]
    errors = [line for line in lines if "error:" in line]  # a refusal's line, not what was printed after it
    return done.returncode, (errors[-1] if done.returncode and errors else lines[-1] if lines else "")


def default_sigint() -> None:
    """In a child: SIGINT's default handler (a shell's background job starts with SIGINT ignored, which Python keeps)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def row(trap: str, command: str, status: int | None, line: str, ok: bool) -> None:
    ROWS.append((trap, command, status, line, ok))
    print(f"[{'ok' if ok else 'FAIL'}] {trap}: {status} {line[:160]}", file=sys.stderr, flush=True)


def snapshot(folder: Path) -> dict[str, bytes | str]:
    return {p.relative_to(folder).as_posix(): (f"-> {os.readlink(p)}" if p.is_symlink() else p.read_bytes())
            for p in sorted(folder.rglob("*")) if p.is_symlink() or p.is_file()}


def one_line_error(status: int, line: str, *fragments: str) -> bool:
    return status == 2 and line.startswith("clusterformer: error:") and all(f in line for f in fragments)


def setup() -> None:
    """A tiny RoBERTa encoder (no QA head) with a byte-level BPE tokenizer, a BERT tokenizer and a context file."""
    import torch
    from transformers import BertTokenizerFast, RobertaConfig, RobertaModel

    from hf_clusterformer.data.tokenizer import build_tokenizer

    tokenizer = build_tokenizer(SENTENCES * 4 + [QUESTION], vocab_size=300)
    config = RobertaConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                           intermediate_size=64, max_position_embeddings=514, type_vocab_size=1)
    torch.manual_seed(1)
    RobertaModel(config, add_pooling_layer=False).save_pretrained(WORK / "src")
    tokenizer.save_pretrained(WORK / "src")
    words = sorted({w.strip(".,?").lower() for s in SENTENCES + [QUESTION] for w in s.split()})
    (WORK / "bert-vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words]) + "\n")
    BertTokenizerFast(vocab_file=str(WORK / "bert-vocab.txt")).save_pretrained(WORK / "bert-tokenizer")
    (WORK / "context.txt").write_text(CONTEXT, encoding="utf-8")
    start = CONTEXT.index("Tarsk")
    record = {"id": "0", "title": "t", "question": QUESTION, "context": CONTEXT,
              "answers": {"text": ["Tarsk"], "answer_start": [start]}}
    (WORK / "train.jsonl").write_text("".join(json.dumps(dict(record, id=str(i))) + "\n" for i in range(8)))
    bad = dict(record, answers={"text": "Tarsk", "answer_start": start})
    (WORK / "string-answers.jsonl").write_text(json.dumps(bad) + "\n")
    long_context = " ".join(SENTENCES[i % 3] for i in range(2400))
    long = dict(record, context=long_context, answers={"text": ["Tarsk"], "answer_start": [long_context.rindex("Tarsk")]})
    (WORK / "long.jsonl").write_text(json.dumps(long) + "\n")
    (WORK / "docs.txt").write_text("\n".join(SENTENCES * 20) + "\n")
    (WORK / "held.txt").write_text("\n".join(SENTENCES * 4) + "\n")
    (WORK / "latin1.txt").write_bytes("caf\xe9 au lait\n".encode("latin-1"))


def convert(out: Path, *extra: str) -> tuple[int, str]:
    return run(["clusterformer", "convert", str(WORK / "src"), str(out), *SMALL, "--allow-untrained", *extra])


def folder_traps() -> None:
    target = WORK / "target"
    target.mkdir()
    (target / "notes.txt").write_text("mine")
    (WORK / "link").symlink_to(target)
    status, line = convert(WORK / "link")
    row("convert SRC link: the link stays, notes kept, model written into the target", "clusterformer convert src link",
        status, line, status == 0 and (WORK / "link").is_symlink() and (target / "notes.txt").read_text() == "mine"
        and (target / "model.safetensors").is_file())
    status, line = convert(WORK / "link", "--overwrite")
    row("convert --overwrite into a link to a model folder: replaced in the target, link kept",
        "clusterformer convert src link --overwrite", status, line,
        status == 0 and (WORK / "link").is_symlink() and (target / "notes.txt").exists())

    code = ("import sys; from hf_clusterformer import ClusterFormerForQuestionAnswering as M; "
            "from hf_clusterformer.hub import save_for_hub; from transformers import AutoTokenizer; "
            "m = M.from_pretrained(sys.argv[1]); save_for_hub(m, AutoTokenizer.from_pretrained(sys.argv[1]), sys.argv[2])")
    hub_target = WORK / "hub-target"
    hub_target.mkdir()
    (hub_target / "notes.txt").write_text("mine")
    (WORK / "hub-link").symlink_to(hub_target)
    status, line = run(["-c", code, str(target), str(WORK / "hub-link")])
    row("save_for_hub into a link: the link stays, notes kept", "save_for_hub(model, 'hub-link')", status, line,
        status == 0 and (WORK / "hub-link").is_symlink() and (hub_target / "notes.txt").exists()
        and (hub_target / "modeling_clusterformer.py").is_file())

    outside = WORK / "outside.md"
    outside.write_text("outside the model folder")
    model = WORK / "carded"
    convert(model)
    (model / "README.md").unlink(missing_ok=True)
    (model / "README.md").symlink_to(outside)
    status, line = run(["clusterformer", "card", str(model), "--overwrite"])
    row("card --overwrite with README.md a symlink: never written through", "clusterformer card carded --overwrite",
        status, line, outside.read_text() == "outside the model folder"
        and (status == 0 and not (model / "README.md").is_symlink() or status == 2))

    for mode in (0o700, 0o555, 0o2750):
        folder = WORK / f"mode-{mode:o}"
        folder.mkdir()
        (folder / "notes.txt").write_text("mine")
        os.chmod(folder, mode)
        if mode == 0o2750:
            shutil.chown(folder, "nobody", "nogroup")
        before = os.stat(folder)
        status, line = convert(folder)
        after = os.stat(folder)
        row(f"convert into an existing {mode:o} folder keeps mode and owner", f"clusterformer convert src mode-{mode:o}",
            status, line, status == 0 and stat.S_IMODE(after.st_mode) == stat.S_IMODE(before.st_mode)
            and (after.st_uid, after.st_gid) == (before.st_uid, before.st_gid))
    trained = WORK / "mode-train"
    trained.mkdir()
    os.chmod(trained, 0o700)
    args = ["clusterformer", "train", "--train_file", str(WORK / "train.jsonl"), "--tokenizer_name", str(WORK / "src"),
            "--max_steps", "2", "--save_strategy", "no", *TINY_TRAIN]
    run([*args, "--output_dir", str(trained)])
    status, line = run([*args, "--output_dir", str(trained), "--overwrite"])
    row("train --overwrite keeps the folder's 0700", "clusterformer train ... --output_dir mode-train --overwrite", status,
        line, status == 0 and stat.S_IMODE(os.stat(trained).st_mode) == 0o700)

    for name in ("pipeline.py", "tokenizer_config.json", "modeling_clusterformer.py"):
        folder = WORK / f"own-{name}"
        folder.mkdir()
        (folder / name).write_text("# the user's own file\n")
        status, line = convert(folder)
        row(f"convert refuses to replace the user's own {name}", f"clusterformer convert src own-{name}", status, line,
            one_line_error(status, line, name) and (folder / name).read_text() == "# the user's own file\n")
    folder = WORK / "own-train"
    folder.mkdir()
    (folder / "pipeline.py").write_text("# the user's own file\n")
    status, line = run([*args, "--output_dir", str(folder)])
    row("train refuses to replace the user's own pipeline.py", "clusterformer train ... --output_dir own-train", status,
        line, one_line_error(status, line, "pipeline.py") and (folder / "pipeline.py").read_text().startswith("# the"))
    pack = WORK / "pack"
    pack.mkdir()
    (pack / "vocab.txt").write_text("the user's vocabulary\n")
    status, line = run(["-m", "hf_clusterformer.pretrained", "--pack", str(pack)])
    row("pretrained --pack refuses to replace the user's vocab.txt (or is not a writer of user folders)",
        "python -m hf_clusterformer.pretrained --pack pack", status, line,
        (pack / "vocab.txt").read_text() == "the user's vocabulary\n")

    notes = WORK / "checkpoints"
    status, line = run([*args[:-2], "--output_dir", str(notes), "--save_strategy", "steps", "--save_steps", "1",
                        "--max_steps", "2", *TINY_TRAIN[:-2]])
    (notes / "checkpoint-notes").mkdir()
    (notes / "checkpoint-notes" / "notes.txt").write_text("mine")
    status, line = run([*args, "--output_dir", str(notes), "--overwrite"])
    row("train --overwrite removes only Trainer checkpoints, keeps checkpoint-notes/",
        "clusterformer train ... --output_dir checkpoints --overwrite", status, line,
        status == 0 and (notes / "checkpoint-notes" / "notes.txt").exists()
        and not (notes / "checkpoint-1").exists())

    interrupted = WORK / "interrupted"
    command = [PY, "-m", "hf_clusterformer_cli", "train", "--train_file", str(WORK / "train.jsonl"), "--tokenizer_name",
               str(WORK / "src"), "--max_steps", "100000", "--save_strategy", "steps", "--save_steps", "1",
               "--save_total_limit", "2", "--output_dir", str(interrupted), *TINY_TRAIN]
    with open(WORK / "interrupted.log", "w") as log:
        child = subprocess.Popen(command, stderr=log, stdout=log, env=ENV, cwd=WORK, preexec_fn=default_sigint)
        deadline = time.time() + 240
        while time.time() < deadline and not list(interrupted.glob("checkpoint-[2-9]*")):
            time.sleep(0.5)
        child.send_signal(signal.SIGINT)
        try:
            status = child.wait(timeout=120)
        except subprocess.TimeoutExpired:
            child.kill()
            status = child.wait()
    lines = [x for x in (WORK / "interrupted.log").read_text().splitlines() if x.strip()]
    row("Ctrl-C of train: exit 130, one line, its own checkpoints kept", "clusterformer train ... (SIGINT)", status,
        lines[-1] if lines else "", status == 130 and bool(list(interrupted.glob("checkpoint-*")))
        and "Traceback" not in (WORK / "interrupted.log").read_text())
    command = [PY, "-m", "hf_clusterformer_cli", "convert", str(WORK / "src"), str(WORK / "killed"), *SMALL,
               "--allow-untrained"]
    child = subprocess.Popen(command, stderr=subprocess.DEVNULL, stdout=subprocess.DEVNULL, env=ENV, cwd=WORK)
    time.sleep(4)
    child.kill()
    child.wait()
    leftovers = [p.name for p in WORK.iterdir() if p.name.endswith(".partial")]
    row("SIGKILL of convert leaves no hidden .partial folder", "clusterformer convert src killed (SIGKILL after 4 s)",
        -9, ", ".join(leftovers) or "(no leftovers)", not leftovers)

    # model.save_pretrained is transformers' own (the Trainer saves through it again and again), as the README says;
    # the whole-model writer, save_for_hub, refuses another model's folder
    code = ("import sys; from hf_clusterformer import ClusterFormerForQuestionAnswering as M; "
            "from hf_clusterformer.hub import save_for_hub; from transformers import AutoTokenizer; "
            "save_for_hub(M.from_pretrained(sys.argv[1]), AutoTokenizer.from_pretrained(sys.argv[1]), sys.argv[2])")
    other = WORK / "other-model"
    convert(other, "--num-clusters", "8")
    before = snapshot(other)
    status, line = run(["-c", code, str(target), str(other)])
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    row("save_for_hub over another model's folder: refused, folder unchanged (save_pretrained: transformers' own, "
        "said in the README)", "save_for_hub(model, tokenizer, 'other-model')", status, line,
        status != 0 and snapshot(other) == before and "ModelFolderExistsError" in line
        and "A plain `model.save_pretrained(DIR)` is" in readme)


def result_traps() -> None:
    args = ["clusterformer", "train", "--train_file", str(WORK / "train.jsonl"), "--tokenizer_name", str(WORK / "src"),
            "--max_steps", "4", "--save_strategy", "no", *TINY_TRAIN]
    status, line = run([*args, "--output_dir", str(WORK / "nan-run"), "--learning_rate", "1e8"])
    row("train --learning_rate 1e8 stops at the first non-finite loss, saves nothing",
        "clusterformer train ... --learning_rate 1e8", status, line,
        one_line_error(status, line, "--learning_rate") and not (WORK / "nan-run" / "model.safetensors").exists())

    import torch
    from safetensors.torch import load_file, save_file

    good = WORK / "good"
    run([*args, "--output_dir", str(good)])
    broken = WORK / "broken"
    shutil.copytree(good, broken)
    tensors = load_file(broken / "model.safetensors")
    name = next(iter(tensors))
    tensors[name] = torch.full_like(tensors[name], float("nan"))
    save_file(tensors, broken / "model.safetensors", metadata={"format": "pt"})
    status, line = run(["clusterformer", "predict", str(broken), "--question", QUESTION, "--context-file",
                        str(WORK / "context.txt")])
    row("predict refuses NaN weights", "clusterformer predict broken ...", status, line, one_line_error(status, line))
    status, line = run(["clusterformer", "export", str(broken), str(WORK / "broken.onnx")])
    row("export refuses NaN weights", "clusterformer export broken broken.onnx", status, line,
        one_line_error(status, line) and not (WORK / "broken.onnx").exists())

    status, line = run(["clusterformer", "evaluate", "--model_name_or_path", str(good), "--validation_file",
                        str(WORK / "long.jsonl"), "--output_dir", str(WORK / "long-eval"), "--max_seq_length", "4096"])
    full = subprocess.run([PY, "-m", "hf_clusterformer_cli", "evaluate", "--model_name_or_path", str(good),
                           "--validation_file", str(WORK / "long.jsonl"), "--output_dir", str(WORK / "long-eval2"),
                           "--max_seq_length", "4096"], capture_output=True, text=True, env=ENV, cwd=WORK)
    said = [x for x in full.stderr.splitlines() if "4096" in x or "4,096" in x]
    row("evaluate says when it cuts an example (22k tokens, --max_seq_length 4096)", "clusterformer evaluate ... long.jsonl",
        status, said[0] if said else line, bool(said))

    code = ("import sys; from hf_clusterformer import pipeline; "
            "p = pipeline(task='token-classification', model=sys.argv[1], allow_untrained=True); "
            "text = open(sys.argv[2]).read(); out = p(text, aggregation_strategy='none'); "
            "print(len(out), len(p.tokenizer(text)['input_ids']))")
    tokens = WORK / "tokens"
    convert(tokens, "--task", "token-classification")
    status, line = run(["-c", code, str(tokens), str(WORK / "context.txt")])
    labelled = [int(x) for x in line.split()] if status == 0 and line.replace(" ", "").isdigit() else [0, 1]
    row("token-classification pipeline labels every token of a long text (tokenizer says 512)",
        "pipeline('token-classification')(text)", status, line, status == 0 and labelled[0] >= labelled[1] - 2)

    mlm = WORK / "mlm"
    convert(mlm, "--task", "fill-mask")
    for fmt, out in (("onnx", "mlm.onnx"), ("torch", "mlm.pt2")):
        status, line = run(["clusterformer", "export", str(mlm), str(WORK / out), "--format", fmt, "--allow-untrained"])
        row(f"fill-mask export ({fmt})", f"clusterformer export mlm {out}", status, line,
            status == 0 and (WORK / out).exists())
    status, line = run(["clusterformer", "export", str(mlm), str(WORK / "mlm-int8.onnx"), "--quantize", "int8",
                        "--allow-untrained"])
    row("fill-mask export (int8)", "clusterformer export mlm mlm-int8.onnx --quantize int8", status, line, status == 0)
    status, line = run([str(ROOT / "examples/run_mlm.py"), "--model_name_or_path", str(mlm), "--train_file",
                        str(WORK / "docs.txt"), "--validation_file", str(WORK / "held.txt"), "--output_dir",
                        str(WORK / "mlm-run"), "--do_train", "--do_eval", "--max_steps", "3", "--report_to", "none",
                        "--use_cpu", "--per_device_train_batch_size", "2"])
    row("run_mlm.py --do_train --do_eval on ordinary text", "examples/run_mlm.py ... --do_train --do_eval", status, line,
        status == 0)

    status, line = convert(WORK / "reconverted", "--num-clusters", "8")
    fitted = WORK / "fitted"
    run([*args[:-2], "--output_dir", str(fitted), "--centroid_update_steps", "2", "--min_states", "4",
         *TINY_TRAIN[:-2]])
    full = subprocess.run([PY, "-m", "hf_clusterformer_cli", "convert", str(fitted), str(WORK / "refit"),
                           "--num-clusters", "8"], capture_output=True, text=True, env=ENV, cwd=WORK)
    said = [x for x in full.stderr.splitlines() if "centroid" in x]
    row("re-converting a fitted model with other --num-clusters says its centroids are dropped (or refuses)",
        "clusterformer convert fitted refit --num-clusters 8", full.returncode, said[0] if said else full.stderr[-160:],
        full.returncode in (0, 2) and bool(said))
    unfitted = WORK / "carded"
    full = subprocess.run([PY, "-m", "hf_clusterformer_cli", "export", str(unfitted), str(WORK / "unfitted.pt2"),
                           "--allow-untrained"], capture_output=True, text=True, env=ENV, cwd=WORK)
    row("export warns about never-fitted centroids", "clusterformer export carded unfitted.pt2 --allow-untrained",
        full.returncode, next((x for x in full.stderr.splitlines() if "centroid" in x), ""),
        "centroid" in full.stderr)
    code = ("import sys, warnings, logging; logging.basicConfig(); from hf_clusterformer.export import load_exported; "
            "load_exported(sys.argv[1])")
    full = subprocess.run([PY, "-c", code, str(WORK / "unfitted.pt2")], capture_output=True, text=True, env=ENV)
    row("load_exported warns about never-fitted centroids", "load_exported('unfitted.pt2')", full.returncode,
        next((x for x in full.stderr.splitlines() if "centroid" in x), full.stderr.strip()[-160:]),
        "centroid" in full.stderr)


def traceback_traps() -> None:
    truncated = WORK / "truncated"
    shutil.copytree(WORK / "good", truncated)
    weights = truncated / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    for argv, label in (
        (["clusterformer", "convert", str(truncated), str(WORK / "t-out")], "convert"),
        (["clusterformer", "export", str(truncated), str(WORK / "t.onnx")], "export"),
        (["clusterformer", "card", str(truncated), "--out", str(WORK / "t-card.md")], "card"),
    ):
        status, line = run(argv)
        row(f"truncated model.safetensors in {label}: one line", " ".join(["clusterformer", label, "truncated", "..."]),
            status, line, one_line_error(status, line, "model.safetensors"))
    import torch
    from safetensors.torch import load_file, save_file

    shaped = WORK / "wrong-centroids"
    shutil.copytree(WORK / "fitted", shaped)
    tensors = load_file(shaped / "model.safetensors")
    key = next(k for k in tensors if "centroid" in k)
    tensors[key] = torch.zeros(3, 5)
    save_file(tensors, shaped / "model.safetensors", metadata={"format": "pt"})
    status, line = run(["clusterformer", "predict", str(shaped), "--question", QUESTION, "--context-file",
                        str(WORK / "context.txt")])
    row("wrong-shaped centroid tensor in predict: one line", "clusterformer predict wrong-centroids ...", status, line,
        one_line_error(status, line))
    for command in ("train", "evaluate"):
        extra = (["--train_file", str(WORK / "string-answers.jsonl"), "--tokenizer_name", str(WORK / "src"),
                  "--max_steps", "1", "--save_strategy", "no", *TINY_TRAIN] if command == "train" else
                 ["--model_name_or_path", str(WORK / "good"), "--validation_file", str(WORK / "string-answers.jsonl")])
        status, line = run(["clusterformer", command, *extra, "--output_dir", str(WORK / f"string-{command}")])
        row(f"SQuAD answers.text a string in {command}: one line", f"clusterformer {command} ... string-answers.jsonl",
            status, line, one_line_error(status, line, "string-answers.jsonl"))
    pt2 = WORK / "mlm.pt2"
    cut = WORK / "cut.pt2"
    if pt2.exists():
        cut.write_bytes(pt2.read_bytes()[: pt2.stat().st_size // 2])
    code = "import sys; from hf_clusterformer.export import load_exported; load_exported(sys.argv[1])"
    full = subprocess.run([PY, "-c", code, str(cut)], capture_output=True, text=True, env=ENV)
    last = (full.stderr.strip().splitlines() or [""])[-1]
    row("truncated .pt2 in load_exported: a clear error naming the file", "load_exported('cut.pt2')", full.returncode,
        last, full.returncode != 0 and "cut.pt2" in last and "BadZipFile" not in last)
    status, line = run(["clusterformer", "predict", str(WORK / "good"), "--question", QUESTION, "--context-file",
                        str(WORK / "context.txt")])
    mixed = WORK / "mixed"
    shutil.copytree(WORK / "good", mixed)
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt", "special_tokens_map.json"):
        (mixed / name).unlink(missing_ok=True)
    for item in (WORK / "bert-tokenizer").iterdir():
        shutil.copy(item, mixed / item.name)
    status, line = run(["clusterformer", "predict", str(mixed), "--question", QUESTION, "--context-file",
                        str(WORK / "context.txt")])
    row("a BERT tokenizer with a RoBERTa-based model: one line", "clusterformer predict mixed ...", status, line,
        one_line_error(status, line))
    command = [PY, "-m", "hf_clusterformer_cli", "convert", str(WORK / "src"), str(WORK / "ctrl-c"), *SMALL,
               "--allow-untrained"]
    child = subprocess.Popen(command, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, env=ENV, cwd=WORK, text=True,
                             preexec_fn=default_sigint)
    time.sleep(3)
    child.send_signal(signal.SIGINT)
    err = child.communicate(timeout=120)[1]
    lines = [x for x in err.splitlines() if x.strip()]
    row("Ctrl-C of convert: exit 130, one line", "clusterformer convert src ctrl-c (SIGINT after 3 s)", child.returncode,
        lines[-1] if lines else "", child.returncode in (0, 130) and "Traceback" not in err
        and (child.returncode == 0 or len(lines) == 1))


def message_traps() -> None:
    source = WORK / "good"
    status, line = run(["clusterformer", "convert", str(source), str(source)])
    row("convert SRC SRC says the output is the source", "clusterformer convert good good", status, line,
        one_line_error(status, line) and "source" in line)
    plain = WORK / "plain-config"
    plain.mkdir()
    (plain / "config.json").write_text('{"learning_rate": 0.1}')
    status, line = convert(plain)
    row("a non-model config.json is not called a model", "clusterformer convert src plain-config", status, line,
        status == 0 or (one_line_error(status, line) and "holds a model" not in line))
    status, line = run(["clusterformer", "convert", str(WORK / "tokens"), str(WORK / "to-mc"), "--task",
                        "multiple-choice"])
    row("token-classification checkpoint with --task multiple-choice: names the task mismatch",
        "clusterformer convert tokens to-mc --task multiple-choice", status, line,
        status == 0 or (one_line_error(status, line) and "other shapes" not in line))
    (WORK / "bad.json").write_text("{not json")
    status, line = run(["clusterformer", "card", str(WORK / "good"), "--results", str(WORK / "bad.json"), "--out",
                        str(WORK / "card.md")])
    row("card's JSON errors name the file", "clusterformer card good --results bad.json", status, line,
        one_line_error(status, line, "bad.json"))
    status, line = run([str(ROOT / "examples/run_mlm.py"), "--model_name_or_path", str(WORK / "mlm"), "--train_file",
                        str(WORK / "latin1.txt"), "--output_dir", str(WORK / "mlm-latin"), "--do_train", "--max_steps",
                        "1", "--report_to", "none", "--use_cpu"])
    row("run_mlm.py's UTF-8 error names the file", "examples/run_mlm.py --train_file latin1.txt", status, line,
        status != 0 and "latin1.txt" in line and "Traceback" not in line)
    status, line = run([str(ROOT / "examples/run_mlm.py"), "--model_name_or_path", str(WORK / "mlm"), "--output_dir",
                        str(WORK / "mlm-nothing"), "--report_to", "none", "--use_cpu"])
    row("run_mlm.py without --do_train/--do_eval: refuses, writes nothing", "examples/run_mlm.py (no --do_*)", status,
        line, status != 0 and not (WORK / "mlm-nothing" / "all_results.json").exists())
    code = ("import sys, logging; from hf_clusterformer import pipeline\n"
            "try:\n    p = pipeline(task='text-classification', model=sys.argv[1])\n"
            "except ValueError as error:\n    sys.exit(f'ValueError: {error}')")
    full = subprocess.run([PY, "-c", code, str(WORK / "good")], capture_output=True, text=True, env=ENV)
    last = (full.stderr.strip().splitlines() or [""])[-1]
    row("a pipeline of another head on a QA folder: refused (a ValueError naming both tasks) or warned in one line",
        "pipeline(task='text-classification', model='good')", full.returncode, last,
        "Traceback" not in full.stderr and "question-answering" in last and "text-classification" in last)


def main() -> int:
    global WORK
    WORK = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(tempfile.mkdtemp(prefix="retrial-"))
    WORK.mkdir(parents=True, exist_ok=True)
    started = time.time()
    setup()
    for part in (folder_traps, result_traps, traceback_traps, message_traps):
        try:
            part()
        except Exception as error:  # a trial harness: record the crash of a part and go on with the next
            row(f"{part.__name__} stopped", "", None, f"{type(error).__name__}: {error}", False)
    print("| trap | what was run | exit | last line | as the rule asks |\n|---|---|---|---|---|")
    for trap, command, status, line, ok in ROWS:
        cell = line.replace("|", "\\|")[:220]
        print(f"| {trap} | `{command}` | {status} | {cell} | {'yes' if ok else '**no**'} |")
    passed = sum(ok for *_, ok in ROWS)
    print(f"\n{passed} of {len(ROWS)} as the rule asks; {time.time() - started:.0f} s, torch threads 1, {WORK}")
    return 0 if passed == len(ROWS) else 1


if __name__ == "__main__":
    sys.exit(main())
