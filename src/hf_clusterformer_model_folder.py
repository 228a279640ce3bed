"""The one writer of a Cluster-Former model folder (`write_model_folder`): weights, config with ``auto_map``
(`model_auto_map`), the code files, the custom pipeline (`CUSTOM_PIPELINE`), tokenizer, card and modes.

A top-level module with no imports beyond the standard library and the ground floor's file modules
(`hf_clusterformer_files`, `hf_clusterformer_writing`), on the bottom floor (see ARCHITECTURE.md): it works on the
model it is given, and imports neither torch nor ``hf_clusterformer``.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hf_clusterformer_files import (
    CODE_FILES,
    TOKENIZER_FILES,
    apply_default_modes,
    check_own_files,
    file_sha256,
    output_folder,
    stamp_card,
    tokenizer_strays,
)
from hf_clusterformer_writing import set_aside, write_file, writing_model_dir

__all__ = ["model_auto_map", "write_model_folder"]

#: The ``custom_pipelines`` entry of a question-answering checkpoint: the task mapped to its copy of ``pipeline.py``.
CUSTOM_PIPELINE = {
    "question-answering": {
        "impl": "pipeline.ClusterFormerQuestionAnsweringPipeline",
        "pt": ["AutoModelForQuestionAnswering"],
        "type": "text",
    }
}


def _modeling_module(model: Any) -> Any:
    """The modeling module ``model``'s class comes from (the package's, or a Hub checkpoint's own copy)."""
    for cls in type(model).__mro__:
        if cls.__module__.rsplit(".", 1)[-1] == "modeling_clusterformer":
            return sys.modules[cls.__module__]
    raise ValueError(f"{type(model).__name__} is no Cluster-Former model; only those are written as model folders.")


def model_auto_map(model: Any) -> dict[str, str]:
    """The ``auto_map`` of ``model``'s checkpoint: the config, the base model and, for a head, every head (each
    loadable from it as transformers loads a RoBERTa checkpoint into another head), as the modeling file registers
    its classes for the Auto classes when it is imported."""
    module = _modeling_module(model)
    auto_map = {"AutoConfig": f"configuration_clusterformer.{type(model.config).__name__}"}
    head = getattr(type(model), "_auto_class", None) not in (None, "AutoModel")
    for cls in vars(module).values():
        auto = vars(cls).get("_auto_class") if isinstance(cls, type) and cls.__module__ == module.__name__ else None
        if isinstance(auto, str) and (head or auto == "AutoModel"):
            auto_map[auto] = f"modeling_clusterformer.{cls.__name__}"
    return auto_map


def apply_auto_map(model: Any) -> None:
    """Set ``model.config.auto_map`` to `model_auto_map` (over entries of its own), as every saved folder has it."""
    model.config.auto_map = {**(getattr(model.config, "auto_map", None) or {}), **model_auto_map(model)}


def _base_save_pretrained(model: Any) -> Any:
    """transformers' own ``save_pretrained`` of ``model`` (below the Cluster-Former override, which calls the
    writer)."""
    for cls in type(model).__mro__:
        if cls.__module__.startswith("transformers.") and "save_pretrained" in vars(cls):
            return vars(cls)["save_pretrained"]
    raise TypeError(f"{type(model).__name__} is no transformers model.")


def _names_code(entry: Any) -> bool:
    """Whether a ``custom_pipelines`` entry names a class of the checkpoint's own ``pipeline.py``."""
    return isinstance(entry, dict) and str(entry.get("impl", "")).startswith("pipeline.")


def _set_config_field(config: Any, name: str, value: Any) -> None:
    if value is not None:
        setattr(config, name, value)
    elif name in vars(config):
        delattr(config, name)


def _code_files(model: Any) -> list[Path]:
    """The code files a folder of ``model`` gets (`CODE_FILES`; ``pipeline.py`` for a question-answering model whose
    modeling file has it beside it), where they are copied from."""
    code = Path(_modeling_module(model).__file__).parent
    # a QA checkpoint maps the task to its copy of pipeline.py (when at hand); no other keeps an entry naming it
    question_answering = type(model).__name__.endswith("ForQuestionAnswering") and (code / CODE_FILES[2]).is_file()
    return [code / name for name in (CODE_FILES if question_answering else CODE_FILES[:2])]


