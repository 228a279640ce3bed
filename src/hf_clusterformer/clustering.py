"""Former home of the centroid-update code, kept so that existing imports work.

The K-Means engine lives in `hf_clusterformer.kmeans`, the memory banks and the updater in
`hf_clusterformer.centroid_updates`.
"""

from .centroid_updates import CentroidUpdater, CentroidUpdateSettings, MemoryBank, find_cluster_routers
from .kmeans import (
    BACKENDS,
    ClusterStats,
    KMeansResult,
    NotEnoughStatesError,
    available_backends,
    default_process_group,
    faiss_available,
    faiss_gpu_available,
    resolve_backend,
    spherical_kmeans,
)

__all__ = [
    "BACKENDS",
    "CentroidUpdateSettings",
    "CentroidUpdater",
    "ClusterStats",
    "KMeansResult",
    "MemoryBank",
    "NotEnoughStatesError",
    "available_backends",
    "default_process_group",
    "faiss_available",
    "faiss_gpu_available",
    "find_cluster_routers",
    "resolve_backend",
    "spherical_kmeans",
]
