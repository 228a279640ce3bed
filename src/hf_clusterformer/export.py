"""Deployment: ONNX and `torch.export` programs of a Cluster-Former model with a dynamic batch and sequence length,
and the runner that checks a batch and runs them.

``export_model(model, out)`` writes an ONNX file (the dynamo exporter, graph optimised once by onnxruntime; with
``quantize="int8"`` its matrix products take int8 weights) or, for a ``.pt2`` name, a `torch.export` program.
``load_exported(out)`` gives an `ExportedModel`: call it with ``input_ids`` and ``attention_mask`` (B, T) of any B
and T, padded on either side (multiple choice: (B, C, T) of any C too), as the tokenizer gives them; it checks them
(one line per fault, `ExportError`) and returns the head's outputs by name (QA: ``start_logits``, ``end_logits`` and
``answerable_logits`` when the model has that head; the sequence, token-classification and masked-LM heads:
``logits``; multiple choice: (B, C) ``logits``; the base model: ``last_hidden_state``, ``pooler_output``). A head
whose weights were never trained (recorded when it was added:
`hf_clusterformer.modeling_clusterformer.untrained_weights`) is refused unless ``allow_untrained``.

The layout of a batch (window count, prefix width, routed chunks) depends on where its questions end, which eager
code reads back once per forward. An exported program takes it instead from the *lengths* of two size inputs,
``num_windows`` (K,) and ``prefix_width`` (S - l,), whose values are ignored (`program_inputs` makes them from a
batch); the routed chunk count follows from them (`BatchSizes.for_program`), and routed states sort by the unique
key id * L + position (ONNX has no stable sort). So the program runs the batch's own windows, as eager code does, and
its outputs equal eager ones at every length. The file holds the model's configuration, so the runner needs nothing
else; the centroids are buffers, so they are part of the exported weights. Every layer kind exports, whatever its
routers compare (``route_by``): a window_cluster layer is its window's attention and its chunks' attention, both in
the program, and its routed projection is an ordinary weight.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import logging
import os
import tempfile
import warnings
import zipfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import SafetensorError
from torch import nn

import hf_clusterformer_heads
from hf_clusterformer_cli_support import convert_command
from hf_clusterformer_files import holds_model, owned_by_model
from hf_clusterformer_heads import Head, find_head

from . import modeling_clusterformer
from .configuration_clusterformer import ClusterFormerConfig
from .loading import check_checkpoint_source, unreadable_weights
from .modeling_clusterformer import (
    BatchSizes,
    ClusterFormerModel,
    ClusterFormerPreTrainedModel,
    check_input_tensors,
    locate_rows,
    non_finite_weights,
    untrained_weights,
)

logger = logging.getLogger(__name__)

__all__ = ["ExportError", "export_model", "load_exported", "program_inputs"]

#: What `export_model` writes: an ONNX file, or a `torch.export` program.
FORMATS = ("onnx", "torch")
#: The file suffix of each format (the format of a file named without one is taken from it).
FORMAT_SUFFIXES = {"onnx": ".onnx", "torch": ".pt2"}
#: Weight quantisations of an ONNX export (onnxruntime's dynamic quantisation of the matrix products).
QUANTIZATIONS = ("int8",)
#: The exported program's inputs: the batch, then the two size inputs (`program_inputs`).
INPUT_NAMES = ("input_ids", "attention_mask", "num_windows", "prefix_width")
#: Where an exported file keeps what `load_exported` needs (ONNX metadata key; file inside a ``.pt2`` archive).
METADATA_KEY = "clusterformer"
ONNX_OPSET = 23  # scaled_dot_product_attention becomes one Attention node
#: Windows of the default traced input: more than two, so no size of the trace is 1 (torch.export would fix it).
TRACE_WINDOWS = 3
#: onnxruntime fusions left off when a file is run: on this graph its fused skip-LayerNorm and bias-GELU kernels took
#: longer than the ops they replace (MiniLM, 2k tokens, 1 thread: 0.871 s with them, 0.808 s without).
UNFUSED = ["SkipLayerNormFusion", "BiasGeluFusion"]

class _ExportClasses(Mapping[str, type]):
    """The classes that export, by name: every head of `hf_clusterformer_heads.HEADS` (read when used), then the base
    model (multiple choice with (B, C, T) inputs)."""

    def _classes(self) -> dict[str, type]:
        names = [head.class_name for head in hf_clusterformer_heads.HEADS] + [ClusterFormerModel.__name__]
        return {name: getattr(modeling_clusterformer, name) for name in names}

    def __getitem__(self, name: str) -> type:
        return self._classes()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._classes())

    def __len__(self) -> int:
        return len(self._classes())


#: The classes that export, by name (the heads' classes and `ClusterFormerModel`).
EXPORT_CLASSES: Mapping[str, type] = _ExportClasses()


class ExportError(ValueError):
    """Bad input to `export_model`, `load_for_export`, `load_exported` or an `ExportedModel`, in one line naming the
    input and the fix."""


def head_row(model: type | str) -> Head | None:
    """The row of `hf_clusterformer_heads.HEADS` of a model class or class name (a subclass of a head's class finds
    that head's row); ``None`` for the base model."""
    names = [model] if isinstance(model, str) else [cls.__name__ for cls in model.__mro__]
    return next((head for head in map(find_head, names) if head is not None), None)


def output_names(model: ClusterFormerPreTrainedModel) -> list[str]:
    """Names of the exported program's outputs, in order: its head's (`head_row`; a QA head with answerability adds
    ``answerable_logits``), or the base model's."""
    if isinstance(model, ClusterFormerModel):
        return ["last_hidden_state", "pooler_output"]
    head = head_row(type(model))
    outputs = head.outputs if head is not None else ("logits",)
    return [*outputs, *(["answerable_logits"] if getattr(model, "answerability", None) is not None else [])]


def input_dims(model: type | str) -> tuple[str, ...]:
    """The dimensions of a model's ``input_ids`` by its head's row (`head_row`): ``("batch", "length")``, or a
    multiple-choice head's ``("batch", "choices", "length")``."""
    head = head_row(model)
    return head.inputs if head is not None else ("batch", "length")


class ExportedHead(nn.Module):
    """The model as ``(input_ids, attention_mask, num_windows, prefix_width) -> tuple of tensors`` (`output_names`),
    what is exported; the batch is (B, T), or (B, C, T) for multiple choice; the size inputs (K,) and (S - l,)."""

    def __init__(self, model: ClusterFormerPreTrainedModel):
        super().__init__()
        self.model = model
        self.names = output_names(model)

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, num_windows: torch.Tensor,
        prefix_width: torch.Tensor,
    ) -> tuple[torch.Tensor, ...]:
        """The head's outputs, laid out with K = ``len(num_windows)`` windows of prefix width ``len(prefix_width)``
        (`BatchSizes.for_program`: nothing read back, so the program has no data-dependent sizes)."""
        sizes = BatchSizes.for_program(self.model.config, num_windows.shape[0], prefix_width.shape[0])
        outputs = self.model(input_ids=input_ids, attention_mask=attention_mask, batch_sizes=sizes, return_dict=True)
        return tuple(outputs[name] for name in self.names)


