"""Deployment: `torch.export` and ONNX programs of a Cluster-Former model with a dynamic batch and sequence length.

``export_model(model, out, format="onnx")`` writes an ONNX file (the dynamo exporter) that onnxruntime runs;
``format="torch"`` writes a `torch.export` program (``.pt2``, load it with `torch.export.load`). Both take
``input_ids`` and ``attention_mask`` (B, T) of any B and T, padded on either side (multiple choice: (B, C, T) of any
C too), and give the head's logits (QA: ``start_logits``, ``end_logits`` and ``answerable_logits`` when the model has
that head; the sequence, token-classification and masked-LM heads: ``logits``; multiple choice: (B, C) ``logits``;
the base model: ``last_hidden_state``, ``pooler_output``). A head whose weights were never trained (recorded when it
was added: `hf_clusterformer.pipeline.untrained_weights`) is refused unless ``allow_untrained``.

The model's per-batch sizes (window count, prefix width, routed chunks) depend on the data, which eager code reads
back once per forward. The exported head (`ExportedHead`) passes them instead as upper bounds from the input length
(`hf_clusterformer.modeling_clusterformer.BatchSizes.for_export`), the windows and chunks past a batch's own being
empty, and routed states sort by the unique key id * L + position (ONNX has no stable sort): outputs equal eager ones
at every length, while eager code is unchanged. The centroids are buffers, so they are part of the exported weights. The
exported program does not check its inputs (question and context limits, token ids): pass what the tokenizer gives.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import torch
from torch import nn

from hf_clusterformer_cli_support import convert_command
from hf_clusterformer_files import holds_model, owned_by_model

from .modeling_clusterformer import (
    BatchSizes,
    ClusterFormerForMaskedLM,
    ClusterFormerForMultipleChoice,
    ClusterFormerForQuestionAnswering,
    ClusterFormerForSequenceClassification,
    ClusterFormerForTokenClassification,
    ClusterFormerModel,
    ClusterFormerPreTrainedModel,
)
from .pipeline import check_checkpoint_source, untrained_weights

__all__ = ["EXPORT_CLASSES", "FORMATS", "FORMAT_SUFFIXES", "ExportError", "ExportedHead", "export_format", "export_model",
           "export_program",
           "example_inputs", "load_for_export", "output_names", "write_program"]

#: What `export_model` writes: an ONNX file, or a `torch.export` program.
FORMATS = ("onnx", "torch")
#: The file suffix of each format (the format of a file named without one is taken from it).
FORMAT_SUFFIXES = {"onnx": ".onnx", "torch": ".pt2"}

#: The classes that export (multiple choice with (B, C, T) inputs).
EXPORT_CLASSES = {cls.__name__: cls for cls in (
    ClusterFormerForQuestionAnswering, ClusterFormerForSequenceClassification, ClusterFormerForTokenClassification,
    ClusterFormerForMaskedLM, ClusterFormerForMultipleChoice, ClusterFormerModel,
)}


class ExportError(ValueError):
    """Bad input to `export_model` or `load_for_export`, in one line naming the input and the fix."""


def output_names(model: ClusterFormerPreTrainedModel) -> list[str]:
    """Names of the exported program's outputs, in order."""
    if isinstance(model, ClusterFormerForQuestionAnswering):
        return ["start_logits", "end_logits"] + (["answerable_logits"] if model.answerability is not None else [])
    if isinstance(model, ClusterFormerModel):
        return ["last_hidden_state", "pooler_output"]
    return ["logits"]


class ExportedHead(nn.Module):
    """The model as ``(input_ids, attention_mask) -> tuple of tensors`` (`output_names`), what is exported; the inputs
    are (B, T), or (B, C, T) for multiple choice."""

    def __init__(self, model: ClusterFormerPreTrainedModel):
        super().__init__()
        self.model = model
        self.names = output_names(model)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """(B, T) ids and mask ((B, C, T) for multiple choice) -> the head's outputs, laid out with the bounds of
        `BatchSizes.for_export` (nothing read back, so the program has no data-dependent sizes)."""
        sizes = BatchSizes.for_export(self.model.config, input_ids.shape[-1])  # every row (choice) has T tokens
        outputs = self.model(input_ids=input_ids, attention_mask=attention_mask, batch_sizes=sizes, return_dict=True)
        return tuple(outputs[name] for name in self.names)


