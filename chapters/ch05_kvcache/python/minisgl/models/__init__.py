"""Models: a ``ModelConfig`` from config.json, the class its architecture name registers, and
loading a checkpoint into it.

``sequence_logits`` is the entry point that stays put while the engine grows around the model:
it returns the logits of every position of one sequence, computed from scratch. Since the layers
attend over a KV cache, it is a prefill on an empty cache made for that one sequence.
"""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, List, Sequence

import torch

from minisgl.core import Batch, Context, Req, SamplingParams, use_global_ctx
from minisgl.utils.hf import check_model_dir, read_hf_config

from .base import BaseLLMModel
from .config import ModelConfig
from .register import MODELS, get_model_class
from .weight import load_weights


def create_model(config: ModelConfig) -> BaseLLMModel:
    """A model with unset weights (``torch.empty``), in the default dtype and on the default device
    in force while it is built."""
    return get_model_class(config.architecture)(config)


@contextmanager
def _default_dtype(dtype: torch.dtype) -> Iterator[None]:
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(old)


def load_model(
    path: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype | None = None
) -> BaseLLMModel:
    """Read config.json, build the model in the checkpoint's dtype (or ``dtype``) on ``device``,
    and fill it from the checkpoint's safetensors."""
    # a wrong path, model or checkpoint fails here, before anything is loaded
    model_dir = check_model_dir(path, MODELS.names())
    config = ModelConfig.from_dict(read_hf_config(model_dir))
    with torch.device(device), _default_dtype(dtype or config.dtype):
        model = create_model(config)  # every torch.empty now has this dtype and device
    try:  # streamed: each tensor copied in as it arrives, never the whole checkpoint
        model.load_state_dict(load_weights(model_dir, config))
    except ValueError as e:  # say which checkpoint: the model's message names the tensor
        raise ValueError(f"checkpoint {str(model_dir)!r} does not fit the model: {e}") from e
    return model


def _one_sequence_context(model: BaseLLMModel, length: int, device: torch.device) -> Context:
    """A Context for one sequence of ``length`` tokens: a KV pool of exactly that many slots (page
    size 1), its page-table row ``0, 1, ..., length - 1``, and the reference attention backend."""
    from minisgl.attention import create_attention_backend
    from minisgl.kvcache import create_kvcache_pool

    dtype = model.model.embed_tokens.weight.dtype  # type: ignore[attr-defined]
    ctx = Context(page_size=1)
    ctx.kv_cache = create_kvcache_pool(model.config, length, 1, dtype, device)
    ctx.page_table = torch.arange(length, dtype=torch.int32, device=device)[None, :]
    ctx.attn_backend = create_attention_backend("torch", model.config, device)
    return ctx


@torch.inference_mode()
def sequence_logits(model: BaseLLMModel, token_ids: Sequence[int] | torch.Tensor) -> torch.Tensor:
    """The logits [T, vocab] (float32) at each of the T positions of one sequence: a prefill of
    the whole sequence on an empty cache."""
    device = next(iter(model.state_dict().values())).device  # where the weights are
    ids = torch.as_tensor(token_ids, dtype=torch.long, device=device).flatten()
    positions = torch.arange(ids.numel(), device=device)
    ctx = _one_sequence_context(model, ids.numel(), device)
    req = Req(0, ids.tolist(), SamplingParams(), table_idx=0)
    batch = Batch([req], "prefill", input_ids=ids, positions=positions, out_loc=positions)
    with use_global_ctx(ctx), ctx.forward_batch(batch):
        ctx.attn_backend.prepare_metadata(batch)  # type: ignore[union-attr]
        return model.forward(ids, positions).float()


def generate_greedy_recompute(model: BaseLLMModel, token_ids: Sequence[int], n: int) -> List[int]:
    """``n`` new tokens, each the argmax after the whole sequence so far: no cache, so step i runs
    all ``len(token_ids) + i`` tokens through the model again. Returns the new tokens only."""
    ids = list(token_ids)
    for _ in range(n):
        ids.append(int(sequence_logits(model, ids)[-1].argmax()))
    return ids[len(token_ids) :]


__all__ = [
    "BaseLLMModel",
    "ModelConfig",
    "create_model",
    "generate_greedy_recompute",
    "get_model_class",
    "load_model",
    "sequence_logits",
]
