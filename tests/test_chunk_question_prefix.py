"""``chunk_question_prefix`` (beyond the paper, off by default): every routed chunk gets its example's question
prefix in front. Checked against a plain reference of the layer, for padding/batch invariance, and that the
default layer is unchanged by the option's existence."""

from __future__ import annotations

import pytest
import torch
from helpers import pad_batch, random_example, tiny_config

from hf_clusterformer import ClusterFormerModel
from hf_clusterformer.modeling_clusterformer import ClusterFormerEncoder


def _examples(lengths=((3, 40), (5, 70), (2, 25))):
    generator = torch.Generator().manual_seed(3)
    return [random_example(generator, q, c) for q, c in lengths]


def _model(**overrides) -> ClusterFormerModel:
    torch.manual_seed(0)
    return ClusterFormerModel(tiny_config(chunk_question_prefix=True, **overrides)).eval()


def test_default_is_the_paper_layer():
    assert tiny_config().chunk_question_prefix is False


@pytest.mark.parametrize("kind", ["cluster", "lsh"])
def test_every_example_equals_running_it_alone(kind):
    model = _model(global_layer_type=kind)
    examples = _examples()
    ids, mask = pad_batch(examples)
    with torch.no_grad():
        batched = model(input_ids=ids, attention_mask=mask).last_hidden_state
        for row, example in enumerate(examples):
            alone = model(input_ids=torch.tensor([example])).last_hidden_state[0]
            torch.testing.assert_close(batched[row, : len(example)], alone, atol=1e-5, rtol=1e-5)


def _reference_prefixed_layer(encoder: ClusterFormerEncoder, index: int, states, layout, length):
    """One example at a time, by loops: route owner copies, sort stably, chunk, prefix, attend, put back."""
    router = encoder.routers[str(index)]
    layer = encoder.layer[index]
    m = encoder.config.window_stride
    width = states.shape[2] - encoder.config.window_size
    out_states = states.clone()
    for b in range(states.shape[0]):
        prefix_slots = layout.valid[b, :, :width] & ~layout.is_context[b, :, :width]  # (K, P)
        q_len = int(prefix_slots.any(0).sum())
        prefix = torch.stack([states[b, k, :q_len] for k in range(states.shape[1]) if prefix_slots[k].any()]).mean(0)
        owners = [(int(layout.token_index[b, k, s]), k, s)
                  for k in range(states.shape[1]) for s in range(states.shape[2]) if layout.owner[b, k, s]]
        owners.sort()
        vectors = torch.stack([states[b, k, s] for _, k, s in owners])
        unit = torch.nn.functional.normalize(vectors, dim=-1)
        if hasattr(router, "centroids"):
            ids = (unit @ torch.nn.functional.normalize(router.centroids, dim=-1).T).argmax(-1)
        else:
            rotated = vectors @ router.hash_vectors
            ids = torch.cat([rotated, -rotated], -1).argmax(-1)
        order = sorted(range(len(owners)), key=lambda i: (int(ids[i]), owners[i][0]))
        token_out = {}
        prefix_outs = []
        for begin in range(0, len(order), m):
            members = order[begin: begin + m]
            chunk = torch.cat([prefix, vectors[members]]).unsqueeze(0)
            out = layer(chunk, None)[0][0]
            prefix_outs.append(out[:q_len])
            for j, i in enumerate(members):
                token_out[owners[i][0]] = out[q_len + j]
        prefix_mean = torch.stack(prefix_outs).mean(0)
        for k in range(states.shape[1]):
            for s in range(states.shape[2]):
                if layout.is_context[b, k, s]:
                    out_states[b, k, s] = token_out[int(layout.token_index[b, k, s])]
                elif layout.valid[b, k, s] and s < q_len:
                    out_states[b, k, s] = prefix_mean[s]
    return out_states


def test_layer_matches_a_plain_reference():
    model = _model(num_clusters=4)
    encoder = model.encoder
    index = model.config.global_layers[0]
    examples = _examples()
    ids, mask = pad_batch(examples)
    states = {}
    layer = encoder.layer[index]
    original = layer.forward_windows

    def spy(s, masks, length):
        states["in"], states["layout"], states["length"] = s.clone(), masks.layout, length
        result = original(s, masks, length)
        states["out"] = result[0]
        return result

    layer.forward_windows = spy
    with torch.no_grad():
        model(input_ids=ids, attention_mask=mask)
        expected = _reference_prefixed_layer(encoder, index, states["in"], states["layout"], states["length"])
    layout = states["layout"]
    valid = layout.valid.unsqueeze(-1)
    torch.testing.assert_close(states["out"] * valid, expected * valid, atol=1e-5, rtol=1e-5)
