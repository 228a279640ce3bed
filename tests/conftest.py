"""Test configuration: the local Hub server and olah fixtures live in tests/support/hub_fixtures.py."""

import os

import pytest
import torch

# Every process a test starts runs its tiny models on one thread too: two test processes share two cores.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

pytest_plugins = ["support.hub_fixtures"]


def pytest_configure(config):
    """The marks of transformers' common model tests (tests/test_transformers_common.py runs them)."""
    marks = ("accelerate_tests", "flash_attn_test", "flash_attn_3_test", "flash_attn_4_test", "slow", "torch_compile_test")
    for mark in marks:
        config.addinivalue_line("markers", f"{mark}: a mark of transformers' common model tests")


@pytest.fixture(autouse=True, scope="session")
def _one_thread():
    """Tiny models run fastest on one thread (torch and faiss), and the suite stays fast on a busy 2-core machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        import faiss
    except ImportError:
        faiss = None
    faiss_threads = faiss.omp_get_max_threads() if faiss is not None else None
    if faiss is not None:
        faiss.omp_set_num_threads(1)
    yield
    torch.set_num_threads(threads)
    if faiss is not None:
        faiss.omp_set_num_threads(faiss_threads)
