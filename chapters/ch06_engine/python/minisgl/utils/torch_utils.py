from __future__ import annotations

import torch


def resolve_device(device: str | torch.device) -> torch.device:
    """ "auto": the GPU when there is one, else the CPU."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def free_memory(device: torch.device) -> int:
    """Bytes of memory still free on a CUDA device."""
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    return torch.cuda.mem_get_info(device)[0]


def nbytes(dtype: torch.dtype) -> int:
    """The size of one element of ``dtype`` in bytes."""
    return torch.empty(0, dtype=dtype).element_size()
