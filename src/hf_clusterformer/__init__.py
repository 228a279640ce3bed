"""Cluster-Former: clustering-based sparse Transformer for long-context question answering.

Importing the package registers the config and models with the transformers Auto classes.
"""

from transformers import AutoConfig, AutoModel, AutoModelForQuestionAnswering

from .configuration_clusterformer import ClusterFormerConfig, default_cluster_layers
from .modeling_clusterformer import (
    ClusterFormerForQuestionAnswering,
    ClusterFormerModel,
    ClusterFormerPreTrainedModel,
    ClusterRouter,
    LSHRouter,
    order_centroids_greedy,
)

__version__ = "0.1.0"

AutoConfig.register("clusterformer", ClusterFormerConfig, exist_ok=True)
AutoModel.register(ClusterFormerConfig, ClusterFormerModel, exist_ok=True)
AutoModelForQuestionAnswering.register(ClusterFormerConfig, ClusterFormerForQuestionAnswering, exist_ok=True)

__all__ = [
    "ClusterFormerConfig",
    "ClusterFormerForQuestionAnswering",
    "ClusterFormerModel",
    "ClusterFormerPreTrainedModel",
    "ClusterRouter",
    "LSHRouter",
    "default_cluster_layers",
    "order_centroids_greedy",
]
