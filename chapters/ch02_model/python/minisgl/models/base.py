from __future__ import annotations

import torch

from minisgl.layers.base import BaseOP

from .config import ModelConfig


class BaseLLMModel(BaseOP):
    """A causal language model: token ids in, next-token logits out."""

    config: ModelConfig

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """input_ids, positions: [T] -> logits: [T, vocab]; position t sees tokens 0..t only."""
        raise NotImplementedError
