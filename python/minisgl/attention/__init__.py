"""Attention backends, chosen by name: "torch" (the reference, the default on a CPU), "triton"
(paged kernels, the default on a GPU), or "prefill,decode", two of them (``hybrid.py``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

import torch

from minisgl.utils.arch import is_arch_supported
from minisgl.utils.registry import Registry

from .base import BaseAttnBackend
from .hybrid import HybridAttnBackend
from .torch_backend import TorchAttnBackend

if TYPE_CHECKING:
    from minisgl.models.config import ModelConfig

BackendMaker = Callable[["ModelConfig", torch.device], BaseAttnBackend]
ATTENTION_BACKENDS: Registry[BackendMaker] = Registry("attention backend")
ATTENTION_BACKENDS.register("torch", TorchAttnBackend)


def _make_triton(config: ModelConfig, device: torch.device) -> BaseAttnBackend:
    from .triton_backend import TritonAttnBackend  # imports triton only when it is chosen

    return TritonAttnBackend(config, device)


ATTENTION_BACKENDS.register("triton", _make_triton)


def auto_backend(device: torch.device) -> str:
    """Triton's kernels on a GPU that runs its bf16 dots (Ampere or newer), else the reference."""
    return "triton" if device.type == "cuda" and is_arch_supported(8, 0) else "torch"


def create_attention_backend(
    name: str, config: ModelConfig, device: torch.device | str
) -> BaseAttnBackend:
    """The backend ``name``; "auto" picks the best one for ``device``; "a,b" prefills with a and
    decodes with b."""
    device = torch.device(device)
    if name == "auto":
        name = auto_backend(device)
    if "," in name:
        if name.count(",") != 1:
            raise ValueError(f"attention backend {name!r}: give one name, or two as 'a,b'")
        prefill, decode = name.split(",")
        return HybridAttnBackend(
            create_attention_backend(prefill, config, device),
            create_attention_backend(decode, config, device),
        )
    return ATTENTION_BACKENDS.get(name)(config, device)


__all__ = [
    "ATTENTION_BACKENDS",
    "BaseAttnBackend",
    "HybridAttnBackend",
    "TorchAttnBackend",
    "auto_backend",
    "create_attention_backend",
]
