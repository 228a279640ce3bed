"""onnxruntime (CPU) against eager torch on the same Cluster-Former, from one exported ONNX file, in one process.

The model is all-MiniLM-L6-v2 converted to Cluster-Former in memory (`hf_clusterformer.conversion.load_qa_model`: 6 layers,
d 384, windows 256/224, the default cluster layers; its QA head is new, which does not matter for timing), exported
once (`hf_clusterformer.export.export_model`, traced at 512 tokens) and run at every ``--lengths`` entry on one
question + long context, batch 1. Both run on ``--threads`` CPU threads (torch.set_num_threads and onnxruntime's
intra-op threads). Timing: one warm-up call each, then ``--repeats`` rounds of one call each, alternating which goes
first; printed: median seconds, min/max, the ratio eager / onnxruntime of the medians, and the largest difference of
the start logits. ``--json FILE`` writes the rows.

Usage: ``python bench/bench_export.py [--lengths 2048 8192] [--repeats 5] [--threads 1] [--json FILE]``.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from hf_clusterformer.export import export_model
from hf_clusterformer.conversion import load_qa_model
from hf_clusterformer.hub import quiet_loading
from hf_clusterformer.pretrained import fetch_pretrained


def pair(config, length: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """One ``[CLS] Q [SEP] C [SEP]`` row of ``length`` random word ids (a 20-token question)."""
    words = torch.randint(1000, config.vocab_size, (length,), generator=generator)
    sep = config.separator_token_id
    ids = torch.cat([torch.tensor([config.bos_token_id]), words[:20], torch.tensor([sep]), words[20 : length - 23],
                     torch.tensor([sep])])
    ids = ids[:length]
    return ids.view(1, -1), torch.ones(1, ids.numel(), dtype=torch.long)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[2048, 8192])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    import onnxruntime as ort

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    with quiet_loading():
        model = load_qa_model(fetch_pretrained("all-MiniLM-L6-v2"), max_context_length=max(args.lengths)).eval()
    config = model.config
    for router in model.cluster_routers().values():
        router.fitted.fill_(True)  # random centroids: the timing is the same, without the never-fitted warning
    with tempfile.TemporaryDirectory() as folder:
        start = time.perf_counter()
        onnx_file = export_model(model, Path(folder) / "model.onnx", allow_untrained=True, length=512)
        export_seconds = time.perf_counter() - start
        options = ort.SessionOptions()
        options.intra_op_num_threads = args.threads
        options.inter_op_num_threads = 1
        options.log_severity_level = 3
        session = ort.InferenceSession(str(onnx_file), options, providers=["CPUExecutionProvider"])
    print(f"exported in {export_seconds:.1f} s; {platform.processor() or platform.machine()}, {args.threads} thread(s), "
          f"torch {torch.__version__}, onnxruntime {ort.__version__}")
    rows = []
    generator = torch.Generator().manual_seed(0)
    for length in args.lengths:
        ids, mask = pair(config, length, generator)
        feeds = {"input_ids": ids.numpy(), "attention_mask": mask.numpy()}

        def eager():
            with torch.no_grad():
                return model(input_ids=ids, attention_mask=mask).start_logits.numpy()

        def onnx():
            return session.run(None, feeds)[0]

        difference = float(np.abs(eager() - onnx()).max())  # also the warm-up
        times = {"eager": [], "onnxruntime": []}
        for round_ in range(args.repeats):
            for name, call in (("eager", eager), ("onnxruntime", onnx))[:: 1 if round_ % 2 == 0 else -1]:
                start = time.perf_counter()
                call()
                times[name].append(time.perf_counter() - start)
        medians = {name: statistics.median(values) for name, values in times.items()}
        row = {"tokens": int(ids.shape[1]), "eager_s": medians["eager"], "onnxruntime_s": medians["onnxruntime"],
               "ratio_eager_over_onnxruntime": medians["eager"] / medians["onnxruntime"],
               "max_abs_difference": difference, "rounds": times}
        rows.append(row)
        print(f"{row['tokens']:>6} tokens  eager {medians['eager']:.3f} s ({min(times['eager']):.3f}-"
              f"{max(times['eager']):.3f})  onnxruntime {medians['onnxruntime']:.3f} s "
              f"({min(times['onnxruntime']):.3f}-{max(times['onnxruntime']):.3f})  eager/onnxruntime "
              f"{row['ratio_eager_over_onnxruntime']:.2f}x  max |diff| {difference:.1e}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"threads": args.threads, "repeats": args.repeats,
                                               "export_seconds": export_seconds, "torch": torch.__version__,
                                               "onnxruntime": ort.__version__, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
