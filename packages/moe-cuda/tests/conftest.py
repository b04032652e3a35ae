"""The Triton kernels of moe-cuda (its router and activation pass) run under the CPU interpreter when
no GPU is visible. TRITON_INTERPRET must be set before Triton is first imported, hence here."""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
