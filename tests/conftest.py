import os
import sys

import pytest
import torch

# the repo root first, so `tools/` helpers import without installing them
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield
