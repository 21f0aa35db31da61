"""One decoder for Llama 3, Qwen2/2.5, Qwen3, Mistral and Qwen3-MoE.

They share one shape: embed, then N layers of (RMSNorm, attention, RMSNorm, MLP) with residual
adds, then a final RMSNorm and the LM head. Where they differ is a config flag: a bias on q/k/v
(Qwen2), an RMSNorm on each q/k head (Qwen3), the rope scaling, tied embeddings, experts (MoE).
"""

from __future__ import annotations

import torch

from minisgl.core import get_global_ctx
from minisgl.layers.attention import AttentionLayer
from minisgl.layers.base import BaseOP
from minisgl.layers.embedding import ParallelLMHead, VocabParallelEmbedding
from minisgl.layers.linear import LinearQKVMerged, LinearRowParallel
from minisgl.layers.norm import RMSNorm, RMSNormFused
from minisgl.layers.rotary import RotaryEmbedding

from .base import BaseLLMModel
from .config import ModelConfig
from .utils import build_mlp


class DecoderAttention(BaseOP):
    """qkv_proj -> (q/k norm) -> RoPE -> attention over the KV cache -> o_proj.

    x: [T, H], the batch's new tokens -> [T, H]
    """

    def __init__(self, config: ModelConfig, layer_id: int, rotary: RotaryEmbedding):
        self.head_dim = config.head_dim
        self.qkv_proj = LinearQKVMerged(
            config.hidden_size,
            config.head_dim,
            config.num_qo_heads,
            config.num_kv_heads,
            has_bias=config.attention_bias,
        )
        eps = config.rms_norm_eps
        self.q_norm = RMSNorm(config.head_dim, eps) if config.qk_norm else None
        self.k_norm = RMSNorm(config.head_dim, eps) if config.qk_norm else None
        self.o_proj = LinearRowParallel(
            config.num_qo_heads * config.head_dim, config.hidden_size, has_bias=config.o_proj_bias
        )
        self._rotary = rotary  # one cos / sin table shared by every layer
        self.attn = AttentionLayer(layer_id)

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv_proj.split(self.qkv_proj.forward(x))
        q, k, v = (t.unflatten(-1, (-1, self.head_dim)) for t in (q, k, v))  # [T, heads, D]
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm.forward(q), self.k_norm.forward(k)
        q, k = self._rotary.forward(positions, q, k)
        return self.o_proj.forward(self.attn.forward(q, k, v).flatten(-2))


class DecoderLayer(BaseOP):
    """Pre-norm attention and MLP, the residual adds fused into the norms that follow them."""

    def __init__(self, config: ModelConfig, layer_id: int, rotary: RotaryEmbedding):
        self.input_layernorm = RMSNormFused(config.hidden_size, config.rms_norm_eps)
        self.self_attn = DecoderAttention(config, layer_id, rotary)
        self.post_attention_layernorm = RMSNormFused(config.hidden_size, config.rms_norm_eps)
        self.mlp = build_mlp(config, layer_id)

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None, positions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """x: the previous layer's output; residual: the stream before it (None at layer 0)."""
        x, residual = self.input_layernorm.forward(x, residual)
        x = self.self_attn.forward(x, positions)
        x, residual = self.post_attention_layernorm.forward(x, residual)
        return self.mlp.forward(x), residual


class DecoderModel(BaseOP):
    """Embedding, the decoder layers and the final norm: input_ids [T] -> hidden [T, H]."""

    def __init__(self, config: ModelConfig):
        rotary = RotaryEmbedding(
            config.head_dim, config.max_position_embeddings, config.rope_theta, config.rope_scaling
        )
        self.embed_tokens = VocabParallelEmbedding(config.vocab_size, config.hidden_size)
        self.layers = [DecoderLayer(config, i, rotary) for i in range(config.num_layers)]
        self.norm = RMSNormFused(config.hidden_size, config.rms_norm_eps)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        x, residual = self.embed_tokens.forward(input_ids), None
        for layer in self.layers:
            x, residual = layer.forward(x, residual, positions)
        return self.norm.forward(x, residual)[0]


class DecoderForCausalLM(BaseLLMModel):
    """The decoder and its LM head. Weight names follow Hugging Face's: ``model.layers.0...``."""

    def __init__(self, config: ModelConfig):
        self.config = config
        self.model = DecoderModel(config)
        tie_to = self.model.embed_tokens if config.tie_word_embeddings else None
        self.lm_head = ParallelLMHead(config.vocab_size, config.hidden_size, tie_to=tie_to)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Logits [T, V], or [R, V] when the batch names the R rows it samples: a prefill of
        1,000 tokens samples one, and at Qwen3-0.6B's shape the others' logits over its 151,936
        tokens would cost a third as much again as all its layers."""
        hidden = self.model.forward(input_ids, positions)
        rows = get_global_ctx().batch.logits_rows
        return self.lm_head.forward(hidden if rows is None else hidden[rows])
