"""MoE backends, chosen by name: "torch" (the reference, the default on a CPU), "fused" (the
Triton fused MoE, which sizes its alignment on the host) or "sync_free" (routing and alignment
on the GPU, so a CUDA graph can hold it; the default on a GPU)."""

from __future__ import annotations

from typing import Callable

import torch

from minisgl.utils.registry import Registry

from .base import BaseMoeBackend, select_experts
from .torch_backend import TorchMoeBackend

MOE_BACKENDS: Registry[Callable[[], BaseMoeBackend]] = Registry("MoE backend")
MOE_BACKENDS.register("torch", TorchMoeBackend)


def _make_fused() -> BaseMoeBackend:
    from .fused import FusedMoeBackend  # imports triton only when it is chosen

    return FusedMoeBackend()


MOE_BACKENDS.register("fused", _make_fused)


def _make_sync_free() -> BaseMoeBackend:
    from .sync_free import SyncFreeMoeBackend  # also imports triton only when chosen

    return SyncFreeMoeBackend()


MOE_BACKENDS.register("sync_free", _make_sync_free)


def create_moe_backend(device: torch.device | str, name: str = "auto") -> BaseMoeBackend:
    """The backend ``name``; "auto" picks the sync-free one on a GPU and the reference elsewhere."""
    if name == "auto":
        name = "sync_free" if torch.device(device).type == "cuda" else "torch"
    return MOE_BACKENDS.get(name)()


__all__ = [
    "MOE_BACKENDS",
    "BaseMoeBackend",
    "TorchMoeBackend",
    "create_moe_backend",
    "select_experts",
]
