"""Eager torch against the exported ONNX file, fp32 and int8, on the same Cluster-Former, in one process (CPU).

The model is all-MiniLM-L6-v2 converted to Cluster-Former in memory (`hf_clusterformer.conversion.load_qa_model`: 6
layers, d 384, windows 256/224, the default cluster layers; its QA head is new, which does not matter for timing),
exported once per kind (`hf_clusterformer.export.export_model`, traced at 512 tokens; ``int8``: ``quantize="int8"``)
and run through `hf_clusterformer.export.load_exported` (which checks each batch, as eager code does) at every
``--lengths`` entry on one question + long context, batch 1. Everything runs on ``--threads`` CPU threads
(torch.set_num_threads and onnxruntime's intra-op threads). Timing: one warm-up call each, then ``--repeats`` rounds
of one call each, the order rotating every round; printed: median seconds, min/max, the speed of each exported kind
as a ratio to eager (eager seconds / its seconds, > 1 is faster), and the largest difference of its start logits
from eager's. With ``--torch-program`` the ``.pt2`` program is written and loaded once and its load time printed.
``--json FILE`` writes the rows.

Usage: ``python bench/bench_export.py [--lengths 2048 8192 32768] [--repeats 5] [--threads 1] [--json FILE]``.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import tempfile
import time
from pathlib import Path

import torch

from hf_clusterformer.conversion import load_qa_model
from hf_clusterformer.export import export_model, load_exported
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


def export_all(model, folder: Path, threads: int, torch_program: bool) -> tuple[dict, dict]:
    """The exported runners by kind, and the seconds each export (and the .pt2 load) took."""
    runners, seconds = {}, {}
    for kind, quantize in (("onnx fp32", None), ("onnx int8", "int8")):
        start = time.perf_counter()
        path = export_model(model, folder / f"{kind.replace(' ', '-')}.onnx", allow_untrained=True, length=512,
                            quantize=quantize)
        seconds[f"export {kind}"] = time.perf_counter() - start
        runners[kind] = load_exported(path, threads=threads)
        seconds[f"size MB {kind}"] = path.stat().st_size / 1e6
    if torch_program:
        start = time.perf_counter()
        path = export_model(model, folder / "program.pt2", allow_untrained=True, length=512)
        seconds["export torch"] = time.perf_counter() - start
        start = time.perf_counter()
        runners["torch program"] = load_exported(path)
        seconds["load torch"] = time.perf_counter() - start
    return runners, seconds


def time_row(model, runners: dict, ids: torch.Tensor, mask: torch.Tensor, repeats: int) -> dict:
    """Median seconds of eager and every runner on one batch, with ratios and largest differences."""
    def eager():
        with torch.no_grad():
            return model(input_ids=ids, attention_mask=mask).start_logits

    calls = {
        "eager": eager, **{kind: (lambda run=run: run(ids, mask)["start_logits"]) for kind, run in runners.items()}
    }
    reference = eager()  # also the warm-up
    difference = {kind: float((call() - reference).abs().max()) for kind, call in calls.items() if kind != "eager"}
    times = {kind: [] for kind in calls}
    names = list(calls)
    for round_ in range(repeats):
        for kind in names[round_ % len(names):] + names[: round_ % len(names)]:
            start = time.perf_counter()
            calls[kind]()
            times[kind].append(time.perf_counter() - start)
    medians = {kind: statistics.median(values) for kind, values in times.items()}
    return {"tokens": int(ids.shape[1]), "seconds": medians, "rounds": times,
            "speed_vs_eager": {kind: medians["eager"] / medians[kind] for kind in runners},
            "max_abs_difference": difference}


def command_line(args: argparse.Namespace) -> str:
    """The command that reproduces this run (flags with values, switches alone)."""
    flags = []
    for name, value in vars(args).items():
        flag = "--" + name.replace("_", "-")
        if value is True:
            flags.append(flag)
        elif value not in (None, False):
            flags.append(f"{flag} {' '.join(map(str, value)) if isinstance(value, list) else value}")
    return "python bench/bench_export.py " + " ".join(flags)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[2048, 8192, 32768])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--torch-program", action="store_true", help="also time the .pt2 program (and its load)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    import onnxruntime as ort

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    with quiet_loading():
        model = load_qa_model(fetch_pretrained("all-MiniLM-L6-v2"), max_context_length=max(args.lengths)).eval()
    for router in model.cluster_routers().values():
        router.fitted.fill_(True)  # random centroids: the timing is the same, without the never-fitted warning
    with tempfile.TemporaryDirectory() as folder:
        runners, seconds = export_all(model, Path(folder), args.threads, args.torch_program)
    print(f"{platform.processor() or platform.machine()}, {args.threads} thread(s), torch {torch.__version__}, "
          f"onnxruntime {ort.__version__}; " + ", ".join(f"{name} {value:.1f}" for name, value in seconds.items()))
    rows = []
    generator = torch.Generator().manual_seed(0)
    for length in args.lengths:
        row = time_row(model, runners, *pair(model.config, length, generator), args.repeats)
        rows.append(row)
        cells = "  ".join(f"{kind} {row['seconds'][kind]:.3f} s ({row['speed_vs_eager'][kind]:.2f}x, max |diff| "
                          f"{row['max_abs_difference'][kind]:.1e})" for kind in runners)
        print(f"{row['tokens']:>6} tokens  eager {row['seconds']['eager']:.3f} s  {cells}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"threads": args.threads, "repeats": args.repeats, "seconds": seconds,
                                               "torch": torch.__version__, "onnxruntime": ort.__version__,
                                               "command": command_line(args),
                                               "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
