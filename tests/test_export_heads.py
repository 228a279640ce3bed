"""Export of the heads beside question answering (tests/test_export.py): multiple choice (every layer kind, routed by
key projections) at other choice counts and lengths, a classification head with left padding, and every other head
(fill-mask in every format) equal to eager.
A file of its own, so that the two export files run in parallel under `make test`."""

import pytest
import torch
from export_helpers import CONFIG, SMALL, TRACED_LENGTH, fitted_model
from helpers import pad_batch, random_example

from hf_clusterformer import ClusterFormerForMultipleChoice, ClusterFormerForSequenceClassification
from hf_clusterformer.export import (
    EXPORT_CLASSES,
    export_program,
    load_exported,
    output_names,
    program_metadata,
    write_program,
)
from hf_clusterformer_cli import main

pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")


#: (batch, choices) of the multiple-choice batches; the program is traced with 2 choices.
CHOICES = {"one example of three": (1, 3), "two of four": (2, 4), "three of one": (3, 1)}


@pytest.fixture(scope="module")
def exported_choices(tmp_path_factory):
    """Every layer type (`CONFIG`) with routers that compare key projections (QA's export routes by states)."""
    model = fitted_model(ClusterFormerForMultipleChoice, 2, **CONFIG, route_by="keys")
    program = export_program(model, TRACED_LENGTH)
    folder = tmp_path_factory.mktemp("choices")
    return model, *(load_exported(write_program(program, folder / name, kind, program_metadata(model)))
                    for name, kind in (("choices.pt2", "torch"), ("choices.onnx", "onnx")))


@pytest.mark.parametrize("shape", CHOICES.values(), ids=CHOICES.keys())
def test_multiple_choice_exports_take_any_choice_count_and_length(exported_choices, shape):
    """(B, C, T) inputs of any B, C and T: every choice a pair encoding of its own question length, padded."""
    model, program, onnx_program = exported_choices
    batch, choices = shape
    generator = torch.Generator().manual_seed(batch * 10 + choices)
    ids, mask = pad_batch([random_example(generator, 1 + row % 6, 4 + 9 * row) for row in range(batch * choices)])
    ids, mask = ids.view(batch, choices, -1), mask.view(batch, choices, -1)
    assert ids.shape[-1] != TRACED_LENGTH
    with torch.no_grad():
        eager = model(input_ids=ids, attention_mask=mask).logits
    assert eager.shape == (batch, choices)
    torch.testing.assert_close(program(ids, mask)["logits"], eager, atol=1e-4, rtol=0)
    torch.testing.assert_close(onnx_program(ids, mask)["logits"], eager, atol=1e-4, rtol=0)


def test_left_padding_and_another_head(tmp_path):
    """A classification head exports too (`clusterformer export --format torch` writes its .pt2 file), and
    left-padded rows give eager's logits."""
    model = fitted_model(ClusterFormerForSequenceClassification, 1, num_labels=3, **SMALL)
    model.save_pretrained(tmp_path / "cls")
    assert main(["export", str(tmp_path / "cls"), str(tmp_path / "cls.pt2"), "--format", "torch"]) == 0
    program = load_exported(tmp_path / "cls.pt2")
    assert (program.format, program.architecture, program.output_names) == \
        ("torch", "ClusterFormerForSequenceClassification", ["logits"])
    generator = torch.Generator().manual_seed(3)
    ids, mask = pad_batch([random_example(generator, 4, 30), random_example(generator, 2, 7)])
    ids, mask = ids.flip(1), mask.flip(1)  # left padding (the rows reversed: still pair encodings of random tokens)
    with torch.no_grad():
        torch.testing.assert_close(program(ids, mask)["logits"], model(input_ids=ids, attention_mask=mask).logits,
                                   atol=1e-4, rtol=0)


#: The heads no other test exports, each with the formats it is checked in (every head exports: QA in
#: tests/test_export.py, sequence classification and multiple choice above).
OTHER_HEADS = {
    "ClusterFormerForMaskedLM": ("model.pt2", "model.onnx", "int8.onnx"),
    "ClusterFormerForTokenClassification": ("model.pt2",),
    "ClusterFormerModel": ("model.pt2",),
}


@pytest.mark.parametrize("name", OTHER_HEADS)
def test_every_head_exports_equal_to_eager(name, tmp_path):
    """The fill-mask head (a single text per row: its prefix width is always one) exported to every format, and the
    token-classification head and the base model, give eager's outputs on a padded batch of single texts."""
    model = fitted_model(EXPORT_CLASSES[name], 2, **SMALL)
    program = export_program(model)
    generator = torch.Generator().manual_seed(5)
    rows = [[0, *torch.randint(4, 100, (n,), generator=generator).tolist(), 2] for n in (30, 7, 60)]
    ids, mask = pad_batch(rows)
    with torch.no_grad():
        expected = model(input_ids=ids, attention_mask=mask)
    for file in OTHER_HEADS[name]:
        kind, quantize = ("torch", None) if file.endswith(".pt2") else ("onnx", "int8" if "int8" in file else None)
        outputs = load_exported(write_program(program, tmp_path / file, kind, program_metadata(model),
                                              quantize=quantize))(ids, mask)
        for output in output_names(model)[:1]:
            torch.testing.assert_close(outputs[output], expected[output], atol=0.05 if quantize else 1e-4, rtol=0)
