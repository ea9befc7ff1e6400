"""Whether this machine has a GPU torch can use, without importing torch where the answer is no.

Importing torch takes ~2 s of a small machine's CPU; the driver asks before its workers start (the
configuration's memory and thread checks, ``trainer.device=auto``). A CUDA (or ROCm) device needs its
driver's device files; where none exists, ``torch.cuda.is_available()`` is False and torch stays
unimported. Anywhere else torch is asked.
"""

from __future__ import annotations

import os
import sys

__all__ = ["cuda_available"]

# NVIDIA's control device (and the first GPU's), AMD's ROCm kernel driver, WSL's GPU paravirtualisation
DEVICE_FILES = ("/dev/nvidiactl", "/dev/nvidia0", "/dev/kfd", "/dev/dxg")


def cuda_available() -> bool:
    """``torch.cuda.is_available()``; answered False without importing torch when none of
    :data:`DEVICE_FILES` exists (and torch is not imported already)."""
    if "torch" not in sys.modules and not any(os.path.exists(p) for p in DEVICE_FILES):
        return False
    import torch

    return torch.cuda.is_available()
