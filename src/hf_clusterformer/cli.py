"""The ``clusterformer`` command (``python -m hf_clusterformer.cli``), implemented in `hf_clusterformer_cli`."""

import sys

from hf_clusterformer_cli import CommandError, build_parser, check_model_path, hub_unreachable, main

__all__ = ["CommandError", "build_parser", "check_model_path", "hub_unreachable", "main"]

if __name__ == "__main__":
    sys.exit(main())
