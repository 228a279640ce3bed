"""Cluster-Former: clustering-based sparse Transformer for long-context question answering.

Importing the package registers the ``clusterformer`` config and models with the transformers Auto classes, and
changes nothing else in transformers. The long-context ``question-answering`` pipeline is registered only on request:
`register_pipeline` puts it under ``transformers.pipeline("question-answering", ...)`` for the rest of the process
(the docstring of the ``loading`` module says what that changes), and the function `pipeline`
(``hf_clusterformer.pipeline(model=...)``) registers it and builds one.

Training-only parts (the `Trainer` callback, the centroid updater) and the Hub functions load on first use, so that
inference never imports them.
"""

import importlib

from transformers import AutoConfig, AutoModel

import hf_clusterformer_heads

from .configuration_clusterformer import ClusterFormerConfig, default_cluster_layers, suggested_num_clusters
from . import modeling_clusterformer
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
from .loading import pipeline, register_pipeline  # after .pipeline: the name is the function

__version__ = "0.1.0"



def register_auto_classes() -> None:
    """Register the config with ``AutoConfig``, the base model with ``AutoModel`` and every head of
    `hf_clusterformer_heads.HEADS` with its Auto class (done on import; again after a row is added)."""
    AutoConfig.register("clusterformer", ClusterFormerConfig, exist_ok=True)
    AutoModel.register(ClusterFormerConfig, ClusterFormerModel, exist_ok=True)
    # the module now in sys.modules: importing `transformers.processing_utils` replaces the one first imported
    transformers = importlib.import_module("transformers")
    for head in hf_clusterformer_heads.HEADS:
        model_class = getattr(modeling_clusterformer, head.class_name)
        getattr(transformers, head.auto_class).register(ClusterFormerConfig, model_class, exist_ok=True)


register_auto_classes()

#: Names loaded on first use: the training parts, cluster inspection and the Hub functions.
_LAZY = {
    "CentroidUpdateCallback": "callback",
    "CentroidUpdateSettings": "centroid_updates",
    "CentroidUpdater": "centroid_updates",
    "inspect_clusters": "inspection",
    "convert_checkpoint": "conversion",
    "load_qa_model": "conversion",
    "prepare_for_hub": "hub",
    "push_model": "hub",
    "save_for_hub": "hub",
}


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


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
    "default_cluster_layers",
    "suggested_num_clusters",
    "pipeline",
    "register_auto_classes",
    "register_pipeline",
    *_LAZY,
]
