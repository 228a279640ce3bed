#!/usr/bin/env python
"""Fine-tune / train Cluster-Former for long-context extractive question answering.

Like transformers' own ``run_qa.py``, but every context is ONE feature (no doc-stride splitting) and the
cluster centroids are refitted during training by ``CentroidUpdateCallback``.

Examples:
    # from scratch on the generated long-range data
    python examples/run_qa.py --dataset longrange --output_dir out --do_train --do_eval \
        --num_hidden_layers 4 --cluster_layers 2 --num_clusters 32 --window_size 64 --window_stride 48
    # its sliding-window baseline: ``--cluster_layers`` with no value (or ``--layer_kinds``, one kind per layer)
    python examples/run_qa.py --dataset longrange --output_dir out-sliding --do_train --do_eval \
        --num_hidden_layers 4 --cluster_layers --window_size 64 --window_stride 48

    # from a RoBERTa checkpoint on local SQuAD-format files
    python examples/run_qa.py --model_name_or_path ./roberta-base --train_file train.json \
        --validation_file dev.json --cluster_layers 8 10 --output_dir out --do_train --do_eval

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
