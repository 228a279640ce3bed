"""transformers' common model tests (``ModelTesterMixin``) on the base model and every head.

Each class gets its own test case (``pytest -k MultipleChoice`` runs one). The config's two layers are a window_cluster
and a cluster layer (`GLOBAL_LAYERS`); the inputs are right-padded pair encodings that span several windows; the
mixin prepares them for each head as for transformers' own heads of that kind (`KIND`): (B, C, T) for multiple choice,
and each head's labels. Tests that cannot apply to a windowed model are listed in `NOT_APPLICABLE` with the reason
(they report as skipped, with it); the rest pass. The mixin comes from transformers' source distribution
(`support.transformers_common`: ``make common-tests``); without it this module is skipped, saying how to get it.
"""

from __future__ import annotations

import logging
import os
import sys
import tempfile
import unittest
import unittest.mock

import pytest
import torch
from helpers import BOS, SEP, pad_batch, random_example, tiny_config
from support.transformers_common import load_model_tester_mixin
from transformers.models.auto import modeling_auto

from hf_clusterformer import (
    ClusterFormerConfig,
    ClusterFormerForMaskedLM,
    ClusterFormerForMultipleChoice,
    ClusterFormerForQuestionAnswering,
    ClusterFormerForSequenceClassification,
    ClusterFormerForTokenClassification,
    ClusterFormerModel,
)

ModelTesterMixin, _WHY = load_model_tester_mixin()
if ModelTesterMixin is None:
    pytest.skip(_WHY, allow_module_level=True)

#: Rows of the batch: (question, context) lengths; the longest spans four windows of 16 slots, 12 apart. Seven rows, as
#: many as the sdpa/eager comparison runs, so that it adds no rows of random ids of its own.
ROWS = [(3, 38), (6, 20), (2, 9), (8, 30), (1, 4), (5, 13), (4, 25)]
#: The encoder's layers by index: a window_cluster layer (its window attention is the sliding layer's), whose output a
#: cluster layer routes.
GLOBAL_LAYERS = {0: "window_cluster", 1: "cluster"}


#: Common tests that cannot apply to a windowed model, for every class, and why.
NOT_APPLICABLE = {
    "test_attention_outputs": "attention weights come per window (or routed chunk) of the layer's own layout, "
                              "(windows, heads, slots, slots), not (batch, heads, length, length); "
                              "tests/test_model.py checks their shapes",
    "test_retain_grad_hidden_states_attentions": (
        "the encoder runs on windows: the token-aligned hidden states it returns are means over window copies made "
        "for the output, not tensors the next layer reads, so no gradient reaches them"
    ),
}


#: The name mapping of transformers' Auto classes (model type -> class name) that the mixin reads a class's kind from
#: (which inputs and labels it takes, which tests apply): `ClusterFormerCommonTests` lists each class there.
KIND = {
    ClusterFormerModel: "MODEL_MAPPING_NAMES",
    ClusterFormerForQuestionAnswering: "MODEL_FOR_QUESTION_ANSWERING_MAPPING_NAMES",
    ClusterFormerForMaskedLM: "MODEL_FOR_MASKED_LM_MAPPING_NAMES",
    ClusterFormerForSequenceClassification: "MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES",
    ClusterFormerForTokenClassification: "MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES",
    ClusterFormerForMultipleChoice: "MODEL_FOR_MULTIPLE_CHOICE_MAPPING_NAMES",
}


class ClusterFormerModelTester:
    """What the mixin asks of a model tester: sizes, a config and one batch of inputs."""

    batch_size = len(ROWS)
    seq_length = max(question + context for question, context in ROWS) + 4  # <s> Q </s></s> C </s>
    num_hidden_layers = 2  # the mixin's test_num_layers_is_small allows no more
    hidden_size = 32
    num_attention_heads = 2
    vocab_size = 100
    num_choices = 2
    is_training = True

    def __init__(self, parent):
        self.parent = parent

    def get_config(self):
        """A window_cluster layer, then a cluster layer (`GLOBAL_LAYERS`)."""
        return tiny_config(num_hidden_layers=self.num_hidden_layers, cluster_layers=list(GLOBAL_LAYERS),
                           global_layer_type=list(GLOBAL_LAYERS.values()))

    def prepare_config_and_inputs_for_common(self):
        ids, mask = pad_batch([random_example(torch.Generator().manual_seed(row), *lengths)
                               for row, lengths in enumerate(ROWS)])
        return self.get_config(), {"input_ids": ids, "attention_mask": mask}


