"""Cluster-Former: clustering-based sparse Transformer for long-context question answering.

Importing the package registers the ``clusterformer`` config and models with the transformers Auto classes, and
changes nothing else in transformers. The long-context ``question-answering`` pipeline is registered only on request:
`register_pipeline` puts it under ``transformers.pipeline("question-answering", ...)`` for the rest of the process
(the docstring of the ``loading`` module says what that changes), and ``hf_clusterformer.pipeline(model=...)``
registers it and builds one. ``hf_clusterformer.pipeline`` is the module of the QA pipeline, callable as the function
`hf_clusterformer.loading.pipeline` (transformers' ``pipeline`` is a function beside its ``pipelines`` package; here
the one name serves both).

Training-only parts (the `Trainer` callback, the centroid updater), conversion and the Hub functions load on first
use, so that inference never imports them.
"""

import sys as _sys
import typing as _typing

from .configuration_clusterformer import ClusterFormerConfig
from .loading import register_pipeline
from .modeling_clusterformer import (
    ClusterFormerForMaskedLM,
    ClusterFormerForMultipleChoice,
    ClusterFormerForQuestionAnswering,
    ClusterFormerForSequenceClassification,
    ClusterFormerForTokenClassification,
    ClusterFormerModel,
    ClusterFormerPreTrainedModel,
)
from .pipeline import ClusterFormerQuestionAnsweringPipeline

if _typing.TYPE_CHECKING:  # type checkers see the function; at run time the name is the module, callable as it
    from .loading import pipeline

__version__ = "0.1.0"


def register_auto_classes() -> None:
    """Register the config with ``AutoConfig``, the base model with ``AutoModel`` and every head of
    `hf_clusterformer_heads.HEADS` with its Auto class (done on import; again after a row is added)."""
    import transformers  # the module now in sys.modules: importing transformers.processing_utils replaces the first

    import hf_clusterformer_heads

    from . import modeling_clusterformer

    transformers.AutoConfig.register("clusterformer", ClusterFormerConfig, exist_ok=True)
    transformers.AutoModel.register(ClusterFormerConfig, ClusterFormerModel, exist_ok=True)
    for head in hf_clusterformer_heads.HEADS:
        model_class = getattr(modeling_clusterformer, head.class_name)
        getattr(transformers, head.auto_class).register(ClusterFormerConfig, model_class, exist_ok=True)


def _make_pipeline_module_callable() -> None:
    """The submodule ``hf_clusterformer.pipeline`` callable as `hf_clusterformer.loading.pipeline`, so that the name
    hides neither: ``hf_clusterformer.pipeline(model=...)`` builds a pipeline,
    ``hf_clusterformer.pipeline.PASSAGE_TOKEN`` and ``import hf_clusterformer.pipeline`` reach the module."""
    import inspect
    import sys
    import types

    from .loading import pipeline as build

    class PipelineModule(types.ModuleType):
        __call__ = staticmethod(build)
        __signature__ = inspect.signature(build)

    sys.modules[f"{__name__}.pipeline"].__class__ = PipelineModule


register_auto_classes()
_make_pipeline_module_callable()

#: Names loaded on first use, by module: the training parts, cluster inspection, conversion and the Hub functions
#: (and helpers kept importable from here, outside `__all__`).
_LAZY = {
    "CentroidUpdateCallback": "callback",
    "CentroidUpdateSettings": "centroid_updates",
    "CentroidUpdater": "centroid_updates",
    "inspect_clusters": "inspection",
    "convert_checkpoint": "conversion",
    "load_qa_model": "conversion",
    "suggested_num_clusters": "conversion",
    "push_model": "hub",
    "save_for_hub": "hub",
    "prepare_for_hub": "hub",
    "default_cluster_layers": "configuration_clusterformer",
}


def __getattr__(name: str):
    if name in _LAZY:
        from importlib import import_module

        return getattr(import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    """What users call (`__all__`), the package's modules loaded so far and the module's own dunder names."""
    modules = [name for name, value in globals().items() if _sys.modules.get(f"{__name__}.{name}") is value]
    return sorted({*__all__, *modules, *(name for name in globals() if name.startswith("__"))})


__all__ = [
    "ClusterFormerConfig",
    "ClusterFormerForMaskedLM",
    "ClusterFormerForMultipleChoice",
    "ClusterFormerForQuestionAnswering",
    "ClusterFormerForSequenceClassification",
    "ClusterFormerForTokenClassification",
    "ClusterFormerModel",
    "ClusterFormerPreTrainedModel",
    "ClusterFormerQuestionAnsweringPipeline",
    "pipeline",
    "register_pipeline",
    "suggested_num_clusters",
    "CentroidUpdateCallback",
    "CentroidUpdateSettings",
    "CentroidUpdater",
    "inspect_clusters",
    "convert_checkpoint",
    "load_qa_model",
    "push_model",
    "save_for_hub",
]
