"""Models: a ``ModelConfig`` from config.json, and the class its architecture name registers.

``sequence_logits`` is the entry point that stays put while the engine grows around the model:
it returns the logits of every position of one sequence, computed from scratch.
"""

from __future__ import annotations

from typing import Sequence

import torch

from .base import BaseLLMModel
from .config import ModelConfig
from .register import get_model_class


def create_model(config: ModelConfig) -> BaseLLMModel:
    """A model with unset weights (``torch.empty``), in the default dtype and on the default device
    in force while it is built."""
    return get_model_class(config.architecture)(config)


@torch.inference_mode()
def sequence_logits(model: BaseLLMModel, token_ids: Sequence[int] | torch.Tensor) -> torch.Tensor:
    """The logits [T, vocab] (float32) at each of the T positions of one sequence."""
    device = next(iter(model.state_dict().values())).device  # where the weights are
    ids = torch.as_tensor(token_ids, dtype=torch.long, device=device).flatten()
    positions = torch.arange(ids.numel(), device=device)
    return model.forward(ids, positions).float()


__all__ = ["BaseLLMModel", "ModelConfig", "create_model", "get_model_class", "sequence_logits"]
