"""Export: one `torch.export` program and one ONNX file of a model with every layer kind (a window_cluster layer's
routed path open), traced at one length and run through `load_exported`, equal to eager at other lengths and batch
sizes (padding included); int8 files close to eager; every head whose weights were never trained (added by conversion
or drawn at load, through the Auto classes too) is refused without --allow-untrained; bad input to `export_model` and
to the runner is one line. The other heads' exports are in tests/test_export_heads.py (a file of its own, so that the
two run in parallel under `make test`)."""

import pytest
import torch
import transformers
from export_helpers import CONFIG, SMALL, TRACED_LENGTH, fitted_model
from helpers import pad_batch, random_example, tiny_config

from hf_clusterformer import (
    ClusterFormerForQuestionAnswering,
    ClusterFormerForSequenceClassification,
    ClusterFormerModel,
)
from hf_clusterformer.export import (
    EXPORT_CLASSES,
    ExportError,
    export_model,
    export_program,
    load_exported,
    load_for_export,
    program_metadata,
    write_program,
)
from hf_clusterformer_cli import main

ort = pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")

#: (question, context) lengths per row: shorter than one window, two, several windows, a length that is no multiple
#: of m (the program's window count is the batch's own, from one up).
BATCHES = {
    "one window": [(3, 6)],
    "two windows": [(2, 20), (4, 9)],
    "several windows": [(4, 80), (6, 44), (2, 3)],
    "not a multiple of the stride": [(5, 37)],
    "padded, batch of 3": [(8, 29), (1, 61), (3, 14)],
}


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    model = fitted_model(ClusterFormerForQuestionAnswering, 0, **CONFIG)
    folder = tmp_path_factory.mktemp("export")
    program = export_program(model, TRACED_LENGTH)  # the same as export_model(..., length=TRACED_LENGTH) writes
    files = {name: write_program(program, folder / file, kind, program_metadata(model), quantize=quantize)
             for name, file, kind, quantize in (("torch", "model.pt2", "torch", None),
                                                ("onnx", "model.onnx", "onnx", None),
                                                ("int8", "int8.onnx", "onnx", "int8"))}
    assert files["int8"].stat().st_size < files["onnx"].stat().st_size
    return model, {name: load_exported(file) for name, file in files.items()}


@pytest.mark.parametrize("rows", BATCHES.values(), ids=BATCHES.keys())
def test_exported_program_and_onnx_equal_eager_at_other_lengths(exported, rows):
    model, runners = exported
    generator = torch.Generator().manual_seed(len(rows) * 100 + rows[0][1])
    ids, mask = pad_batch([random_example(generator, question, context) for question, context in rows])
    assert ids.shape[1] != TRACED_LENGTH
    with torch.no_grad():
        eager = model(input_ids=ids, attention_mask=mask)
    for name in ("torch", "onnx"):
        outputs = runners[name](ids, mask)
        assert list(outputs) == ["start_logits", "end_logits"]
        torch.testing.assert_close(outputs["start_logits"], eager.start_logits, atol=1e-4, rtol=0)
        torch.testing.assert_close(outputs["end_logits"], eager.end_logits, atol=1e-4, rtol=0)
    # int8 weights: close to the model, not equal (the products round the weights to 1/127 of their range)
    quantized = runners["int8"](ids.numpy(), mask.numpy())["start_logits"]  # numpy arrays are taken too
    difference = (quantized - eager.start_logits).abs().max()
    assert 0 < difference < 0.05, difference