class ClusterFormerCommonTests(ModelTesterMixin):
    """The mixin's tests for one class (`all_model_classes`); subclasses below pick it."""

    all_model_classes = ()
    test_resize_embeddings = True
    test_torch_exportable = False  # export has its own tests (tests/test_export.py), with the export bounds
    test_can_init_all_missing_weights_before_2023 = True  # the mixin runs it for models from 2023 on

    @classmethod
    def setUpClass(cls):
        """List the class in transformers' name mapping of its kind (`KIND`) while its tests run: the mixin reads the
        kind from there (the Auto classes' registration, at run time, does not reach those tables)."""
        super().setUpClass()
        (model_class,) = cls.all_model_classes
        cls._kind = unittest.mock.patch.dict(getattr(modeling_auto, KIND[model_class]),
                                             {ClusterFormerConfig.model_type: model_class.__name__})
        cls._kind.start()

    @classmethod
    def tearDownClass(cls):
        cls._kind.stop()
        # warnings said once per process (output_attentions under sdpa, ...) are said again for the tests after these
        for once in (logging.Logger.warning_once, logging.Logger.info_once):
            once.cache_clear()
        super().tearDownClass()

    def setUp(self):
        self.model_tester = ClusterFormerModelTester(self)

    def test_load_with_mismatched_shapes(self):
        """The mixin's test, whose last call gives the base model random ids (ids below 10, no attention mask): a
        windowed model refuses a row with the pad id inside it or no separator, so those ids are pair encodings of
        random tokens here (`_pair_ids`)."""
        with unittest.mock.patch.object(sys.modules[ModelTesterMixin.__module__], "ids_tensor", _pair_ids):
            super().test_load_with_mismatched_shapes()

    def test_torch_save_load(self):
        """The mixin's check (state dict through torch.save, both serialisations, and transformers' load_state_dict),
        with bool buffers (the routers' ``fitted`` flags) compared as such: the mixin's version fails on them (it calls
        the state dict, a dict, to compare bool tensors)."""
        from transformers.modeling_utils import load_state_dict

        config, _ = self.model_tester.prepare_config_and_inputs_for_common()
        for model_class in self.all_model_classes:
            state_dict = model_class(config).state_dict()
            assert any(tensor.dtype == torch.bool for tensor in state_dict.values())
            with tempfile.TemporaryDirectory() as folder:
                path = os.path.join(folder, "pytorch_model.bin")
                for zipfile in (True, False):
                    torch.save(state_dict, path, _use_new_zipfile_serialization=zipfile)
                    loaded = load_state_dict(path)
                    assert loaded.keys() == state_dict.keys()
                    for key, tensor in state_dict.items():
                        assert torch.equal(loaded[key], tensor), key


def _pair_ids(shape, vocab_size, rng=None, name=None):
    """(B, T) pair encodings ``<s> q </s></s> c... </s>`` of random ordinary tokens (ids from 4 up to ``vocab_size``),
    in place of the mixin's ``ids_tensor``."""
    batch, length = shape
    ids = torch.randint(4, vocab_size, (batch, length))
    ids[:, [0, 2, 3, length - 1]] = torch.tensor([BOS, SEP, SEP, SEP])
    return ids


def _not_applicable(reason: str):
    @unittest.skip(f"not applicable to a windowed model: {reason}")
    def test(self):
        pass

    return test


def _test_case(model_class):
    name = f"{model_class.__name__}CommonTest"
    attributes = {"all_model_classes": (model_class,), "__module__": __name__}
    attributes.update({test: _not_applicable(reason) for test, reason in NOT_APPLICABLE.items()})
    return type(name, (ClusterFormerCommonTests, unittest.TestCase), attributes)


ClusterFormerModelCommonTest = _test_case(ClusterFormerModel)
ClusterFormerForQuestionAnsweringCommonTest = _test_case(ClusterFormerForQuestionAnswering)
ClusterFormerForMaskedLMCommonTest = _test_case(ClusterFormerForMaskedLM)
ClusterFormerForSequenceClassificationCommonTest = _test_case(ClusterFormerForSequenceClassification)
ClusterFormerForTokenClassificationCommonTest = _test_case(ClusterFormerForTokenClassification)
ClusterFormerForMultipleChoiceCommonTest = _test_case(ClusterFormerForMultipleChoice)