def example_inputs(
    config, length: int | None = None, batch: int = 2, choices: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """A right-padded batch of pair encodings ``<s> Q </s></s> C </s>`` to trace with: (B, T) ids and mask, or
    (B, C, T) with ``choices``.

    The sizes are symbolic in the exported program, so any values do; the default length spans two windows.
    """
    if choices is not None:
        ids, mask = example_inputs(config, length, batch * choices)
        return ids.view(batch, choices, -1), mask.view(batch, choices, -1)
    length = length or config.window_size + config.window_stride + 8
    special = {config.bos_token_id, config.pad_token_id, config.separator_token_id, config.eos_token_id}
    filler = next(token for token in range(config.vocab_size) if token not in special)
    ids = torch.full((batch, length), config.pad_token_id, dtype=torch.long)
    mask = torch.zeros(batch, length, dtype=torch.long)
    for row in range(batch):
        real = length - 3 * row if length - 3 * row >= 7 else length
        question = min(3, config.max_question_length)
        tokens = [config.bos_token_id, *[filler] * question, config.separator_token_id, config.separator_token_id]
        tokens += [filler] * (real - len(tokens) - 1) + [config.separator_token_id]
        ids[row, :real] = torch.tensor(tokens[:real])
        mask[row, :real] = 1
    return ids, mask


def export_program(model: ClusterFormerPreTrainedModel, length: int | None = None) -> torch.export.ExportedProgram:
    """`torch.export` of ``model`` (in eval mode) with dynamic batch and length dimensions, traced at ``length``."""
    if not isinstance(model, tuple(EXPORT_CLASSES.values())):
        raise ExportError(f"cannot export a {type(model).__name__}; export one of {', '.join(EXPORT_CLASSES)}.")
    model.eval()
    batch, tokens = torch.export.Dim("batch", min=1), torch.export.Dim("length", min=2)
    if isinstance(model, ClusterFormerForMultipleChoice):
        ids, mask = example_inputs(model.config, length, choices=2)
        dims = {0: batch, 1: torch.export.Dim("choices", min=1), 2: tokens}
    else:
        ids, mask = example_inputs(model.config, length)
        dims = {0: batch, 1: tokens}
    with torch.no_grad():
        return torch.export.export(
            ExportedHead(model), (ids, mask), dynamic_shapes={"input_ids": dims, "attention_mask": dims},
            strict=False, prefer_deferred_runtime_asserts_over_guards=True,
        )


def load_for_export(path: str | os.PathLike) -> ClusterFormerPreTrainedModel:
    """The model class that ``config.json``'s ``architectures`` names, from a checkpoint directory or Hub id, in eval
    mode; weights the checkpoint lacks (a new head) are recorded as untrained by its ``from_pretrained``
    (`untrained_weights` reads them)."""
    from transformers import AutoConfig

    try:
        path = check_checkpoint_source(path, "model")
    except (OSError, TypeError) as error:
        raise ExportError(str(error)) from error
    try:
        config = AutoConfig.from_pretrained(path, trust_remote_code=False)
    except (OSError, ValueError) as error:
        raise ExportError(f"could not load a Cluster-Former config from {path}: {error}") from error
    if config.model_type != "clusterformer":
        raise ExportError(f"{path} is a {config.model_type!r} checkpoint, not a Cluster-Former one; convert it first "
                          f"(`{convert_command(path, config.architectures)}`) and export OUT.")
    names = [name for name in (config.architectures or ["ClusterFormerForQuestionAnswering"]) if name in EXPORT_CLASSES]
    if not names:
        raise ExportError(f"{path} holds a {config.architectures[0]}, which does not export; export one of "
                          f"{', '.join(EXPORT_CLASSES)}.")
    try:
        model = EXPORT_CLASSES[names[0]].from_pretrained(path)
    except (OSError, ValueError) as error:
        raise ExportError(f"could not load the weights of {path}: {error}") from error
    return model.eval()


def export_model(
    model: ClusterFormerPreTrainedModel | str | os.PathLike,
    out: str | os.PathLike,
    format: str | None = None,
    *,
    allow_untrained: bool = False,
    length: int | None = None,
    overwrite: bool = False,
) -> Path:
    """Export ``model`` (a model, or a checkpoint directory or Hub id) to ``out``: an ONNX file or a ``.pt2`` program.

    Args:
        model: a Cluster-Former model (QA, masked LM, sequence or token classification, multiple choice, or the base
            model) or where to load one from (`load_for_export`).
        out: the file to write.
        format: ``"onnx"`` (the dynamo exporter; run it with onnxruntime) or ``"torch"`` (`torch.export.save`);
            default: by the suffix of ``out`` (``.onnx``, ``.pt2``; ONNX for any other), which must agree with it.
        allow_untrained: export a head whose weights were never trained (their outputs are random).
        length: the input length to trace at (any; the program takes every length).
        overwrite: replace an existing ``out``.

    Returns:
        The path written. Raises `ExportError` (one line) on bad input.
    """
    out = Path(out)
    format = export_format(out, format)
    if out.is_dir():
        raise ExportError(f"{out} is a folder; give the file to write, e.g. {out / ('model' + FORMAT_SUFFIXES[format])}.")
    if holds_model(out.parent) and owned_by_model(out.name):
        raise ExportError(f"{out} is one of the files of the model in {out.parent}, which an export must not replace; "
                          f"write it to another name, e.g. {out.parent / ('model' + FORMAT_SUFFIXES[format])}.")
    if out.exists() and not overwrite:
        raise ExportError(f"{out} exists; pass overwrite=True (--overwrite) to replace it.")
    if format == "onnx":
        missing = [name for name in ("onnx", "onnxscript") if importlib.util.find_spec(name) is None]
        if missing:
            raise ExportError(f"ONNX export needs {' and '.join(missing)}; install the onnx extra: "
                              "pip install 'hf-clusterformer[onnx]' (or --format torch).")
    if not isinstance(model, nn.Module):
        model = load_for_export(model)
    untrained = untrained_weights(model)
    if untrained and not allow_untrained:
        raise ExportError(f"the model's {', '.join(untrained)} were never trained, so its outputs are random; train it "
                          "first, or pass allow_untrained=True (--allow-untrained) to export it anyway.")
    return write_program(export_program(model, length), out, format, output_names(model))


def export_format(out: str | os.PathLike, format: str | None = None) -> str:
    """The format to write ``out`` in: ``format``, or by the suffix of ``out`` (`FORMAT_SUFFIXES`; ONNX for any other
    suffix); `ExportError` when a known suffix names the other format."""
    if format is not None and format not in FORMATS:
        raise ExportError(f"unknown export format {format!r}; use one of {', '.join(FORMATS)}.")
    suffix = Path(out).suffix.lower()
    by_suffix = {ending: name for name, ending in FORMAT_SUFFIXES.items()}.get(suffix)
    if format is None:
        return by_suffix or "onnx"
    if by_suffix is not None and by_suffix != format:
        raise ExportError(f"{out} ends in {suffix}, the suffix of {by_suffix} files, but the format is {format}; name "
                          f"the file {Path(out).with_suffix(FORMAT_SUFFIXES[format]).name} or leave the format out.")
    return format


def write_program(
    program: torch.export.ExportedProgram, out: str | os.PathLike, format: str, names: list[str]
) -> Path:
    """Write a program from `export_program` as a ``.pt2`` file (``format="torch"``) or an ONNX file whose outputs
    are called ``names`` (`output_names` of the model)."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    if format == "torch":
        torch.export.save(program, str(out))
        return out
    onnx_program = torch.onnx.export(program, input_names=["input_ids", "attention_mask"], output_names=names,
                                     dynamo=True, optimize=False, verbose=False)
    onnx_program.save(str(out))
    return out
