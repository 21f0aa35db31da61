"""What the device can do, asked once: the GPU's compute capability decides which kernels and
which backends the engine picks."""

from __future__ import annotations

import functools
from typing import Tuple

import torch


@functools.cache
def cuda_capability() -> Tuple[int, int] | None:
    """(major, minor) of the current CUDA device, e.g. (9, 0) on an H100 or H200; None without
    one. Cached: asking the driver costs a call, and the answer never changes in a process."""
    if not torch.cuda.is_available():
        return None
    return torch.cuda.get_device_capability()


def is_arch_supported(major: int, minor: int = 0) -> bool:
    """Whether there is a CUDA device of compute capability ``major.minor`` or newer."""
    capability = cuda_capability()
    return capability is not None and capability >= (major, minor)
