"""Attention backends, chosen by name: "torch", the reference and the default."""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

import torch

from minisgl.utils.registry import Registry

from .base import BaseAttnBackend
from .torch_backend import TorchAttnBackend

if TYPE_CHECKING:
    from minisgl.models.config import ModelConfig

BackendMaker = Callable[["ModelConfig", torch.device], BaseAttnBackend]
ATTENTION_BACKENDS: Registry[BackendMaker] = Registry("attention backend")
ATTENTION_BACKENDS.register("torch", TorchAttnBackend)


def create_attention_backend(
    name: str, config: ModelConfig, device: torch.device | str
) -> BaseAttnBackend:
    """The backend ``name``; "auto" picks the best one for ``device``."""
    if name == "auto":
        name = "torch"
    return ATTENTION_BACKENDS.get(name)(config, torch.device(device))


__all__ = ["ATTENTION_BACKENDS", "BaseAttnBackend", "TorchAttnBackend", "create_attention_backend"]
