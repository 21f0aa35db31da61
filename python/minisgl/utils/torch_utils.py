from __future__ import annotations

import time
from contextlib import contextmanager, nullcontext
from typing import ContextManager, Dict, Iterator

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


class StepTimer:
    """Wall time per named phase of a step, summed over steps.

    ``phase(name)`` wraps one phase: when ``enabled`` it waits for the device at both edges, so
    a phase's time is its own GPU work and not the work it queued for later; when ``nvtx`` (on
    CUDA) it also opens an NVTX range for Nsight Systems. When both are off ``phase`` returns
    one shared do-nothing context: no synchronize, no clock, so the engine runs as fast as without
    it.
    """

    def __init__(
        self, enabled: bool = False, device: torch.device = torch.device("cpu"), nvtx: bool = False
    ):
        self.enabled = enabled
        self.device = device
        self.nvtx = nvtx and device.type == "cuda"
        self.seconds: Dict[str, float] = {}  # phase -> total wall time
        self.counts: Dict[str, int] = {}  # phase -> how many times it ran

    def phase(self, name: str) -> ContextManager[None]:
        if not (self.enabled or self.nvtx):
            return _NO_PHASE
        return self._timed(name)

    @contextmanager
    def _timed(self, name: str) -> Iterator[None]:
        with torch.cuda.nvtx.range(name) if self.nvtx else nullcontext():
            if not self.enabled:
                yield
                return
            self._synchronize()
            start = time.perf_counter()
            try:
                yield
            finally:
                self._synchronize()
                self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - start
                self.counts[name] = self.counts.get(name, 0) + 1

    def _synchronize(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def reset(self) -> None:
        self.seconds.clear()
        self.counts.clear()


_NO_PHASE = nullcontext()