def test_the_runner_checks_every_batch_in_one_line(exported):
    """What the model itself refuses, the runner refuses before the program runs: in one line, naming the input."""
    model, runners = exported
    runner = runners["onnx"]
    generator = torch.Generator().manual_seed(7)
    ids, mask = pad_batch([random_example(generator, 3, 20), random_example(generator, 2, 9)])
    limit, sep = model.config.max_question_length, model.config.separator_token_id
    too_long = torch.tensor([random_example(generator, limit + 2, 5)])
    mixed, unknown = mask.clone(), ids.clone()
    mixed[0, 3] = 0
    unknown[0, 8] = model.config.vocab_size
    cases = [
        ((ids[0], mask[0]), "must be \\(batch, length\\)"),
        ((ids.float(), mask), "integer token ids"),
        ((ids, mask[:, :-1]), "attention_mask must be 0s and 1s of input_ids' shape"),
        ((ids, mask.float()), "attention_mask must be 0s and 1s"),
        ((ids, 2 * mask), "attention_mask must be 0s and 1s"),  # Row: a mask of 2s was taken as it was
        ((ids, -mask), "attention_mask must be 0s and 1s"),
        ((ids, mixed), "mixes padding"),
        ((ids.masked_fill(ids == sep, 5), mask), "no separator.*tokenizer\\(question, context\\)\\.$"),
        ((unknown, mask), "outside the vocabulary"),
        ((torch.tensor([[model.config.bos_token_id, 5, 6, 7, sep]]), None),
         "holds one text.*tokenizer\\(question, context\\) with a context\\.$"),
        ((too_long, None), f"has {limit + 2} tokens, more than max_question_length"),
        (("not ids", None), "input_ids must be"),
        ((ids[:0], mask[:0]), "empty"),
    ]
    for (bad_ids, bad_mask), expected in cases:
        with pytest.raises(ExportError, match=expected) as error:
            runner(bad_ids, bad_mask)
        assert "\n" not in str(error.value) and "question_lengths" not in str(error.value), error.value
    # Row: a BERT tokenizer's batch (**tokenizer(q, c)) was refused for its token_type_ids
    assert torch.equal(runner(ids, mask, token_type_ids=torch.zeros_like(ids))["start_logits"],
                       runner(ids, mask)["start_logits"])
    # Row: other types (which the eager model reads) were taken and silently not read
    with pytest.raises(ExportError, match=r"^token_type_ids row 0 differs from the types the exported program gives "
                                          r"itself \(all 0, as the tokenizer gives a pair\)"):
        runner(ids, mask, token_type_ids=torch.ones_like(ids))
    with pytest.raises(ExportError, match="not a file"):
        load_exported(runner.path.parent / "missing.onnx")
    (runner.path.parent / "other.onnx").write_bytes(b"not onnx")
    with pytest.raises(ExportError, match="not an ONNX file"):
        load_exported(runner.path.parent / "other.onnx")


def test_every_head_drawn_at_load_and_saved_through_the_auto_classes_is_refused(tmp_path, capsys):
    """A head (or the base model's pooler) that loading drew because the checkpoint lacks it is recorded as untrained,
    so a folder saved from it does not export without --allow-untrained; once its weights change, it does."""
    from hf_clusterformer.modeling_clusterformer import untrained_weights
    from hf_clusterformer_heads import HEADS

    torch.manual_seed(0)
    ClusterFormerModel(tiny_config(**SMALL), add_pooling_layer=False).save_pretrained(tmp_path / "encoder")
    auto_classes = {**{head.class_name: head.auto_class for head in HEADS}, ClusterFormerModel.__name__: "AutoModel"}
    assert set(auto_classes) == set(EXPORT_CLASSES)
    for name, auto_class in auto_classes.items():
        model = getattr(transformers, auto_class).from_pretrained(tmp_path / "encoder")
        assert type(model).__name__ == name and untrained_weights(model), name
        folder = tmp_path / name
        model.save_pretrained(folder)
        capsys.readouterr()
        assert main(["export", str(folder), str(tmp_path / f"{name}.pt2")]) == 2
        error = capsys.readouterr().err.strip()
        assert len(error.splitlines()) == 1 and "never trained" in error and "--allow-untrained" in error, error
        with pytest.raises(ExportError, match="never trained"):
            export_model(folder, tmp_path / f"{name}.onnx")
        # a training step's worth of change: the record no longer holds
        with torch.no_grad():
            for parameter_name in untrained_weights(model):
                model.get_parameter(parameter_name).add_(0.01)
        model.save_pretrained(tmp_path / f"{name}-trained")
        assert untrained_weights(load_for_export(tmp_path / f"{name}-trained")) == [], name
    assert not list(tmp_path.glob("*.pt2")) and not list(tmp_path.glob("*.onnx"))
    # allowed, the multiple-choice head exports (`clusterformer export --format torch`) and runs on (B, C, T)
    out = tmp_path / "choices.pt2"
    assert main(["export", str(tmp_path / "ClusterFormerForMultipleChoice"), str(out), "--allow-untrained"]) == 0
    ids, mask = pad_batch([random_example(torch.Generator().manual_seed(4), 3, 20 + row) for row in range(6)])
    assert load_exported(out)(ids.view(2, 3, -1), mask.view(2, 3, -1))["logits"].shape == (2, 3)


