"""bench/realtext.py, the staged real-text study (SQuAD v1.1 dev, MiniLM start), at tiny size on the CPU: the whole
path through bench/device_run.sh (one process), a run killed in the middle of stage B and run again (one process per
model) that ends with the same cells, a cell resumed from its partial file, the paired bootstrap, the contexts."""

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "bench" / "realtext.py"
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}


def _squad_path() -> Path:
    from hf_clusterformer.data.multipassage import default_squad_path

    return default_squad_path()


def _pretrained() -> Path:
    from hf_clusterformer.pretrained import PretrainedUnavailableError, fetch_pretrained

    try:
        return fetch_pretrained(download=False)
    except PretrainedUnavailableError:
        pytest.skip("all-MiniLM-L6-v2 is not in the cache (python -m hf_clusterformer.pretrained fetches it)")


@pytest.fixture(scope="module")
def realtext():
    if not _squad_path().exists():
        pytest.skip(f"SQuAD v1.1 dev file not available at {_squad_path()}")
    _pretrained()
    spec = importlib.util.spec_from_file_location("realtext", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def reference(tmp_path_factory, realtext) -> Path:
    """The tiny study run once through ``device_run.sh`` (PARTS=realtext SIZE=tiny): every stage in one process."""
    out = tmp_path_factory.mktemp("device")
    env = {**ENV, "SIZE": "tiny", "PARTS": "realtext", "PYTHON": sys.executable, "PRETRAINED": str(_pretrained()),
           "SQUAD": str(_squad_path())}
    done = subprocess.run(["bash", str(ROOT / "bench" / "device_run.sh"), str(out)], env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "== realtext: exit 0" in (out / "summary.txt").read_text()
    return out


def _cells(record: Path) -> dict:
    """{cell file: (EM, F1, every question's id and prediction)} of a record folder."""
    found = {}
    for path in sorted(record.glob("cells/seed*/*/*.json")):
        cell = json.loads(path.read_text())
        found[str(path.relative_to(record))] = (cell["em"], cell["f1"], [(e["id"], e["prediction"]) for e in
                                                                         cell["per_question"]])
    return found


EXPECTED = {("A", "oracle", 0), ("A", "other", 250), ("B", "oracle", 0), ("B", "other", 250), ("B", "other", 400),
            ("B", "same", 400)}
#: The cells of a window_cluster Cluster-Former (the tiny preset's kind): its start is the sliding start exactly, so
#: only the sliding start is scored (by Cluster-Former's process).
AFTER_B = {cell for cell in EXPECTED if cell[0] == "B"}


def test_device_script_runs_every_stage_and_writes_the_record(reference):
    """A, the centroid fit, the B probes and sizing, B and C for both models, the report: one process."""
    record, run = reference / "realtext", reference / "realtext" / "run"
    log = (reference / "realtext.log").read_text()
    for line in ("PLAN (1 seed(s)", "ESTIMATE (cost model", "BUDGET CHECK (A)", "BUDGET CHECK (B)",
                 "[B seed 0] 4 steps for both models", "ETA"):
        assert line in log
    summary = json.loads((record / "summary.json").read_text())
    cells = summary["cells"]
    assert {(c["stage"], c["kind"], c["length"]) for c in cells if c["model"] == "sliding"} == EXPECTED
    assert {(c["stage"], c["kind"], c["length"]) for c in cells if c["model"] == "clusterformer"} == AFTER_B
    for stage, kind, length in EXPECTED:  # the same questions and contexts for both models
        pair = [c for c in cells if (c["stage"], c["kind"], c["length"]) == (stage, kind, length)]
        assert len({c["digest"] for c in pair}) == 1 and all(c["questions"] == 3 for c in pair)
        if length:
            assert all(abs(c["context_tokens"] - length) < 0.5 * length for c in pair)
    assert len({c["digest"] for c in cells}) == 4  # oracle, other 250 / 400, same 400
    for c in cells:
        assert 0 <= c["em"] <= c["f1"] <= 100 and c["seconds_per_question"] > 0
        assert ("gold_passage_colocated" in c) == (c["model"] == "clusterformer")
    stages = summary["stages"]["seed0"]
    assert stages["A"]["steps"] == 4 and stages["B size"]["steps"] == 4 and stages["fit"]["states"] >= 16
    assert stages["B clusterformer"]["centroids"]["fitted"] and stages["B sliding"]["steps"] == 4
    assert [p["step"] for p in stages["A"]["curve"]] == [2, 4]
    rows = summary["comparisons"]
    assert {(r["stage"], r["kind"], r["length"]) for r in rows} == AFTER_B
    assert all(r["low"] <= r["difference"] <= r["high"] and r["questions"] == 3 for r in rows)
    text = (record / "results.md").read_text()
    # comparison, two cell rows (A, B) per model, shortcut baselines: the oracle once in each
    assert "Cluster-Former minus sliding window" in text and text.count("| gold paragraph | oracle |") == 5
    baselines = summary["shortcut_baselines"]
    assert [(b["kind"], b["length"]) for b in baselines] == [("oracle", 0), ("other", 250), ("other", 400),
                                                             ("same", 400)]
    assert all(0 <= b[name]["em"] <= b[name]["f1"] <= 100 for b in baselines
               for name in ("first sentence", "question-overlap sentence"))
    assert baselines[0]["gold_first"] == 100.0 and "## Shortcut baselines on the same cells" in text
    assert "of kind `window_cluster`" in text and "the start row is the sliding start's" in text
    assert "Stage A (seed0), held-out oracle questions" in text and "Stage B (seed0), training loss" in text
    assert text.count("\n| 4 | ") == 1  # B's last logged step, a loss for both models
    assert (record / "f1_vs_length.png").read_bytes()[:4] == b"\x89PNG"
    assert len(_cells(record)) == 10

    from safetensors.torch import load_file

    start = load_file(run / "seed0/A/model/model.safetensors")
    clustered = load_file(run / "seed0/start-clusterformer/model.safetensors")
    added = set(clustered) - set(start)
    assert set(start) < set(clustered) and all(".router." in k or ".routed_output." in k for k in added)
    assert all((start[k] == clustered[k]).all() for k in start)  # the same weights, a cluster layer added
    assert all(not clustered[k].any() for k in added if ".routed_output." in k)  # its routed path starts closed


def _finished_until_b(reference: Path, run: Path) -> None:
    """``run`` holds the reference run's stage A, centroid fit, B probes and sizing and A cells (read-only links)."""
    source = reference / "realtext" / "run"
    (run / "seed0" / "B").mkdir(parents=True)
    (run / "seed0" / "cells").mkdir()
    for name in ("init", "seed0/A", "seed0/start-clusterformer", "seed0/cells/A-sliding"):
        (run / name).symlink_to(source / name)
    for name in ("config.json", "seed0/B/probe-sliding.json", "seed0/B/probe-clusterformer.json", "seed0/B/size.json"):
        shutil.copyfile(source / name, run / name)


def test_a_run_killed_in_stage_b_resumes_to_the_same_cells(tmp_path, realtext, reference):
    """From the reference's finished stage A, fit and probes, a run with one process per model is killed at step 3 of
    Cluster-Former's stage B (checkpoint at step 2); the same command skips every finished stage (the sliding model's
    B and cells too), resumes B from step 2 and ends with the cells of the reference, run without a stop."""
    import torch

    _finished_until_b(reference, tmp_path / "run")
    command = [sys.executable, str(SCRIPT), "--preset", "tiny", "--output_dir", str(tmp_path / "run"),
               "--record_dir", str(tmp_path / "record")]
    killed = subprocess.run(command, env={**ENV, realtext.STOP_ENV: "[B clusterformer seed 0] B step 3/"},
                            capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert killed.returncode != 0, killed.stdout[-3000:]
    seed = tmp_path / "run" / "seed0"
    state = torch.load(seed / "B/clusterformer/checkpoint/training-state.pt", weights_only=False)
    assert state["progress"]["step"] == 2
    assert (seed / "cells/B-sliding/same-400.json").is_file() and not (seed / "cells/B-clusterformer").exists()
    assert "A step" not in killed.stdout and "[A seed 0] done" in killed.stdout

    again = subprocess.run(command, env=ENV, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    for line in ("[A seed 0] done", "[fit seed 0] done", "resumed from", "at stage 0 step 2", "B step 3/4"):
        assert line in again.stdout
    assert "[B sliding seed 0]" not in again.stdout and "[cells B-sliding" not in again.stdout
    assert _cells(tmp_path / "record") == _cells(reference / "realtext")


def _study_after_b(realtext, reference: Path, folder: Path):
    """The reference run's folder and a study in ``folder`` that shares its finished stages but no cell."""
    run = reference / "realtext" / "run"
    (folder / "seed0").mkdir()
    for name in ("init", "config.json"):
        (folder / name).symlink_to(run / name)
    (folder / "seed0" / "B").symlink_to(run / "seed0" / "B")
    return run, realtext.Study(realtext.parse_args(["--preset", "tiny", "--output_dir", str(folder)]))


def test_a_cell_resumes_from_its_partial_file(tmp_path, realtext, reference, capsys):
    """A cell stopped after two questions goes on from the third and ends as the uninterrupted one."""
    run, study = _study_after_b(realtext, reference, tmp_path)
    finished = json.loads((run / "seed0/cells/B-sliding/same-400.json").read_text())
    path = study.cell_path(0, "B", "sliding", "same", 400)
    realtext.write_json(path.with_name("same-400.partial.json"),
                        {"digest": finished["digest"], "entries": finished["per_question"][:2]})
    model = realtext.load_model(run / "seed0/B/sliding/model", study)
    cell = realtext.score_cell(study, 0, "B", "sliding", model, ("same", 400), 0.0)
    assert "resumed at question 2/3" in capsys.readouterr().out
    assert [(e["id"], e["prediction"], e["f1"]) for e in cell["per_question"]] == \
        [(e["id"], e["prediction"], e["f1"]) for e in finished["per_question"]]
    assert (cell["em"], cell["f1"]) == (finished["em"], finished["f1"])
    assert not path.with_name("same-400.partial.json").exists()


def test_a_cell_another_process_scores_is_left_to_it(tmp_path, realtext, reference, capsys):
    """A cell claimed by a live study process is skipped (a second process of the same command takes the other
    cells); a claim whose pid now runs another program, or a stopped process's, is taken over and the cell scored,
    its claim gone after."""
    run, study = _study_after_b(realtext, reference, tmp_path)
    path = study.cell_path(0, "B", "sliding", "same", 400)
    claim = path.with_name("same-400.claim")
    model = realtext.load_model(run / "seed0/B/sliding/model", study)
    sleep = [sys.executable, "-c", "import time; time.sleep(60)"]
    holder, other = subprocess.Popen([*sleep, "realtext.py"]), subprocess.Popen(sleep)
    try:
        path.parent.mkdir(parents=True)
        claim.write_text(str(other.pid))
        assert realtext.claim(claim) is None and claim.read_text() == str(os.getpid())
        claim.write_text(str(holder.pid))
        realtext.score_cells(study, 0, "B", {"sliding": model}, [("same", 400)])
        assert not path.exists() and claim.read_text() == str(holder.pid)
        out = capsys.readouterr().out
        assert f"same-400: scored by process {holder.pid}; skipped here" in out
        assert "left to other processes: sliding same-400" in out
    finally:
        for process in (holder, other):
            process.kill()
            process.wait()
    cell = realtext.score_cell(study, 0, "B", "sliding", model, ("same", 400), 0.0)
    finished = json.loads((run / "seed0/cells/B-sliding/same-400.json").read_text())
    assert (cell["em"], cell["f1"]) == (finished["em"], finished["f1"]) and path.is_file()
    assert sorted(p.name for p in path.parent.iterdir()) == ["same-400.json"]


def test_a_stage_another_study_process_runs_is_waited_for(tmp_path, realtext, capsys):
    """A second command started while a stage runs waits for it instead of training the same stage again."""
    path = tmp_path / "seed0" / "A.claim"
    path.parent.mkdir()
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(1.5)", "realtext.py"])
    path.write_text(str(holder.pid))
    try:
        with realtext.held(path, "[A seed 0]", poll_seconds=0.1):
            assert holder.poll() is not None and path.read_text() == str(os.getpid())
    finally:
        holder.kill()
        holder.wait()
    assert f"[A seed 0] run by process {holder.pid}: waiting for it" in capsys.readouterr().out
    assert not path.exists()


def test_paired_bootstrap_on_known_inputs(realtext):
    bootstrap = realtext.paired_bootstrap
    constant = bootstrap([50, 60, 70, 80], [45, 55, 65, 75], samples=500)
    assert constant["difference"] == constant["low"] == constant["high"] == 5.0 and constant["questions"] == 4
    rng = np.random.default_rng(0)
    base = rng.uniform(0, 100, 400)  # large spread per question, small spread of the paired difference
    paired = bootstrap(base + 2 + rng.normal(0, 1, 400), base, samples=4000, seed=1)
    assert 1.7 < paired["low"] < 2 < paired["high"] < 2.3
    diff = rng.normal(3, 10, 400)
    interval = bootstrap(diff, np.zeros(400), samples=4000, seed=2)
    half = 1.96 * diff.std() / np.sqrt(400)  # the normal approximation of the mean's 95 % interval
    assert interval["low"] < diff.mean() < interval["high"]
    assert abs((interval["high"] - interval["low"]) / (2 * half) - 1) < 0.1
    assert bootstrap(diff, np.zeros(400), samples=4000, seed=2) == interval
    with pytest.raises(ValueError):
        bootstrap([1.0, 2.0], [[1.0], [2.0]])


def test_shortcut_predictions_take_position_or_question_words(realtext):
    record = {"question": "Which river flows through the old capital?",
              "context": "The valley is green. Its old capital sits where the river Tana flows! The river is long."}
    predicted = realtext.shortcut_predictions(record)
    assert predicted == {"first sentence": "The valley is green.",
                         "question-overlap sentence": "Its old capital sits where the river Tana flows!"}
    assert realtext.squad_scores(predicted["question-overlap sentence"], ["Tana"])[1] == pytest.approx(100 * 2 / 9)


def test_a_folder_of_other_settings_is_refused(tmp_path, realtext):
    study = realtext.Study(realtext.parse_args(["--preset", "tiny", "--output_dir", str(tmp_path)]))
    realtext.check_config(study)
    realtext.check_config(realtext.Study(realtext.parse_args(["--preset", "tiny", "--output_dir", str(tmp_path),
                                                              "--threads", "2"])))  # a run-only setting
    other = realtext.Study(realtext.parse_args(["--preset", "tiny", "--output_dir", str(tmp_path), "--b_steps", "5"]))
    with pytest.raises(SystemExit, match=r"other settings \(b_steps\)"):
        realtext.check_config(other)


def test_multipassage_contexts(realtext):
    """Gold paragraph at its recorded place with exact answer offsets; ``same`` takes the gold's article first;
    lengths end near the target; the draw depends only on the seed."""
    from transformers import AutoTokenizer

    corpus = realtext.Corpus(None, AutoTokenizer.from_pretrained(_pretrained()))
    pool = corpus.question_pool((40, 48), 64)
    assert pool and all(40 <= corpus.article[p] < 48 for p, _ in pool)
    paragraph, qa = pool[5]
    for kind in ("other", "same"):
        record = realtext.multipassage_record(corpus, paragraph, qa, kind, 1500, (40, 48), np.random.default_rng(3))
        again = realtext.multipassage_record(corpus, paragraph, qa, kind, 1500, (40, 48), np.random.default_rng(3))
        assert record == again
        start, end = record["passages"][record["gold"]]
        assert record["context"][start:end] == corpus.texts[paragraph]
        for text, offset in zip(record["answers"]["text"], record["answers"]["answer_start"]):
            assert record["context"][offset: offset + len(text)] == text and start <= offset < end
        texts = [record["context"][s:e] for s, e in record["passages"]]
        owners = [corpus.article[corpus.texts.index(t)] for t in texts]
        assert all(40 <= a < 48 for a in owners)
        distractors = [a for i, a in enumerate(owners) if i != record["gold"]]
        if kind == "other":
            assert corpus.article[paragraph] not in distractors
        else:  # the gold's article holds more than 1500 tokens: every distractor comes from it
            assert set(distractors) == {corpus.article[paragraph]}
        tokens = sum(corpus.lengths([corpus.texts.index(t) for t in texts]))
        assert abs(tokens - 1500) < 400


def test_start_cells_are_scored_once_when_the_start_is_the_sliding_model(realtext):
    """window_cluster: Cluster-Former's process scores the sliding start; the paper's cluster kind: each its own."""
    equal = realtext.parse_args(["--preset", "tiny"])
    assert equal.cluster_kind == "window_cluster"
    assert realtext.start_scored_by(equal, "clusterformer") == ["sliding"]
    assert realtext.start_scored_by(equal, "sliding") == []
    replacing = realtext.parse_args(["--preset", "tiny", "--cluster_kind", "cluster"])
    assert realtext.start_scored_by(replacing, "clusterformer") == ["clusterformer"]
    assert realtext.start_scored_by(replacing, "sliding") == ["sliding"]
    assert replacing.record_dir.endswith("realtext/tiny") and equal.record_dir.endswith("realtext/tiny-window_cluster")


def test_the_variant_screen_scores_validation_questions(tmp_path, reference):
    """bench/realtext_screen.py from the reference's stage A: the sliding model and one variant, a short B, validation
    cells (questions of articles 36-39, never the test articles), the record with the paired difference."""
    common = [sys.executable, str(ROOT / "bench" / "realtext_screen.py"), "--study_dir",
              str(reference / "realtext" / "run"), "--output_dir", str(tmp_path / "screen"), "--record_dir",
              str(tmp_path / "record"), "--steps", "2", "--questions", "3", "--other_length", "250",
              "--same_length", "400"]
    done = subprocess.run([*common, "sliding", "window-keys"], env=ENV, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = subprocess.run([*common, "--report"], env=ENV, capture_output=True, text=True, timeout=600)
    assert report.returncode == 0, report.stderr[-3000:]
    screen = json.loads((tmp_path / "record" / "screen.json").read_text())
    rows = {(r["model"], r["cell"]): r for r in screen["rows"]}
    assert set(rows) == {(m, c) for m in ("sliding", "window-keys") for c in ("other-250", "same-400")}
    for cell in ("other-250", "same-400"):
        variant, sliding = rows[("window-keys", cell)], rows[("sliding", cell)]
        assert variant["start_f1"] == sliding["start_f1"]  # a window_cluster start is the sliding start
        assert variant["low"] <= variant["difference"] <= variant["high"]
        assert variant["gold_tokens_with_question"] is not None and sliding["gold_tokens_with_question"] is None
    assert screen["models"]["window-keys"]["settings"]["study"]["route_by"] == "keys"
    assert len(screen["models"]["sliding"]["B_loss"]) == 2
    assert [(b["kind"], b["length"], b["questions"]) for b in screen["shortcut_baselines"]] == [("other", 250, 3),
                                                                                              ("same", 400, 3)]
    cell = json.loads((tmp_path / "screen" / "window-keys" / "cells" / "B-same-400.json").read_text())
    from hf_clusterformer.data.multipassage import read_squad

    article = {qa["id"]: a for a, entry in enumerate(read_squad(_squad_path())["data"]) for p in entry["paragraphs"]
               for qa in p["qas"]}
    assert {article[e["id"]] for e in cell["per_question"]} <= set(range(36, 40))
    assert "unknown model 'nope'" in subprocess.run([*common, "nope"], env=ENV, capture_output=True, text=True).stderr
