"""Loading a checkpoint for inference: the checks of a checkpoint source (a directory or Hub id, failing fast in one
line), the check that its config holds a model of the task, and `pipeline`, which builds a pipeline from it.

Registration is explicit: transformers 5 removed its ``question-answering`` pipeline (``REMOVED_TASKS``);
`register_pipeline` takes the name off that list and registers
`hf_clusterformer.pipeline.ClusterFormerQuestionAnsweringPipeline` under it for the whole process. `pipeline`
(``hf_clusterformer.pipeline(model=..., task=...)``) builds a pipeline of any head, registering the QA one first.

A package module, not copied into Hub checkpoints.
"""

from __future__ import annotations

import os
import re
import socket
from typing import Any

import torch
import transformers.pipelines as hf_pipelines
from transformers import AutoModelForQuestionAnswering, Pipeline
from transformers.pipelines import PIPELINE_REGISTRY

import hf_clusterformer_heads
from hf_clusterformer_files import TOKENIZER_FILES, TOKENIZER_READS, library_files
from hf_clusterformer_heads import find_head
from hf_clusterformer_sources import check_local_source

from .configuration_clusterformer import ConfigValueError
from .modeling_clusterformer import check_finite_outputs, check_trained, mark_untrained
from .pipeline import TASK, ClusterFormerQuestionAnsweringPipeline, use_model_limit