def _check_in_place(folder: Path, code: Sequence[Path], tokenizer: bool, overwrite: bool, option: str) -> None:
    """Before a write into ``folder`` as it is (``save_pretrained``): `ModelFolderExistsError` for a code file there
    that the library did not write and that differs from the one to be copied (a file of the user's), or with a
    ``tokenizer``, for a tokenizer file of the user's, unless ``overwrite`` (then those the new tokenizer does not
    write are set aside); its config and weights are transformers' to replace."""
    folder = output_folder(folder)
    if not folder.is_dir():
        return
    same = {path.name for path in code if (folder / path.name).is_file() and not (folder / path.name).is_symlink()
            and file_sha256(folder / path.name) == file_sha256(path)}
    names = [path.name for path in code if path.name not in same] + list(TOKENIZER_FILES[:2] if tokenizer else ())
    check_own_files(folder, names, overwrite, option)
    if tokenizer:
        set_aside(folder, tokenizer_strays(folder, names))


def _write_model_files(model: Any, folder: Path, tokenizer: Any, card: Any, verify: Any, save_args: tuple,
                       save_options: dict) -> None:
    """`write_model_folder`'s files, written into ``folder`` as it is."""
    folder.mkdir(parents=True, exist_ok=True)
    config, code = model.config, _code_files(model)
    question_answering = len(code) == len(CODE_FILES)
    apply_auto_map(model)
    previous = getattr(config, "custom_pipelines", None)
    pipelines = {task: entry for task, entry in (previous or {}).items() if not _names_code(entry)}
    if question_answering:
        pipelines.update(json.loads(json.dumps(CUSTOM_PIPELINE)))
    _set_config_field(config, "custom_pipelines", pipelines or None)
    try:
        _base_save_pretrained(model)(model, folder, *save_args, **save_options)
    finally:  # written into this folder only: a later push of the model itself goes through here again
        _set_config_field(config, "custom_pipelines", previous)
    if not save_options.get("is_main_process", True):
        return
    for path in code:  # each recorded as the library's (a symlink there is replaced, never written through)
        write_file(output_folder(folder) / path.name, path.read_bytes(), overwrite=True, own=True)
    apply_default_modes(folder)
    if tokenizer is not None:
        tokenizer.save_pretrained(folder)
    if card is not None:  # a call makes it once the weights and config are written
        (folder / "README.md").write_text(stamp_card(str(card() if callable(card) else card)), encoding="utf-8")
    if verify is not None:
        verify(folder)


def write_model_folder(
    model: Any, path: str | os.PathLike, tokenizer: Any = None, card: Any = None, *, overwrite: bool = False,
    option: str = "overwrite=True", in_place: bool = False, verify: Any = None, save_args: tuple = (),
    check: bool = True, **save_options: Any,
) -> Path:
    """The one writer of a Cluster-Former model folder: every way of saving one ends here (``model.save_pretrained``
    and so the Trainer's checkpoints, the pipeline's ``save_pretrained``, `hf_clusterformer.hub.save_for_hub`,
    conversion, a training run's final save).

    Writes the weights and ``config.json`` (transformers' ``save_pretrained``, ``save_args`` / ``save_options``
    passed on) with `model_auto_map` as ``auto_map`` and, for a question-answering model, `CUSTOM_PIPELINE` as
    ``custom_pipelines``; the code files (`CODE_FILES`, ``pipeline.py`` only for question answering) copied from the
    model's own modeling file's folder; weight files with the usual mode; ``tokenizer`` when given; ``card`` (text,
    or a call returning it) as a stamped ``README.md`` when given. ``verify(folder)`` may raise before the files are
    put in place.

    A model with NaN or inf weights is refused (`ValueError`) before anything is written. The folder is written by
    `writing_model_dir` (its refusals; ``overwrite``, ``option``), or, ``in_place``, into ``path`` as it is (what
    transformers' ``save_pretrained`` does; code and tokenizer files of the user's refused, unless ``check`` is false:
    a folder being written already).
    """
    try:  # NaN or inf weights are never written (a Hub copy from before the check has none)
        getattr(_modeling_module(model), "check_finite", lambda model: None)(model)
    except ValueError as error:
        raise ValueError(f"nothing was written to {path}: {error}") from None
    if in_place:
        if check and save_options.get("is_main_process", True):  # unchecked: a folder this write owns (a run's)
            _check_in_place(Path(path), _code_files(model), tokenizer is not None, overwrite, option)
        _write_model_files(model, Path(path), tokenizer, card, verify, save_args, save_options)
        return Path(path)
    with writing_model_dir(path, overwrite, option) as staging:
        _write_model_files(model, staging, tokenizer, card, verify, save_args, save_options)
    return Path(path)
