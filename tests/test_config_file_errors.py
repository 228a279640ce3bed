"""A ``config.json`` holding a value the config does not take (a wrongly typed value, an unknown layer kind, a value
out of range, an activation or dtype transformers does not know) is refused in one line naming the file and the fix:
by every command that reads a checkpoint (exit status 2) and by the Python API, instead of a validation traceback."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from helpers import CONTEXT, QUESTION, SMALL, sentence_tokenizer, tiny_roberta
from transformers import AutoConfig, RobertaForQuestionAnswering

import hf_clusterformer
from hf_clusterformer import ClusterFormerConfig, ClusterFormerForQuestionAnswering
from hf_clusterformer.configuration_clusterformer import ConfigValueError
from hf_clusterformer_cli import main

#: Edits of a converted model's config.json, each with the words its one line must hold.
BAD_VALUES = {
    "typed": ({"hidden_size": "32"}, ("hidden_size", '"32"', "an integer")),
    "kind": ({"layer_kinds": ["sliding", "bogus"]}, ("layer_kinds", '"bogus"', '"window_cluster"')),
    "range": ({"window_stride": 0}, ("window_stride", "0 < window_stride")),
    "activation": ({"hidden_act": "bogus"}, ("hidden_act", "gelu")),
    "dtype": ({"dtype": "float99"}, ("dtype", "float32")),
    "derived": ({"global_layers": [1]}, ("global_layers", "derived", "cluster_layers")),
    "misspelt": ({"windows_size": 8}, ("windows_size", "did you mean window_size?")),
}


@pytest.fixture(scope="module")
def converted(tmp_path_factory) -> Path:
    work = tmp_path_factory.mktemp("config-errors")
    roberta = tiny_roberta(work / "roberta", sentence_tokenizer(), RobertaForQuestionAnswering)
    assert main(["convert", str(roberta), str(work / "converted"), *SMALL]) == 0
    (work / "context.txt").write_text(CONTEXT, encoding="utf-8")
    return work / "converted"


def _broken(converted: Path, tmp_path: Path, edit: dict) -> Path:
    folder = tmp_path / "bad"
    shutil.copytree(converted, folder)
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    (folder / "config.json").write_text(json.dumps({**config, **edit}, indent=1), encoding="utf-8")
    return folder


@pytest.mark.parametrize("case", BAD_VALUES)
def test_every_command_refuses_a_bad_config_value_in_one_line(converted, tmp_path, capsys, case):
    """Row: ``"hidden_size": "32"`` (or an unknown layer kind) gave a StrictDataclassFieldValidationError traceback
    and exit status 1 in predict, convert, export, card and inspect."""
    edit, words = BAD_VALUES[case]
    folder = _broken(converted, tmp_path, edit)
    context = str(converted.parent / "context.txt")
    commands = {
        "predict": ["predict", str(folder), "--question", QUESTION, "--context-file", context],
        "inspect": ["inspect", str(folder), "--question", QUESTION, "--context-file", context],
        "convert": ["convert", str(folder), str(tmp_path / "out")],
        "export": ["export", str(folder), str(tmp_path / "model.pt2")],
        "card": ["card", str(folder), "--out", str(tmp_path / "card.md")],
        "push": ["push", str(folder), "user/model"],
    }
    for name, argv in commands.items():
        capsys.readouterr()
        assert main(argv) == 2, name
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("clusterformer: error: "), (name, lines)
        assert "config.json" in lines[0] and all(word in lines[0] for word in words), (name, lines[0])
        assert str(folder) in lines[0], (name, lines[0])
    assert not (tmp_path / "out").exists() and not (tmp_path / "model.pt2").exists()


def test_the_python_api_names_the_file_and_an_override_its_argument(converted, tmp_path):
    folder = _broken(converted, tmp_path, {"hidden_size": "32"})
    for load in (ClusterFormerForQuestionAnswering.from_pretrained, ClusterFormerConfig.from_pretrained,
                 lambda path: hf_clusterformer.pipeline(model=path)):
        with pytest.raises(ConfigValueError, match=f'^{folder}/config.json: hidden_size is "32", but it takes an '
                                                   "integer; correct it there.$"):
            load(folder)
    with pytest.raises(ConfigValueError, match='^config.json: hidden_size is "32"'):  # transformers' own reader
        AutoConfig.from_pretrained(folder)
    with pytest.raises(ValueError, match=r"^num_clusters='8' was given, but num_clusters takes an integer\.$"):
        ClusterFormerForQuestionAnswering.from_pretrained(converted, num_clusters="8")


def test_a_derived_property_or_a_misspelt_option_given_as_an_argument_is_one_line(converted):
    """Row: ``ClusterFormerConfig(global_layers=[1])`` (a read-only property) printed the whole config and raised
    ``AttributeError: property 'global_layers' ... has no setter``; ``num_cluster=4`` was stored and never read (the
    model kept 64 clusters), and ``from_pretrained(..., num_cluster=4)`` was a TypeError from the model's init."""
    with pytest.raises(ValueError, match=r"^global_layers is derived from the other fields, not set; give "
                                         r"cluster_layers \(their indices\) or layer_kinds"):
        ClusterFormerConfig(num_hidden_layers=2, global_layers=[1])
    with pytest.raises(ValueError, match="^max_input_length is derived from the other fields, not set; leave it out"):
        ClusterFormerConfig(max_input_length=600)
    for load in (ClusterFormerConfig, lambda **kw: ClusterFormerForQuestionAnswering.from_pretrained(converted, **kw)):
        for typo, meant in (("num_cluster", "num_clusters"), ("cluster_layer", "cluster_layers"),
                            ("routed_by", "route_by"), ("windows_size", "window_size")):
            with pytest.raises(ValueError, match=f"^{typo} is no Cluster-Former option; did you mean {meant}\\?$"):
                load(**{typo: 1})
    assert ClusterFormerConfig(num_hidden_layers=4, cluster_layers=[1]).global_layers == [1]
    assert ClusterFormerConfig(custom_note="kept").custom_note == "kept"  # other extra values stay transformers'