def test_bad_input_is_one_line(tmp_path):
    torch.manual_seed(0)
    model = ClusterFormerForQuestionAnswering(tiny_config())
    with pytest.raises(ExportError, match="unknown export format 'tflite'") as error:
        export_model(model, tmp_path / "m.tflite", format="tflite")
    assert "\n" not in str(error.value)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ExportError, match="config.json") as error:
        load_for_export(tmp_path / "empty")
    assert "\n" not in str(error.value)
    folder = tmp_path / "untrained"
    ClusterFormerForSequenceClassification(tiny_config()).save_pretrained(folder)
    with pytest.raises(ExportError, match="never trained.*--allow-untrained") as error:
        export_model(_as_qa(folder), tmp_path / "m.onnx")
    assert "\n" not in str(error.value)


def _as_qa(folder):
    """A QA model from a classifier's folder: its QA head is new, recorded as untrained."""
    from hf_clusterformer.modeling_clusterformer import mark_untrained

    model, info = ClusterFormerForQuestionAnswering.from_pretrained(folder, output_loading_info=True)
    mark_untrained(model, [key for key in info["missing_keys"] if ".router." not in key])
    return model


def test_command_errors_are_one_line(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    folder = tmp_path / "classifier"
    ClusterFormerForSequenceClassification(tiny_config()).save_pretrained(folder)
    from hf_clusterformer.configuration_clusterformer import ClusterFormerConfig

    config = ClusterFormerConfig.from_pretrained(folder)
    config.architectures = ["ClusterFormerForQuestionAnswering"]  # a QA checkpoint without its QA head
    config.save_pretrained(folder)
    capsys.readouterr()  # the saving's progress bars
    cases = [
        (["export", str(tmp_path / "empty"), str(tmp_path / "m.onnx")], "config.json"),
        (["export", str(folder), str(tmp_path / "m.onnx"), "--format", "tflite"], "invalid choice: 'tflite'"),
        (["export", str(folder), str(tmp_path / "m.onnx")], "never trained.*--allow-untrained"),
        (["export", str(folder), str(tmp_path / "m.pt2"), "--quantize", "int8"], "makes ONNX files.*m.onnx"),
        (["export", str(folder), str(tmp_path / "m.onnx"), "--quantize", "int4"], "invalid choice: 'int4'"),
    ]
    for argv, expected in cases:
        assert main(argv) == 2
        error = capsys.readouterr().err.strip()
        assert len(error.splitlines()) == 1 and error.startswith("clusterformer: error:"), error
        assert __import__("re").search(expected, error), error
    assert not (tmp_path / "m.onnx").exists()


def test_onnx_files_are_optimised_once_and_attention_reads_one_additive_mask_per_layout(exported):
    """The file holds one Attention node per layer (opset 23), no transpose of a weight left to do at load time, and
    each boolean attention mask turned into an additive float one once, shared by the layers that read it."""
    onnx = pytest.importorskip("onnx")
    _, runners = exported
    graph = onnx.load(str(runners["onnx"].path)).graph
    attention = [node for node in graph.node if node.op_type == "Attention"]
    assert len(attention) == 6  # CONFIG: a sliding, a cluster, an LSH, a sparse and a window_cluster layer (two)
    masks = {node.input[3] for node in attention}
    made = {node.output[0] for node in graph.node if node.op_type == "Where" and node.name.endswith("_additive_where")}
    assert masks <= made and len(made) == len(masks)
    weights = {initializer.name for initializer in graph.initializer}
    products = [node for node in graph.node if node.op_type == "MatMul"]
    # every layer's 6 linear maps, a window_cluster layer's Q/K/V on its chunks and its routed projection: stored
    assert sum(node.input[1] in weights for node in products) >= 5 * 6 + 4
    assert runners["onnx"].quantize is None and runners["int8"].quantize == "int8"


QUIET_EXPORT = """
import sys, warnings
sys.path.insert(0, {tests!r})
from helpers import tiny_config
from hf_clusterformer import ClusterFormerForQuestionAnswering
from hf_clusterformer.export import ExportError, export_model

warnings.simplefilter("always")
model = ClusterFormerForQuestionAnswering(tiny_config(num_hidden_layers=2, cluster_layers=[1]))
for router in model.cluster_routers().values():
    router.fitted.fill_(True)
try:
    export_model(model, "out/", allow_untrained=True)
except ExportError as error:
    print("refused:", error)
print("wrote", export_model(model, "~/m.onnx", allow_untrained=True))
"""


def test_export_model_reads_paths_as_meant_and_keeps_the_exporters_notes_to_itself(tmp_path):
    """In Python, ``export_model(model, "out/")`` wrote a file named ``out``, ``"~/m.onnx"`` a folder named ``~``, and
    the first ONNX export of a process printed torch.onnx's notes on torchvision ops it skips (and FutureWarnings of
    torch's internals). A fresh process, as a user's script: one line for the folder, the file under the home folder,
    nothing else on stderr."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    home = tmp_path / "home"
    home.mkdir()
    script = QUIET_EXPORT.format(tests=str(Path(__file__).parent))
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "HOME": str(home), "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines() == [
        "refused: out/ ends in /, so it names a folder; give the file to write, e.g. out/model.onnx or out/model.pt2.",
        f"wrote {home / 'm.onnx'}"]
    assert (home / "m.onnx").is_file() and not (tmp_path / "out").exists() and not (tmp_path / "~").exists()
    assert "Skipping" not in done.stderr and "FutureWarning" not in done.stderr, done.stderr
    assert "never fitted" not in done.stderr  # (the centroids were marked fitted: the one warning it may give)


def test_the_runner_takes_a_bert_tokenizers_pair_types(tmp_path):
    """A BERT-family model (``pair_token_types``): the types a BERT tokenizer gives a pair (0 for ``[CLS] Q [SEP]``,
    1 for ``C [SEP]``, padding 0) pass and answer as eager does with them; other types are refused in one line."""
    model = fitted_model(ClusterFormerForQuestionAnswering, 0, **{**CONFIG, "pair_token_types": True})
    runner = load_exported(write_program(export_program(model, TRACED_LENGTH), tmp_path / "bert.pt2", "torch",
                                         program_metadata(model)))
    generator = torch.Generator().manual_seed(1)
    ids, mask = pad_batch([random_example(generator, 4, 40), random_example(generator, 2, 9)])
    sep = torch.cumsum(ids == model.config.separator_token_id, dim=1)
    types = ((sep >= 2) & (ids != model.config.separator_token_id) | (sep >= 3)).long() * mask  # BERT's pair types
    with torch.no_grad():
        eager = model(ids, attention_mask=mask, token_type_ids=types).start_logits
    got = runner(ids, mask, token_type_ids=types)["start_logits"]
    assert torch.allclose(got.masked_fill(mask == 0, 0), eager.masked_fill(mask == 0, 0), atol=1e-5)
    with pytest.raises(ExportError, match=r"^token_type_ids row 0 differs .* \(0 for the question prefix and 1 for "
                                          r"the context, as the tokenizer gives a pair\)"):
        runner(ids, mask, token_type_ids=torch.zeros_like(ids))
