"""What the tests of self-contained checkpoints share (tests/test_remote_code.py, test_heads.py, test_tasks.py, and
helpers.without_package for test_folder_writes.py and test_without_the_package.py): a tiny text world, an address
where nothing listens, and the preamble of a child Python in which ``hf_clusterformer`` cannot be imported."""

SENTENCES = [
    "Zorvan lives with Melka in the old house by the river.",
    "Melka lives in Tarsk, a town known for its bridge.",
    "The market was quiet that morning and the road was wet.",
    "Where does Zorvan live? Who lives in Tarsk?",
]
OFFLINE = "http://127.0.0.1:9"  # nothing listens there; local loads never need it

#: The start of a child process's script: ``import hf_clusterformer`` (and of its top-level modules) fails there,
#: checked first.
HIDE_PACKAGE = """
import importlib.abc, sys

class _HidePlugin(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0].startswith("hf_clusterformer"):  # the package and its top-level modules
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, _HidePlugin())
try:
    import hf_clusterformer
except ModuleNotFoundError:
    pass
else:
    raise SystemExit("hf_clusterformer is still importable")
"""
