"""Download the authors' ImageNet checkpoints into checkpoints/ under the names the configs use:
``python -m mmlinattn.core.weights.download`` (this script runs it; ``--help`` for the flags).

    python tools/misc/download_checkpoints.py                      # all eleven files
    python tools/misc/download_checkpoints.py --only MAViT_T InLine_PVT_T
    python tools/misc/download_checkpoints.py --list [--markdown]  # names, URLs, local names
"""
import sys

from mmlinattn.core.weights.download import main, markdown_table, select  # noqa: F401

if __name__ == '__main__':
    sys.exit(main())
