"""Single-text inputs ``<s> T </s>``: only ``<s>`` is every window's prefix, so one window equals RoBERTa; padding and
batch invariance; the one input-format rule (`hf_clusterformer.modeling_clusterformer.single_text_rows`)."""

from __future__ import annotations

import pytest
import torch
from helpers import open_routed_paths, pad_batch, random_example, roberta_twin, single_text, tiny_config
from transformers import RobertaModel

from hf_clusterformer import ClusterFormerForQuestionAnswering, ClusterFormerModel

ALL_KINDS = dict(num_hidden_layers=5, cluster_layers=[1, 2, 3, 4],
                 global_layer_type=["cluster", "lsh", "sparse", "window_cluster"])


def left_pad(examples: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded (B, T) input_ids and attention_mask."""
    ids, mask = pad_batch([e[::-1] for e in examples])
    return ids.flip(1), mask.flip(1)




@pytest.mark.parametrize("implementation", ["sdpa", "eager"])
def test_single_text_in_one_window_equals_roberta(implementation):
    config = tiny_config(cluster_layers=[])
    config._attn_implementation = implementation
    torch.manual_seed(0)
    ours = ClusterFormerModel(config).eval()
    twin = roberta_twin(config)
    twin._attn_implementation = implementation
    roberta = RobertaModel(twin).eval()
    roberta.load_state_dict(ours.state_dict())
    generator = torch.Generator().manual_seed(1)
    ids, mask = pad_batch([single_text(generator, 7), single_text(generator, 14)])
    with torch.no_grad():
        a, b = ours(ids, attention_mask=mask), roberta(ids, attention_mask=mask)
    real = mask.bool()
    torch.testing.assert_close(a.last_hidden_state[real], b.last_hidden_state[real], atol=1e-5, rtol=0)
    torch.testing.assert_close(a.pooler_output, b.pooler_output, atol=1e-5, rtol=0)


def test_single_text_windows_have_only_bos_as_prefix():
    """With l = m every token lies in one window ``<s> T[m k : m k + l]``: it equals RoBERTa on that window alone."""
    config = tiny_config(cluster_layers=[], window_size=12, window_stride=12)
    torch.manual_seed(0)
    ours = ClusterFormerModel(config).eval()
    roberta = RobertaModel(roberta_twin(config)).eval()
    roberta.load_state_dict(ours.state_dict())
    ids = torch.tensor([single_text(torch.Generator().manual_seed(2), 40)])  # 41 text tokens with </s>: 4 windows
    with torch.no_grad():
        out = ours(ids).last_hidden_state[0]
        for start in range(1, ids.shape[1], 12):
            alone = roberta(torch.cat([ids[:, :1], ids[:, start : start + 12]], 1)).last_hidden_state[0]
            torch.testing.assert_close(out[start : start + 12], alone[1:], atol=1e-5, rtol=0)


@pytest.mark.parametrize("kinds", [dict(cluster_layers=[2]), ALL_KINDS], ids=["cluster", "all-kinds"])
def test_single_texts_are_batch_and_padding_invariant(kinds):
    torch.manual_seed(0)
    model = ClusterFormerModel(tiny_config(**kinds)).eval()
    open_routed_paths(model)
    generator = torch.Generator().manual_seed(4)
    examples = [single_text(generator, n) for n in (70, 9, 33, 1)]
    ids, mask = pad_batch(examples)
    left_ids, left_mask = left_pad(examples)
    noisy = ids.clone()
    noisy[~mask.bool()] = torch.randint(4, 100, (int((~mask.bool()).sum()),), generator=generator)
    with torch.no_grad():
        batched = model(ids, attention_mask=mask).last_hidden_state
        left = model(left_ids, attention_mask=left_mask).last_hidden_state
        torch.testing.assert_close(model(noisy, attention_mask=mask).last_hidden_state, batched, atol=0, rtol=0)
        for row, example in enumerate(examples):
            alone = model(torch.tensor([example])).last_hidden_state[0]
            n = len(example)
            torch.testing.assert_close(batched[row, :n], alone, atol=1e-5, rtol=0)
            torch.testing.assert_close(left[row, left.shape[1] - n :], alone, atol=1e-5, rtol=0)


def test_input_format_rule():
    """``auto`` reads ``<s> T </s>`` (and a row without separators) as one text and ``<s> Q </s></s> C </s>`` as a
    pair, row by row; ``pair`` and ``single`` force one reading; QA keeps the pair contract."""
    torch.manual_seed(0)
    model = ClusterFormerModel(tiny_config()).eval()
    generator = torch.Generator().manual_seed(5)
    pair, single = random_example(generator, 3, 40), single_text(generator, 50)
    ids, mask = pad_batch([pair, single])
    with torch.no_grad():
        mixed = model(ids, attention_mask=mask).last_hidden_state
        as_pair = model(torch.tensor([pair]), input_format="pair").last_hidden_state[0]
        as_single = model(torch.tensor([single]), input_format="single").last_hidden_state[0]
        pair_as_single = model(torch.tensor([pair]), input_format="single").last_hidden_state[0]
        bare = torch.tensor([single[1:-1]])  # no special tokens at all: one text whose first token is the prefix
        torch.testing.assert_close(model(bare).last_hidden_state, model(bare, input_format="single").last_hidden_state)
    torch.testing.assert_close(mixed[0, : len(pair)], as_pair, atol=1e-5, rtol=0)
    torch.testing.assert_close(mixed[1, : len(single)], as_single, atol=1e-5, rtol=0)
    assert not torch.allclose(pair_as_single, as_pair, atol=1e-3)  # the question is no longer every window's prefix

    qa = ClusterFormerForQuestionAnswering(tiny_config()).eval()
    with pytest.raises(ValueError, match="one text|the question of row 0"):  # read as a pair: refused
        qa(torch.tensor([single]))
    with pytest.raises(ValueError, match="input_format must be one of"):
        model(torch.tensor([single]), input_format="text")


def test_bert_style_token_types_are_zero_for_a_single_text():
    """With ``pair_token_types`` (BERT-family checkpoints) a pair's context gets type 1 and a single text type 0."""
    config = tiny_config(cluster_layers=[], pair_token_types=True, type_vocab_size=2)
    torch.manual_seed(0)
    ours = ClusterFormerModel(config).eval()
    roberta = RobertaModel(roberta_twin(config)).eval()
    roberta.load_state_dict(ours.state_dict())
    generator = torch.Generator().manual_seed(6)
    single, pair = torch.tensor([single_text(generator, 12)]), torch.tensor([random_example(generator, 3, 9)])
    pair_types = torch.zeros_like(pair)
    pair_types[:, 6:] = 1
    with torch.no_grad():
        torch.testing.assert_close(
            ours(single).last_hidden_state, roberta(single).last_hidden_state, atol=1e-5, rtol=0
        )
        torch.testing.assert_close(
            ours(pair).last_hidden_state, roberta(pair, token_type_ids=pair_types).last_hidden_state, atol=1e-5, rtol=0
        )