def hub_unreachable() -> str | None:
    """Why the Hub endpoint cannot be reached (``HF_HUB_OFFLINE``, or one quick connection without retries that
    fails), or ``None`` when it can (or a proxy decides)."""
    from urllib.parse import urlsplit

    from transformers.utils.hub import constants  # huggingface_hub's, as transformers reads them

    if constants.HF_HUB_OFFLINE:
        return "HF_HUB_OFFLINE is set"
    if any(os.environ.get(name) for name in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY")):
        return None
    url = urlsplit(constants.ENDPOINT)
    try:
        socket.create_connection((url.hostname, url.port or (443 if url.scheme == "https" else 80)), timeout=5).close()
    except OSError as error:
        return f"{constants.ENDPOINT} cannot be reached ({error.strerror or error})"
    return None


def check_checkpoint_source(source: Any, what: str = "checkpoint") -> str:
    """``source`` (a checkpoint directory or Hub id) as a string, after failing fast in one line on what cannot load:
    what `hf_clusterformer_sources.check_local_source` refuses (a file, a folder without ``config.json``, a missing
    path that looks local; no Hub request), and `OSError` for a Hub id not in the local cache while `hub_unreachable`
    (instead of the Hub client's retries)."""
    path = check_local_source(source, what)
    if os.path.isdir(path):
        return path
    from transformers.utils.hub import try_to_load_from_cache

    reason = hub_unreachable()
    if reason and not isinstance(try_to_load_from_cache(path, "config.json"), str):
        raise OSError(
            f"{what} {path} is not a local directory, and the Hub is out of reach: {reason}; "
            "give an existing directory."
        )
    return path


def unreadable_weights(path: str | os.PathLike, error: Exception) -> str:
    """One line for a checkpoint whose weights did not load (``error``): the safetensors file of ``path`` that cannot
    be read and the fix, or the error."""
    from pathlib import Path

    from safetensors import SafetensorError, safe_open

    for file in sorted(Path(path).glob("*.safetensors")) if os.path.isdir(path) else []:
        try:
            with safe_open(str(file), framework="pt") as weights:
                weights.keys()
        except SafetensorError as bad:
            return f"{file} is not a readable safetensors file ({bad}); save or download the checkpoint again."
    return f"could not read the weights of {path}: {error}"


def load_tokenizer(path: str | os.PathLike, **kwargs: Any) -> Any:
    """``AutoTokenizer.from_pretrained(path)``; one that does not load is said in one line (`ValueError`) naming the
    files of the user's that it read beside the model's own (a stray ``added_tokens.json``) and the fix."""
    from transformers import AutoTokenizer

    if os.path.isdir(path) and not any(os.path.isfile(os.path.join(path, name)) for name in TOKENIZER_FILES):
        raise ValueError(f"no tokenizer files in {path} (such as tokenizer.json); save the tokenizer into it with "
                         "tokenizer.save_pretrained, or write the checkpoint with `clusterformer convert`.")
    try:
        return AutoTokenizer.from_pretrained(path, **kwargs)
    except Exception as error:  # a damaged tokenizer file raises whatever its parser meets (TypeError, KeyError, ...)
        record = library_files(path) if os.path.isdir(path) else {}
        theirs = [n for n in TOKENIZER_READS if record and n not in record and os.path.isfile(os.path.join(path, n))]
        cause = " ".join(f"{type(error).__name__}: {error}".split())[:300]
        verb = "is" if len(theirs) == 1 else "are"
        suspects = f"; {', '.join(theirs)} in it {verb} not the model's own" if theirs else ""
        raise ValueError(f"the tokenizer of {path} does not load ({cause}){suspects}; move a stray file away, or save "
                         "the tokenizer again (tokenizer.save_pretrained) or write the checkpoint again "
                         "(`clusterformer convert`).") from error


def check_tokenizer_fits(tokenizer: Any, config: Any, source: str) -> None:
    """The tokenizer of ``source`` encodes for the model of ``config``: its ids within the vocabulary, its separator
    the one that ends the model's question prefix, its pair token types within the model's; else one line."""
    fix = "use the tokenizer saved with the model (the one in its folder), or convert the model with this tokenizer"
    if len(tokenizer) > config.vocab_size:
        raise ValueError(f"the tokenizer of {source} has {len(tokenizer)} tokens, more than the model's vocabulary of "
                         f"{config.vocab_size}; {fix}.")
    separator = tokenizer.sep_token_id
    if separator is not None and separator != config.separator_token_id:
        raise ValueError(f"the tokenizer of {source} ends the question with id {separator} ({tokenizer.sep_token}), "
                         f"but the model's question prefix ends at id {config.separator_token_id}; {fix}.")
    types = tokenizer("a", "b").get("token_type_ids") or [0]
    if max(types) >= config.type_vocab_size:
        raise ValueError(f"the tokenizer of {source} marks the context with token type {max(types)}, but the model "
                         f"has {config.type_vocab_size} token type(s); {fix}.")


def non_finite_tensors(path: str | os.PathLike) -> list[str]:
    """The tensors of a checkpoint directory's safetensors files that hold a NaN or inf (empty when all are finite),
    read without building the model (what a card or a push of the folder checks)."""
    from pathlib import Path

    from safetensors import safe_open

    broken = []
    for file in sorted(Path(path).glob("*.safetensors")) if os.path.isdir(path) else []:
        with safe_open(str(file), framework="pt") as weights:
            for key in weights.keys():
                tensor = weights.get_tensor(key)
                if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
                    broken.append(key)
    return broken


def check_finite_file(path: str | os.PathLike, what: str) -> None:
    """Raise `ValueError` in one line when the weights of checkpoint directory ``path`` hold NaN or inf
    (`non_finite_tensors`); ``what`` names the refused act (``"a card"``)."""
    broken = non_finite_tensors(path)
    if broken:
        more = ", ..." if len(broken) > 3 else ""
        raise ValueError(f"{path} holds weights that are NaN or inf ({len(broken)} tensors: {', '.join(broken[:3])}"
                         f"{more}), so {what} would share a broken model; use an earlier checkpoint, or train again "
                         "(with a lower learning rate if it diverged).")


def register_pipeline() -> None:
    """Register the pipeline as transformers' ``question-answering`` task for the rest of the process (idempotent),
    taking the name off ``transformers.pipelines.REMOVED_TASKS``. Importing the package does not call this."""
    getattr(hf_pipelines, "REMOVED_TASKS", {}).pop(TASK, None)  # transformers >= 5.2x lists removed tasks
    current = PIPELINE_REGISTRY.supported_tasks.get(TASK, {}).get("impl")
    if current is not ClusterFormerQuestionAnsweringPipeline:
        same_name = getattr(current, "__name__", None) == ClusterFormerQuestionAnsweringPipeline.__name__
        if current is not None and same_name:
            PIPELINE_REGISTRY.supported_tasks.pop(TASK)  # another copy of pipeline.py (e.g. loaded as Hub code)
        PIPELINE_REGISTRY.register_pipeline(
            TASK,
            pipeline_class=ClusterFormerQuestionAnsweringPipeline,
            pt_model=AutoModelForQuestionAnswering,
            type="text",
        )


class _WholeText:
    """Mixin for transformers' pipelines of the other heads: the model's limit (`use_model_limit`), its weights
    checked (`check_trained`) and its outputs too (`check_finite_outputs`), a longer text refused with the numbers
    instead of cut."""

    def __init__(self, *args, allow_untrained: bool = False, **kwargs):
        super().__init__(*args, **kwargs)
        check_trained(self.model, allow_untrained, head=self.task or "new")
        use_model_limit(self.tokenizer, self.model.config)

    def _forward(self, model_inputs, *args, **kwargs):
        outputs = super()._forward(model_inputs, *args, **kwargs)
        values = outputs.values() if hasattr(outputs, "values") else ()
        check_finite_outputs(self.model, *[v for v in values if isinstance(v, torch.Tensor) and v.is_floating_point()])
        return outputs

    def preprocess(self, inputs, *args, **kwargs):
        if isinstance(inputs, str) and self.tokenizer is not None:
            count, limit = len(self.tokenizer(inputs, verbose=False)["input_ids"]), self.tokenizer.model_max_length
            if count > limit:
                raise ValueError(f"the text has {count} tokens, more than this model reads ({limit}); the pipeline "
                                 "does not cut texts: shorten it, or use a model with a larger max_context_length.")
        return super().preprocess(inputs, *args, **kwargs)


def pipeline(*args: Any, **kwargs: Any) -> Pipeline:
    """``transformers.pipeline(task, ...)`` over whole inputs up to the model's limit (`use_model_limit`), no remote
    code needed: `ClusterFormerQuestionAnsweringPipeline` (registered first), or transformers' ``fill-mask``,
    ``text-classification`` or ``token-classification`` one, which refuses a longer text with the numbers instead of
    cutting it.

    Called as ``pipeline(model=..., tokenizer=None, task="question-answering")`` (positionally in that order) or,
    as transformers' is, with the task first: ``pipeline("fill-mask", model=...)``. ``model``: a model, a checkpoint
    directory or a Hub id; another head's folder, an untrained head (``allow_untrained=True`` for smoke tests) and
    NaN/inf weights are refused in one line. Other arguments go to ``transformers.pipeline``."""
    from transformers import pipeline as make_pipeline

    model, tokenizer, task = _pipeline_arguments(args, kwargs)
    task = hf_pipelines.TASK_ALIASES.get(task, task)
    task = getattr(find_head(task), "task", task)  # a head's key (qa, mlm, ...) as its pipeline task
    if task == TASK:
        register_pipeline()
    elif task not in _whole_text_tasks():
        raise ValueError(f"task must be one of {[TASK, *_whole_text_tasks()]}, got {task!r}.")
    if model is None:
        raise ValueError("pipeline() needs model=: a loaded model, a checkpoint folder or a Hub id (this package has "
                         "no default model).")
    if task == TASK:
        impl = ClusterFormerQuestionAnsweringPipeline
    else:
        impl = getattr(hf_pipelines, find_head(task).pipeline_class)
    kwargs.setdefault(
        "pipeline_class", impl if task == TASK else type(impl.__name__, (_WholeText, impl), {"__module__": __name__})
    )
    if isinstance(model, (str, bytes)) or hasattr(model, "__fspath__"):
        model, tokenizer = _load_for_pipeline(model, tokenizer, kwargs, task)
    return make_pipeline(task, model=model, tokenizer=tokenizer, **kwargs)


def _pipeline_arguments(args: tuple, kwargs: dict[str, Any]) -> tuple[Any, Any, str]:
    """``(model, tokenizer, task)`` of `pipeline`'s call (taken out of ``kwargs``): positional ones in the order
    ``model, tokenizer, task``, or ``task, model, tokenizer`` when the first names a task and no folder."""
    first = args[0] if args else None
    names = ["model", "tokenizer", "task"]
    if isinstance(first, str) and not os.path.exists(first) and (
            first in hf_pipelines.TASK_ALIASES or first == TASK or find_head(first) is not None):
        names = ["task", "model", "tokenizer"]
    if len(args) > len(names):
        raise TypeError(f"pipeline() takes at most 3 positional arguments ({', '.join(names)}), got {len(args)}.")
    for name, value in zip(names, args):
        if name in kwargs:
            raise TypeError(f"pipeline() got {name} twice: {value!r} as a positional argument and {name}=; give it "
                            "once.")
        kwargs[name] = value
    model, tokenizer, task = kwargs.pop("model", None), kwargs.pop("tokenizer", None), kwargs.pop("task", TASK)
    return model, tokenizer, task


def _whole_text_tasks() -> list[str]:
    """The tasks of the other heads that a transformers pipeline serves over whole texts (`Head.pipeline_class`)."""
    return [head.task for head in hf_clusterformer_heads.HEADS if head.pipeline_class]


def check_question_answering_config(config: dict, source: Any, task: str = TASK) -> None:
    """Raise `ValueError` in one line when the ``config.json`` values ``config`` of checkpoint ``source`` hold no
    ``task`` model: another model type (GPT-2, BERT), or a Cluster-Former model of another head (new and random)."""
    kind, heads = config.get("model_type"), config.get("architectures") or []
    wanted = find_head(task).class_name
    if kind not in (None, "clusterformer", "roberta"):
        raise ValueError(f"{source} is a {kind!r} checkpoint, not a Cluster-Former one; give a Cluster-Former "
                         f"{'QA ' if task == TASK else ''}checkpoint (a RoBERTa or BERT-family one converted by "
                         f"`clusterformer convert SRC OUT{'' if task == TASK else ' --task ' + task}`).")
    other = [h for h in heads if str(h).startswith("ClusterFormerFor") and not h.endswith(wanted)]
    if other and len(other) == len(heads):
        head = other[0].removeprefix("ClusterFormerFor")
        spelt = re.sub(r"(?<!^)(?=[A-Z])", "-", head).lower()
        own = {"MaskedLM": "fill-mask", "QuestionAnswering": TASK}.get(head, spelt)
        what = "masked-LM" if head == "MaskedLM" else own
        fix = (f"load it with transformers.AutoModelFor{head}, or fine-tune a QA model from it with `clusterformer "
               f"train --model_name_or_path {source} --train_file ...`" if task == TASK else
               f"use it with task={own!r}, or fine-tune a {task} model from it")
        raise ValueError(f"{source} holds a {what} model ({other[0]}), not a {task} one, so it has no {task} head "
                         f"to {'answer' if task == TASK else 'run'} with: {fix}.")


def _load_for_pipeline(path: Any, tokenizer: Any, kwargs: dict, task: str = TASK) -> tuple[Any, Any]:
    """The ``task`` model of a checkpoint, its weights that the checkpoint lacks marked as untrained; one that cannot
    be found fails at once (`check_checkpoint_source`), one with no ``task`` model in one line."""
    from transformers import PretrainedConfig

    path = check_checkpoint_source(path, "model")
    hub = {name: kwargs[name] for name in ("revision", "token", "trust_remote_code") if name in kwargs}
    check_question_answering_config(PretrainedConfig.get_config_dict(path, **{
        k: v for k, v in hub.items() if k != "trust_remote_code"})[0], path, task)
    options = {**hub, **dict(kwargs.pop("model_kwargs", None) or {})}
    if "dtype" in kwargs:
        options["dtype"] = kwargs.pop("dtype")
    auto = hf_pipelines.SUPPORTED_TASKS[task]["pt"][0] if task != TASK else AutoModelForQuestionAnswering
    try:
        model, info = auto.from_pretrained(path, output_loading_info=True, **options)
    except ConfigValueError as error:  # a value of its config.json that the config does not take
        raise error.at(path) from None
    mark_untrained(model, [key for key in info["missing_keys"] if ".router." not in key])
    return model, tokenizer if tokenizer is not None else load_tokenizer(path, **hub)


__all__ = [
    "pipeline",
    "register_pipeline",
]
