"""What exporting costs in answers: SQuAD EM / F1 of one fine-tuned QA model run eagerly, as an exported ONNX file
(fp32) and as an int8 ONNX file, on the same held-out questions, one question per call, in one process (CPU).

Contexts (``--contexts``): ``paragraph``, each question with its own paragraph; ``article``, each question with its
whole article (every paragraph of it joined, thousands of tokens) as one context. Printed and written
(``--json``): per kind and context, EM, F1, how many answers equal the eager model's, and seconds per question.

Usage: ``python bench/export_f1.py --model DIR --squad HELD_OUT.json [--questions 400] [--article-questions 80]``
(``bench/measured/export/finetune_qa.sh`` makes both).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch
from transformers import AutoTokenizer

from hf_clusterformer import ClusterFormerForQuestionAnswering
from hf_clusterformer.export import export_model, load_exported
from hf_clusterformer.features import postprocess_predictions, prepare_validation_features
from hf_clusterformer.metrics import compute_squad


def read_examples(path: str) -> tuple[list[dict], list[dict]]:
    """(paragraph examples, article examples) of a SQuAD v1.1 file, in file order: id, question, context, answers."""
    data = json.loads(Path(path).read_text())["data"]
    paragraphs, articles = [], []
    for article in data:
        whole = " ".join(p["context"].strip() for p in article["paragraphs"])
        for paragraph in article["paragraphs"]:
            for qa in paragraph["qas"]:
                answers = [a["text"] for a in qa["answers"]]
                paragraphs.append({"id": qa["id"], "question": qa["question"], "context": paragraph["context"],
                                   "answers": answers})
                articles.append({**paragraphs[-1], "context": whole})
    return paragraphs, articles


def spread(examples: list[dict], count: int) -> list[dict]:
    """``count`` examples evenly spread over the list (every article represented)."""
    step = max(1, len(examples) // count)
    return examples[::step][:count]


def answer_all(run, examples: list[dict], tokenizer, max_length: int) -> tuple[dict, float]:
    """Answers of ``run`` ((1, T) ids, mask -> start, end logits) by example id, and seconds per question."""
    answers, seconds = {}, 0.0
    for example in examples:
        batch = {key: [example[key]] for key in ("id", "question", "context")}
        features = prepare_validation_features(batch, tokenizer, max_length)
        ids, mask = torch.tensor(features["input_ids"]), torch.tensor(features["attention_mask"])
        start = time.perf_counter()
        start_logits, end_logits = run(ids, mask)
        seconds += time.perf_counter() - start
        answers.update(postprocess_predictions(batch, features, start_logits.numpy(), end_logits.numpy()))
    return answers, seconds / len(examples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="a fine-tuned Cluster-Former QA folder")
    parser.add_argument("--squad", required=True, help="held-out SQuAD v1.1 json")
    parser.add_argument("--questions", type=int, default=400, help="questions with their paragraph")
    parser.add_argument("--article-questions", type=int, default=80, help="questions with their whole article")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    model = ClusterFormerForQuestionAnswering.from_pretrained(args.model).eval()
    max_length = model.config.max_position_embeddings * 1000  # never truncates: the model reads whole contexts

    def eager(ids, mask):
        with torch.no_grad():
            outputs = model(input_ids=ids, attention_mask=mask)
        return outputs.start_logits, outputs.end_logits

    runs = {"eager": eager}
    with tempfile.TemporaryDirectory() as folder:
        for kind, quantize in (("onnx fp32", None), ("onnx int8", "int8")):
            path = export_model(args.model, Path(folder) / f"{kind.replace(' ', '-')}.onnx", quantize=quantize)
            runner = load_exported(path, threads=args.threads)
            runs[kind] = lambda ids, mask, runner=runner: tuple(runner(ids, mask)[name]
                                                                 for name in ("start_logits", "end_logits"))
    paragraphs, articles = read_examples(args.squad)
    sets = {"paragraph": spread(paragraphs, args.questions), "article": spread(articles, args.article_questions)}
    results = {}
    for context, examples in sets.items():
        references = {e["id"]: e["answers"] for e in examples}
        tokens = [len(tokenizer(e["context"])["input_ids"]) for e in examples]
        answers = {}
        for kind, run in runs.items():
            answers[kind], seconds = answer_all(run, examples, tokenizer, max_length)
            scores = compute_squad(answers[kind], references)
            same = sum(answers[kind][key] == answers["eager"][key] for key in references)
            results[f"{context} {kind}"] = {**scores, "same_as_eager": same, "questions": len(examples),
                                            "seconds_per_question": seconds,
                                            "mean_context_tokens": sum(tokens) / len(tokens)}
            print(f"{context:>9} ({len(examples)} questions, {sum(tokens) / len(tokens):.0f} context tokens) "
                  f"{kind:>9}: "
                  f"EM {scores['exact_match']:.1f} F1 {scores['f1']:.1f}, {same} answers as eager, "
                  f"{seconds:.3f} s/question", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"model": args.model, "threads": args.threads, "results": results},
                                              indent=1) + "\n")


if __name__ == "__main__":
    main()
