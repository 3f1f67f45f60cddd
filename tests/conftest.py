"""Test setup: without CUDA, kernels run in Triton's interpreter with the GPU's conversions."""
import os
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

ON_GPU = torch.cuda.is_available()
if not ON_GPU:
    os.environ["TRITON_INTERPRET"] = "1"   # must precede the first import of a kernel module
    from tests import interpreter_fp8

    interpreter_fp8.install()
DEVICE = "cuda" if ON_GPU else "cpu"
