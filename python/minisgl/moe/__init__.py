"""MoE backends, chosen by name: "torch" (the reference, the default on a CPU), "fused" (the
Triton fused MoE, which sizes its alignment on the host) or "fast" (routing and alignment on the
GPU, so a CUDA graph can hold it; the default on a GPU)."""

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


def _make_fast() -> BaseMoeBackend:
    from .fast import FastMoeBackend  # also imports triton only when chosen

    return FastMoeBackend()


MOE_BACKENDS.register("fast", _make_fast)


def create_moe_backend(device: torch.device | str, name: str = "auto") -> BaseMoeBackend:
    """The backend ``name``; "auto" picks the fast one on a GPU and the reference elsewhere."""
    if name == "auto":
        name = "fast" if torch.device(device).type == "cuda" else "torch"
    return MOE_BACKENDS.get(name)()


__all__ = ["MOE_BACKENDS", "BaseMoeBackend", "TorchMoeBackend", "create_moe_backend",
           "select_experts"]
