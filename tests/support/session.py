"""What every test process shares, in both test folders (tests/ and research/tests/, whose conftest.py files import
it): one thread, the longest files first, the marks of transformers' common model tests."""

import os

import pytest
import torch

# Every process a test starts runs its tiny models on one thread too: two test processes share two cores.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

#: Test files by the seconds their tests took (two test processes, 2026-11-29), longest first: `make test` hands whole
#: files to its two processes in collection order (``--dist loadfile --no-loadscope-reorder``), so the long files start
#: first and the short ones fill in at the end, instead of one long file running alone at the end. Order only; a
#: file not listed runs after these, in its usual order. Names of files in either folder (tests/, research/tests/):
#: the order is the same whichever conftest.py sorts, and sorting twice (both folders in one run) keeps it.
LONGEST_FIRST = (
    "test_folder_writes.py", "test_experiment.py", "test_export_heads.py", "test_realtext.py", "test_run_mlm.py",
    "test_cli.py", "test_export.py", "test_readme.py", "test_one_line_refusals.py", "test_without_the_package.py",
    "test_compile.py", "test_demo.py", "test_transformers_common.py", "test_hub_server.py", "test_layer_types.py",
    "test_encoder_reference.py", "test_untrained_heads.py", "test_broken_weights.py", "test_run_qa.py",
    "test_remote_code.py", "test_tasks.py", "test_distributed.py",
)


def pytest_collection_modifyitems(config, items):
    """Files in `LONGEST_FIRST` order (the tests of a file keep theirs)."""
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))


def pytest_configure(config):
    """The marks of transformers' common model tests (tests/test_transformers_common.py runs them)."""
    marks = ("accelerate_tests", "flash_attn_test", "flash_attn_3_test", "flash_attn_4_test", "slow",
             "torch_compile_test")
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
