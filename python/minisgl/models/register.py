from __future__ import annotations

from typing import Type

from minisgl.utils.registry import Registry

from .base import BaseLLMModel
from .decoder import DecoderForCausalLM

# Hugging Face architecture names (config.json's "architectures") to model classes
MODELS: Registry[Type[BaseLLMModel]] = Registry("model architecture")
for _name in (
    "LlamaForCausalLM",
    "Qwen2ForCausalLM",
    "Qwen3ForCausalLM",
    "MistralForCausalLM",
    "Qwen3MoeForCausalLM",
):
    MODELS.register(_name, DecoderForCausalLM)


def get_model_class(architecture: str) -> Type[BaseLLMModel]:
    return MODELS.get(architecture)
