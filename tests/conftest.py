import os
import sys

import pytest
import torch

# The tools are scripts, not an installed package. The repo root first makes them importable as
# `tools.train`, `tools.analysis_tools.get_flops`, ...; tools/analysis_tools (last, so that it shadows
# nothing) lets the scripts there import their sibling `benchmark_utils` as they do when run: Python
# puts a script's own folder on sys.path.
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
if os.path.join(ROOT, 'tools', 'analysis_tools') not in sys.path:
    sys.path.append(os.path.join(ROOT, 'tools', 'analysis_tools'))

torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield
