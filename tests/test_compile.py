"""torch.compile of the model: one graph break (the per-example lengths read back to size the windows), the encoder
in one full graph, and compiled outputs equal to eager ones."""

import pytest
import torch
from helpers import pad_batch, random_example, tiny_config

from hf_clusterformer import ClusterFormerForQuestionAnswering, ClusterFormerModel
from hf_clusterformer.modeling_clusterformer import build_window_layout, count_routed_chunks, count_windows

#: A layer of every kind after a sliding one.
ALL_KINDS = dict(num_hidden_layers=5, cluster_layers=[1, 2, 3, 4],
                 global_layer_type=["cluster", "lsh", "sparse", "window_cluster"])
#: The paper's kinds, for counting the whole model's graphs (that the encoder with every kind is one graph is the last
#: test's, which traces faster).
PAPER_KINDS = dict(num_hidden_layers=4, cluster_layers=[1, 2, 3], global_layer_type=["cluster", "lsh", "sparse"])


@pytest.fixture(scope="module")
def inductor():
    """Skip when inductor cannot build CPU kernels (no C++ compiler); reset dynamo's caches around the module."""
    torch._dynamo.reset()
    try:
        torch.compile(lambda x: x * 2 + 1, backend="inductor")(torch.ones(3))
    except Exception as error:  # noqa: BLE001 - any failure to build means no inductor on this machine
        pytest.skip(f"inductor cannot compile on this machine: {type(error).__name__}: {error}"[:200])
    yield
    torch._dynamo.reset()


def batch():
    generator = torch.Generator().manual_seed(0)
    return pad_batch([random_example(generator, 4, 50), random_example(generator, 6, 31)])


def test_one_graph_break_where_the_lengths_are_read_back():
    """The number of windows K, the prefix width S - l and the routed chunk count C are sizes that depend on the
    data (separator positions and padding), so `locate_rows` reads the per-example lengths back to the host once
    (`Tensor.tolist`, which also validates the batch): the only graph break. Everything after it is one graph.
    Dynamo counts that break once per frame on the stack: the model's forward and `_layout_batch` (and the head's
    forward under the QA head)."""
    torch._dynamo.reset()
    config = tiny_config(**PAPER_KINDS)
    ids, mask = batch()
    models = ((ClusterFormerModel(config).eval(), 2), (ClusterFormerForQuestionAnswering(config).eval(), 3))
    for model, breaks in models:
        with torch.no_grad():
            explained = torch._dynamo.explain(model)(ids, attention_mask=mask)
        assert len(explained.break_reasons) == 1, [reason.reason for reason in explained.break_reasons]
        assert explained.break_reasons[0].user_stack[-1].name == "locate_rows"
        assert (explained.graph_break_count, explained.graph_count) == (breaks, breaks + 1)
        torch._dynamo.reset()


def test_compiled_model_equals_eager(inductor):
    """Inductor's CPU kernels for a sliding and a cluster layer (the other types are traced in the next test)."""
    torch.manual_seed(0)
    model = ClusterFormerModel(tiny_config(num_hidden_layers=2, cluster_layers=[1])).eval()
    for router in model.cluster_routers().values():
        router.fitted.fill_(True)  # no never-fitted warning: nothing to report from the compiled forward
    ids, mask = batch()
    with torch.no_grad():
        eager = model(ids, attention_mask=mask)
        compiled = torch.compile(model)(ids, attention_mask=mask)
    torch.testing.assert_close(compiled.last_hidden_state, eager.last_hidden_state, atol=1e-5, rtol=0)
    torch.testing.assert_close(compiled.pooler_output, eager.pooler_output, atol=1e-5, rtol=0)


def test_encoder_compiles_as_one_full_graph():
    """Past the lengths, the encoder (every layer type, the overlap merges, routing, sort and unsort) is one graph.

    Traced through AOT autograd (functionalised, as inductor gets it) without code generation, which the test above
    already covers, to stay fast."""
    torch.manual_seed(0)
    config = tiny_config(**ALL_KINDS)
    model = ClusterFormerModel(config).eval()
    ids, mask = batch()
    prefixes, totals = [10, 12], mask.sum(1).tolist()
    num_windows = max(count_windows(t - p, config.window_size, config.window_stride) for p, t in zip(prefixes, totals))
    layout = build_window_layout(torch.tensor(prefixes), mask.sum(1), config.window_size, config.window_stride,
                                 num_windows, max(prefixes))
    chunks = count_routed_chunks(prefixes, totals, config.window_size, config.window_stride)
    states = torch.randn(*layout.token_index.shape, config.hidden_size)
    with torch.no_grad():
        eager = model.encoder(states, layout, ids.shape[1], routed_chunks=chunks).last_hidden_state
        compiled = torch.compile(model.encoder, fullgraph=True, backend="aot_eager")(
            states, layout, ids.shape[1], routed_chunks=chunks
        )
    torch.testing.assert_close(compiled.last_hidden_state, eager, atol=1e-5, rtol=0)
