#!/usr/bin/env python
"""Fine-tune / train Cluster-Former for long-context extractive question answering.

Like transformers' own ``run_qa.py``, but every context is ONE feature (no doc-stride splitting) and the
cluster centroids are refitted during training by ``CentroidUpdateCallback``.

Examples:
    # from a RoBERTa checkpoint on local SQuAD-format files
    python examples/run_qa.py --model_name_or_path ./roberta-base --train_file train.json \
        --validation_file dev.json --cluster_layers 8 10 --output_dir out --do_train --do_eval

    # from scratch on the generated long-range data: the research package (research/) writes it as SQuAD-format
    # files, with a tokenizer whose names are single tokens
    python -m clusterformer_research.longrange --kind longrange --split train --out lr-train.json \
        --tokenizer_dir lr-tokenizer
    python -m clusterformer_research.longrange --kind longrange --split validation --num_examples 200 \
        --out lr-dev.json
    python examples/run_qa.py --train_file lr-train.json --validation_file lr-dev.json \
        --tokenizer_name lr-tokenizer --output_dir out --do_train --do_eval \
        --num_hidden_layers 4 --cluster_layers 2 --num_clusters 32 --window_size 64 --window_stride 48
    # its sliding-window baseline: ``--cluster_layers`` with no value (or ``--layer_kinds``, one kind per layer)
    python examples/run_qa.py --train_file lr-train.json --validation_file lr-dev.json \
        --tokenizer_name lr-tokenizer --output_dir out-sliding --do_train --do_eval \
        --num_hidden_layers 4 --cluster_layers --window_size 64 --window_stride 48

    # the SQuAD-based multi-passage set (built from the SQuAD v1.1 dev file)
    python examples/run_qa.py --dataset squad-multipassage --squad_path squad-v1.1-dev.json.zip ...

Run with ``--help`` for every option (model, data, centroid and TrainingArguments). A bad input (an output folder
that holds a model without ``--overwrite``, a data file, an option) stops it with one line on stderr, exit status 2.
"""

import sys

from safetensors import SafetensorError

from hf_clusterformer.qa_training import main

if __name__ == "__main__":
    try:
        main()
    except (OSError, ValueError, SafetensorError) as error:  # an output folder that holds a model, data, options
        print(f"run_qa.py: error: {' '.join(str(error).split())}", file=sys.stderr)
        sys.exit(2)