def program_inputs(
    config: ClusterFormerConfig, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
    input_format: str = "pair", token_type_ids: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Check a batch as the model does (`locate_rows`: one line per fault) and give the exported program's inputs.

    Args:
        config: the exported model's configuration.
        input_ids: (B, T) token ids, or (B, C, T) for multiple choice; attention_mask: the same shape (default: the
            non-padding ids).
        input_format: how the rows are read (the head's ``input_format``).
        token_type_ids: optional, the shape of ``input_ids``: the program does not read them but gives every row the
            types of a tokenizer's pair itself, so other types (which the eager model would read) are refused.

    Returns:
        ``input_ids``, ``attention_mask`` (long), and the size inputs: (K,) and (S - l,) zeros, whose lengths are the
        batch's window count and question prefix width (`BatchSizes.of_rows`).
    """
    if attention_mask is None:
        attention_mask = input_ids.ne(config.pad_token_id).long()
    rows = input_ids.reshape(-1, input_ids.shape[-1]) if input_ids.dim() == 3 else input_ids  # choices are rows
    mask_rows = attention_mask.reshape(-1, attention_mask.shape[-1]) if attention_mask.dim() == 3 else attention_mask
    check_input_tensors(rows, None)
    prefixes, totals, prefix, lengths, starts, single = locate_rows(config, rows.long(), mask_rows,
                                                                    input_format=input_format,
                                                                    takes_question_lengths=False)
    if token_type_ids is not None:
        _check_token_types(config, token_type_ids.reshape(rows.shape), prefix, lengths, starts, single)
    sizes = BatchSizes.of_rows(config, prefixes, totals)
    return (input_ids.long(), attention_mask.long(), torch.zeros(sizes.num_windows, dtype=torch.long),
            torch.zeros(sizes.prefix_width, dtype=torch.long))


def example_inputs(
    config, length: int | None = None, batch: int = 2, choices: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """A right-padded batch of pair encodings ``<s> Q </s></s> C </s>`` to trace with: (B, T) ids and mask, or
    (B, C, T) with ``choices``.

    The sizes are symbolic in the exported program, so any values do; the default length spans `TRACE_WINDOWS`
    windows.
    """
    if choices is not None:
        ids, mask = example_inputs(config, length, batch * choices)
        return ids.view(batch, choices, -1), mask.view(batch, choices, -1)
    length = length or config.window_size + (TRACE_WINDOWS - 1) * config.window_stride + 8
    special = {config.bos_token_id, config.pad_token_id, config.separator_token_id, config.eos_token_id}
    filler = next(token for token in range(config.vocab_size) if token not in special)
    ids = torch.full((batch, length), config.pad_token_id, dtype=torch.long)
    mask = torch.zeros(batch, length, dtype=torch.long)
    for row in range(batch):
        real = length - 3 * row if length - 3 * row >= 7 else length
        question = min(3 + row, config.max_question_length)
        tokens = [config.bos_token_id, *[filler] * question, config.separator_token_id, config.separator_token_id]
        tokens += [filler] * (real - len(tokens) - 1) + [config.separator_token_id]
        ids[row, :real] = torch.tensor(tokens[:real])
        mask[row, :real] = 1
    return ids, mask


def export_program(model: ClusterFormerPreTrainedModel, length: int | None = None) -> torch.export.ExportedProgram:
    """`torch.export` of ``model`` (in eval mode) with dynamic batch, length and size inputs, traced at ``length``."""
    if not isinstance(model, tuple(EXPORT_CLASSES.values())):
        raise ExportError(f"cannot export a {type(model).__name__}; export one of {', '.join(EXPORT_CLASSES)}.")
    model.eval()
    Dim = torch.export.Dim
    names = input_dims(type(model))  # (batch, length), or (batch, choices, length): a row per choice
    ids, mask = example_inputs(model.config, length, choices=2 if len(names) == 3 else None)
    dims = {axis: Dim(name, min=2 if name == "length" else 1) for axis, name in enumerate(names)}
    inputs = program_inputs(model.config, ids, mask, model.input_format)
    # a single-text head's prefix is ``<s>`` alone in every batch: its width is one, not a dimension of the program
    width = Dim.STATIC if model.input_format == "single" else Dim("prefix_width")
    sizes = {"num_windows": {0: Dim("num_windows", min=1)}, "prefix_width": {0: width}}
    with torch.no_grad():
        return torch.export.export(
            ExportedHead(model), inputs, dynamic_shapes={"input_ids": dims, "attention_mask": dims, **sizes},
            strict=False, prefer_deferred_runtime_asserts_over_guards=True,
        )


def program_metadata(model: ClusterFormerPreTrainedModel) -> dict[str, Any]:
    """What `load_exported` needs beside the program: the configuration, the head's input format, inputs and
    outputs."""
    return {"config": model.config.to_dict(), "architecture": type(model).__name__, "input_format": model.input_format,
            "inputs": list(input_dims(type(model))), "outputs": output_names(model),
            "centroids_fitted": centroids_fitted(model)}


def centroids_fitted(model: ClusterFormerPreTrainedModel) -> dict[str, bool]:
    """Whether each K-Means layer's centroids were fitted, for the layers whose routing takes part in the outputs (a
    window_cluster layer whose routed path is still closed takes none)."""
    layers = model.base_model.encoder.layer
    return {str(i): bool(r.fitted) for i, r in model.cluster_routers().items() if layers[i].routing_changes_outputs()}


def warn_unfitted(fitted: dict, where: str) -> None:
    """Warn, as ``predict`` does, when layers of ``where`` with K-Means centroids (cluster, window_cluster) have
    centroids never fitted."""
    unfitted = sorted(int(index) for index, done in fitted.items() if not done)
    if unfitted:
        logger.warning(f"{where}: cluster layers {unfitted} run with centroids that were never fitted by K-Means, so "
                       "their routing is random; train with hf_clusterformer.CentroidUpdateCallback first.")


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
    architectures = config.architectures or ["ClusterFormerForQuestionAnswering"]
    names = [name for name in architectures if name in EXPORT_CLASSES]
    if not names:
        raise ExportError(f"{path} holds a {config.architectures[0]}, which does not export; export one of "
                          f"{', '.join(EXPORT_CLASSES)}.")
    try:
        model = EXPORT_CLASSES[names[0]].from_pretrained(path)
    except (OSError, ValueError, SafetensorError) as error:
        raise ExportError(unreadable_weights(path, error)) from error
    return model.eval()


def export_model(
    model: ClusterFormerPreTrainedModel | str | os.PathLike,
    out: str | os.PathLike,
    format: str | None = None,
    *,
    allow_untrained: bool = False,
    length: int | None = None,
    overwrite: bool = False,
    quantize: str | None = None,
) -> Path:
    """Export ``model`` (a model, or a checkpoint directory or Hub id) to ``out``: an ONNX file or a ``.pt2`` program
    (run either with `load_exported`).

    Args:
        model: a Cluster-Former model (QA, masked LM, sequence or token classification, multiple choice, or the base
            model) or where to load one from (`load_for_export`).
        out: the file to write (``~`` is expanded; a path ending in ``/`` names a folder and is refused).
        format: ``"onnx"`` (the dynamo exporter; graph optimised by onnxruntime) or ``"torch"``
            (`torch.export.save`); default: by the suffix of ``out`` (``.onnx``, ``.pt2``; ONNX for any other),
            which must agree with it.
        allow_untrained: export a head whose weights were never trained (their outputs are random).
        length: the input length to trace at (any; the program takes every length).
        overwrite: replace an existing ``out``.
        quantize: ``"int8"``: an ONNX file whose matrix products take int8 weights (onnxruntime's dynamic
            quantisation; smaller and faster on CPU, outputs close to but not equal to the model's).

    Returns:
        The path written. Raises `ExportError` (one line) on bad input.
    """
    out, format = _export_target(out, format, quantize, overwrite)
    if not isinstance(model, nn.Module):
        model = load_for_export(model)
    broken = non_finite_weights(model)
    if broken:
        raise ExportError(f"the model's weights hold NaN or inf ({len(broken)} tensors: {', '.join(broken[:3])}), so "
                          "its outputs would be meaningless; export an earlier checkpoint, or train it again.")
    warn_unfitted(centroids_fitted(model), f"the export {out}")
    untrained = untrained_weights(model)
    if untrained and not allow_untrained:
        raise ExportError(f"the model's {', '.join(untrained)} were never trained, so its outputs are random; "
                          "train it first, or pass allow_untrained=True (--allow-untrained) to export it anyway.")
    with quiet_exporters():
        return write_program(export_program(model, length), out, format, program_metadata(model), quantize=quantize)


@contextlib.contextmanager
def quiet_exporters() -> Iterator[None]:
    """Hide the exporters' notes for the block (torch.onnx's torchvision ops it skips, FutureWarnings of torch's
    internals, onnxruntime's root-logger advice to pre-process before quantising: int8 is measured without it,
    bench/export_f1.py), unless the ``torch.onnx`` logger's level was set (``logging.getLogger("torch.onnx")
    .setLevel(...)`` shows them)."""
    logger = logging.getLogger("torch.onnx")
    if logger.level != logging.NOTSET:
        yield
        return

    def not_advice(record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Please consider to run pre-processing before quantization")

    logger.setLevel(logging.ERROR)
    logging.getLogger().addFilter(not_advice)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            yield
    finally:
        logger.setLevel(logging.NOTSET)
        logging.getLogger().removeFilter(not_advice)


def _export_target(out: str | os.PathLike, format: str | None, quantize: str | None, overwrite: bool
                  ) -> tuple[Path, str]:
    """The file `export_model` writes and its format: ``~`` expanded; `ExportError` (one line) for a path that names a
    folder, one of a model folder's own files, an existing file without ``overwrite``, or a missing exporter."""
    if os.fspath(out).endswith(("/", os.sep)) and not Path(out).expanduser().is_dir():  # a folder was meant
        raise ExportError(f"{os.fspath(out)} ends in /, so it names a folder; give the file to write, e.g. "
                          f"{os.fspath(out)}model.onnx or {os.fspath(out)}model.pt2.")
    out = Path(out).expanduser()
    format = export_format(out, format)
    if quantize is not None and quantize not in QUANTIZATIONS:
        raise ExportError(f"unknown quantization {quantize!r}; use one of {', '.join(QUANTIZATIONS)}.")
    if quantize is not None and format != "onnx":
        raise ExportError(f"--quantize {quantize} makes ONNX files; name the file {out.with_suffix('.onnx').name}.")
    if out.is_dir():
        example = out / ("model" + FORMAT_SUFFIXES[format])
        raise ExportError(f"{out} is a folder; give the file to write, e.g. {example}.")
    if holds_model(out.parent) and owned_by_model(out.name):
        raise ExportError(f"{out} is one of the files of the model in {out.parent}, which an export must not replace; "
                          f"write it to another name, e.g. {out.parent / ('model' + FORMAT_SUFFIXES[format])}.")
    if out.exists() and not overwrite:
        raise ExportError(f"{out} exists; pass overwrite=True (--overwrite) to replace it.")
    if format == "onnx":
        missing = [name for name in ("onnx", "onnxscript", "onnxruntime") if importlib.util.find_spec(name) is None]
        if missing:
            raise ExportError(f"ONNX export needs {' and '.join(missing)}; install the onnx extra: "
                              "pip install 'hf-clusterformer[onnx]' (or --format torch).")
    return out, format


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
    program: torch.export.ExportedProgram, out: str | os.PathLike, format: str, metadata: dict[str, Any],
    quantize: str | None = None,
) -> Path:
    """Write a program from `export_program` with its `program_metadata`: a ``.pt2`` file (``format="torch"``) or an
    ONNX file, its graph optimised once by onnxruntime (constants folded: the weights stored as the products read
    them) and with ``quantize="int8"`` its matrix products' weights in int8. The file appears whole or not at all."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(f"{out.stem}.partial{out.suffix}")  # torch.export wants the .pt2 suffix
    try:
        if format == "torch":
            torch.export.save(program, str(partial), extra_files={METADATA_KEY: json.dumps(metadata)})
        else:
            _write_onnx(program, partial, metadata, quantize)
        os.replace(partial, out)
    finally:
        partial.unlink(missing_ok=True)
    return out


def _write_onnx(
    program: torch.export.ExportedProgram, out: Path, metadata: dict[str, Any], quantize: str | None
) -> None:
    """The ONNX file of `write_program`: export, optimise (onnxruntime's basic level, saved), quantise, label."""
    import onnx
    import onnxruntime

    with tempfile.TemporaryDirectory() as folder:
        exported, optimized = Path(folder) / "exported.onnx", Path(folder) / "optimized.onnx"
        torch.onnx.export(program, input_names=list(INPUT_NAMES), output_names=metadata["outputs"], dynamo=True,
                          optimize=False, opset_version=ONNX_OPSET, verbose=False).save(str(exported))
        options = onnxruntime.SessionOptions()
        options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_BASIC
        options.optimized_model_filepath = str(optimized)
        options.log_severity_level = 3
        onnxruntime.InferenceSession(str(exported), options, providers=["CPUExecutionProvider"])
        if quantize == "int8":
            from onnxruntime.quantization import QuantType, quantize_dynamic

            quantized = Path(folder) / "quantized.onnx"
            # per output channel, 7-bit weights: F1 52.0 and 53.2 against fp32's 52.8 where one scale per matrix gave
            # 49.3 (bench/export_f1.py); 7 bits keep u8 x s8 products from saturating on CPUs without VNNI
            quantize_dynamic(optimized, quantized, weight_type=QuantType.QInt8, op_types_to_quantize=["MatMul"],
                             per_channel=True, reduce_range=True)
            optimized = quantized
        graph = onnx.load(str(optimized))
        additive_attention_masks(graph)
        onnx.helper.set_model_props(graph, {METADATA_KEY: json.dumps({**metadata, "quantize": quantize})})
        onnx.save(graph, str(out))


def additive_attention_masks(model) -> int:
    """Give every ONNX ``Attention`` node with a boolean mask an additive float one (0 where allowed, the float
    minimum elsewhere), made once per mask and shared by the nodes that read it: onnxruntime's CPU attention adds a
    float mask to its scores directly and is slower with a boolean one. Returns the number of masks made.

    Args:
        model: an ``onnx.ModelProto``, changed in place (the masks' types come from ONNX type inference).
    """
    import onnx

    inferred = onnx.shape_inference.infer_shapes(model).graph
    types = {value.name: value.type.tensor_type.elem_type
             for value in [*inferred.value_info, *inferred.input, *inferred.output]}
    graph = model.graph
    converted: dict[str, str] = {}
    for node in graph.node:
        if node.op_type == "Attention" and node.domain in ("", "ai.onnx") and len(node.input) > 3 and node.input[3] \
                and types.get(node.input[3]) == onnx.TensorProto.BOOL:
            converted.setdefault(node.input[3], f"{node.input[3]}_additive")
            node.input[3] = converted[node.input[3]]
    if not converted:
        return 0
    allowed = onnx.helper.make_tensor("attention_mask_allowed", onnx.TensorProto.FLOAT, [], [0.0])
    blocked = onnx.helper.make_tensor("attention_mask_blocked", onnx.TensorProto.FLOAT, [],
                                      [float(np.finfo(np.float32).min)])
    graph.initializer.extend([allowed, blocked])
    for mask, additive in converted.items():
        where = onnx.helper.make_node(
            "Where", [mask, allowed.name, blocked.name], [additive], name=f"{additive}_where"
        )
        made = [i for i, node in enumerate(graph.node) if mask in node.output]
        graph.node.insert(made[0] + 1 if made else 0, where)  # right after the node that makes the mask
    return len(converted)


# -- running an exported file -------------------------------------------------------------------------------------


class ExportedModel:
    """An exported file ready to run: ``model(input_ids, attention_mask)`` checks the batch as the model does (one
    line per fault, `ExportError`), adds its size inputs (`program_inputs`) and returns the head's outputs by name
    as torch tensors.

    Attributes:
        config: the exported model's `ClusterFormerConfig`; architecture: its class name; input_format: how rows are
        read; input_dims: the dimensions of ``input_ids`` (`input_dims`); output_names: the outputs, in order;
        format: ``"onnx"`` or ``"torch"``; quantize: None or ``"int8"``.
    """

    def __init__(self, path: Path, format: str, metadata: dict[str, Any], run):
        self.path, self.format, self._run = path, format, run
        self.config = ClusterFormerConfig.from_dict(metadata["config"])
        self.architecture = metadata["architecture"]
        self.input_format = metadata["input_format"]
        self.output_names = list(metadata["outputs"])
        self.input_dims = tuple(metadata.get("inputs") or input_dims(self.architecture))  # files before "inputs"
        self.quantize = metadata.get("quantize")

    def __repr__(self) -> str:
        quantized = ", int8" if self.quantize else ""
        return f"ExportedModel({str(self.path)!r}, {self.architecture}, {self.format}{quantized})"

    def __call__(self, input_ids, attention_mask=None, token_type_ids=None) -> dict[str, torch.Tensor]:
        """(B, T) ids and mask ((B, C, T) for multiple choice; tensors, arrays or nested lists) -> outputs by name.
        ``token_type_ids`` (a tokenizer's) are checked, not read: the program gives the question prefix and the
        context their types itself (``pair_token_types``), as a tokenizer does for a pair; other types are refused."""
        inputs = self.check(input_ids, attention_mask, token_type_ids)
        return dict(zip(self.output_names, self._run(inputs)))

    def check(self, input_ids, attention_mask=None, token_type_ids=None) -> tuple[torch.Tensor, ...]:
        """The program's inputs for a batch (`program_inputs`), or `ExportError` naming what is wrong and the fix."""
        ids = _as_tensor(input_ids, "input_ids")
        mask = None if attention_mask is None else _as_tensor(attention_mask, "attention_mask")
        types = None if token_type_ids is None else _as_tensor(token_type_ids, "token_type_ids")
        if types is not None and types.shape != ids.shape:
            raise ExportError(f"token_type_ids must have input_ids' shape {tuple(ids.shape)}, got "
                              f"{tuple(types.shape)}; pass the tokenizer's token_type_ids or none.")
        if ids.dim() != len(self.input_dims):
            raise ExportError(f"input_ids must be ({', '.join(self.input_dims)}) for this {self.architecture}, got "
                              f"shape {tuple(ids.shape)}; pass the tokenizer's batch (return_tensors='np' or 'pt').")
        if ids.numel() == 0:
            raise ExportError(f"input_ids is empty (shape {tuple(ids.shape)}); give at least one row of tokens.")
        if mask is not None and (mask.is_floating_point() or mask.shape != ids.shape
                                 or bool(((mask != 0) & (mask != 1)).any())):
            raise ExportError(f"attention_mask must be 0s and 1s of input_ids' shape {tuple(ids.shape)}, got "
                              f"{mask.dtype} {tuple(mask.shape)}; pass the attention_mask the tokenizer returned.")
        try:
            return program_inputs(self.config, ids, mask, self.input_format, types)
        except (ValueError, TypeError) as error:  # the model's own check, in its own words
            raise ExportError(str(error)) from None


def _check_token_types(config: ClusterFormerConfig, token_type_ids: torch.Tensor, prefix: torch.Tensor,
                       lengths: torch.Tensor, starts: torch.Tensor, single: torch.Tensor) -> None:
    """(B, T) ``token_type_ids`` the types the program gives the rows' real tokens itself (0, or with
    ``pair_token_types`` 1 for the context of a pair; a row's closing separator either), else `ExportError`."""
    offset = torch.arange(token_type_ids.shape[1]) - starts.view(-1, 1)  # (B, T) position within the row's tokens
    compared = (offset >= 0) & (offset < (lengths - 1).view(-1, 1))  # real tokens but the closing separator
    context = (offset >= prefix.view(-1, 1)) & ~single.view(-1, 1) & bool(config.pair_token_types)
    wrong = compared & (token_type_ids.long() != context.long())
    if bool(wrong.any()):
        row = int(wrong.any(dim=1).nonzero()[0])
        rule = "0 for the question prefix and 1 for the context" if config.pair_token_types else "all 0"
        raise ExportError(f"token_type_ids row {row} differs from the types the exported program gives itself "
                          f"({rule}, as the tokenizer gives a pair); the program does not read token_type_ids: leave "
                          "them out (or pass the tokenizer's own), or run the eager model for other types.")


def _as_tensor(value, name: str) -> torch.Tensor:
    """A torch tensor of a tensor, array or nested list, or `ExportError`."""
    if isinstance(value, torch.Tensor):
        return value
    try:
        return torch.as_tensor(np.asarray(value))
    except (TypeError, ValueError, RuntimeError) as error:
        raise ExportError(f"{name} must be a tensor, array or list of token ids, got {type(value).__name__} "
                          f"({' '.join(str(error).split())}).") from None


def load_exported(path: str | os.PathLike, threads: int | None = None) -> ExportedModel:
    """An exported file (from `export_model` or ``clusterformer export``) ready to run on the CPU (`ExportedModel`).

    Args:
        path: an ONNX file (run with onnxruntime) or a ``.pt2`` program (`torch.export.load`).
        threads: CPU threads for onnxruntime (default: its own choice); torch programs use torch's setting.
    """
    path = Path(path)
    if not path.is_file():
        raise ExportError(f"{path} is not a file; give the file that `clusterformer export` wrote.")
    with open(path, "rb") as file:
        is_zip = file.read(4) == b"PK\x03\x04"
    return _load_torch(path) if is_zip else _load_onnx(path, threads)


def _load_torch(path: Path) -> ExportedModel:
    """The ``.pt2`` half of `load_exported`."""
    extra = {METADATA_KEY: ""}
    try:
        program = torch.export.load(str(path), extra_files=extra)
    except (RuntimeError, ValueError, KeyError, zipfile.BadZipFile, EOFError, OSError) as error:
        raise ExportError(f"{path} is not a torch.export program ({' '.join(str(error).split())[:200]}).") from None
    metadata = _read_metadata(extra[METADATA_KEY], path)
    module = program.module()

    def run(inputs):
        with torch.no_grad():
            return module(*inputs)

    return ExportedModel(path, "torch", metadata, run)


def _load_onnx(path: Path, threads: int | None) -> ExportedModel:
    """The ONNX half of `load_exported`."""
    try:
        import onnxruntime
    except ImportError:
        raise ExportError("running an ONNX file needs onnxruntime; install the onnx extra: "
                          "pip install 'hf-clusterformer[onnx]'.") from None
    options = onnxruntime.SessionOptions()
    options.log_severity_level = 3
    if threads:
        options.intra_op_num_threads = threads
    try:
        session = onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"],
                                               disabled_optimizers=UNFUSED)
    except Exception as error:  # onnxruntime raises its own exception types for files it cannot read
        raise ExportError(f"{path} is not an ONNX file onnxruntime can run ({' '.join(str(error).split())[:200]}).") \
            from None
    metadata = _read_metadata(session.get_modelmeta().custom_metadata_map.get(METADATA_KEY, ""), path)

    def run(inputs):
        feeds = {name: value.numpy() for name, value in zip(INPUT_NAMES, inputs)}
        return [torch.from_numpy(output) for output in session.run(metadata["outputs"], feeds)]

    return ExportedModel(path, "onnx", metadata, run)


def _read_metadata(text: str, path: Path) -> dict[str, Any]:
    """The `program_metadata` an exported file holds, or `ExportError` for a file from elsewhere."""
    try:
        metadata = json.loads(text)
        needed = {"config", "architecture", "input_format", "outputs"}
        if not isinstance(metadata, dict) or not needed <= set(metadata):
            raise ValueError
    except ValueError:
        raise ExportError(f"{path} holds no Cluster-Former export record; export the model again with this version "
                          "(`clusterformer export MODEL_DIR OUT`).") from None
    warn_unfitted(metadata.get("centroids_fitted") or {}, str(path))
    return metadata
