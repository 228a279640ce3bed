"""Cluster-Former: clustering-based sparse Transformer for long-context question answering.

Importing the package registers the config and models with the transformers Auto classes.
"""

from transformers import (
    AutoConfig,
    AutoModel,
    AutoModelForMaskedLM,
    AutoModelForMultipleChoice,
    AutoModelForQuestionAnswering,
    AutoModelForSequenceClassification,
    AutoModelForTokenClassification,
)

from .configuration_clusterformer import ClusterFormerConfig, default_cluster_layers, suggested_num_clusters
from .modeling_clusterformer import (
    ClusterFormerForMaskedLM,
    ClusterFormerForMultipleChoice,
    ClusterFormerForQuestionAnswering,
    ClusterFormerForSequenceClassification,
    ClusterFormerForTokenClassification,
    ClusterFormerModel,
    ClusterFormerPreTrainedModel,
    ClusterRouter,
    LSHRouter,
    order_centroids_greedy,
)
from .pipeline import ClusterFormerQuestionAnsweringPipeline, pipeline, register_pipeline

__version__ = "0.1.0"

AutoConfig.register("clusterformer", ClusterFormerConfig, exist_ok=True)
AutoModel.register(ClusterFormerConfig, ClusterFormerModel, exist_ok=True)
AutoModelForQuestionAnswering.register(ClusterFormerConfig, ClusterFormerForQuestionAnswering, exist_ok=True)
AutoModelForMaskedLM.register(ClusterFormerConfig, ClusterFormerForMaskedLM, exist_ok=True)
AutoModelForSequenceClassification.register(ClusterFormerConfig, ClusterFormerForSequenceClassification, exist_ok=True)
AutoModelForTokenClassification.register(ClusterFormerConfig, ClusterFormerForTokenClassification, exist_ok=True)
AutoModelForMultipleChoice.register(ClusterFormerConfig, ClusterFormerForMultipleChoice, exist_ok=True)
register_pipeline()  # transformers.pipeline("question-answering", ...) uses the long-context pipeline

# Training-only parts (Trainer callback, K-Means backends) load on first use, so that inference never
# imports them.
_LAZY = {
    "CentroidUpdateCallback": "callback",
    "CentroidUpdateSettings": "centroid_updates",
    "CentroidUpdater": "centroid_updates",
    "MemoryBank": "centroid_updates",
    "spherical_kmeans": "kmeans",
    "inspect_clusters": "inspection",
}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    *_LAZY,
    "ClusterFormerQuestionAnsweringPipeline",
    "pipeline",
    "register_pipeline",
    "ClusterFormerConfig",
    "ClusterFormerForMaskedLM",
    "ClusterFormerForMultipleChoice",
    "ClusterFormerForQuestionAnswering",
    "ClusterFormerForSequenceClassification",
    "ClusterFormerForTokenClassification",
    "ClusterFormerModel",
    "ClusterFormerPreTrainedModel",
    "ClusterRouter",
    "LSHRouter",
    "default_cluster_layers",
    "order_centroids_greedy",
    "suggested_num_clusters",
]
