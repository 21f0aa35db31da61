from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping

import torch

# (q/k/v bias, o_proj bias) where a family does not follow ``attention_bias``
_ATTENTION_BIAS = {"qwen2": (True, False), "mistral": (False, False)}
_QK_NORM = {"qwen3", "qwen3_moe"}  # families with an RMSNorm on every q and k head


@dataclass
class ModelConfig:
    """What the engine needs from a Hugging Face ``config.json``, under names of its own."""

    architecture: str  # "LlamaForCausalLM": chooses the model class in models/register.py
    model_type: str  # "llama", "qwen2", "qwen3", "mistral", "qwen3_moe"
    vocab_size: int
    hidden_size: int
    intermediate_size: int  # the dense MLP's
    num_layers: int
    num_qo_heads: int
    num_kv_heads: int  # fewer than num_qo_heads with grouped-query attention
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: Dict[str, Any] | None  # None for plain RoPE; else with "rope_type"
    max_position_embeddings: int
    tie_word_embeddings: bool  # the LM head reuses the embedding matrix
    attention_bias: bool  # a bias on q, k and v (Qwen2)
    o_proj_bias: bool
    qk_norm: bool  # RMSNorm on each q and k head before RoPE (Qwen3)
    hidden_act: str = "silu"
    dtype: torch.dtype = torch.float32  # of the checkpoint's weights
    # mixture of experts (Qwen3-MoE); num_experts == 0 for a dense model
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    norm_topk_prob: bool = False  # renormalize the top-k routing weights to sum to 1
    decoder_sparse_step: int = 1  # every decoder_sparse_step-th layer is MoE ...
    mlp_only_layers: List[int] = field(default_factory=list)  # ... except these, which are dense

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    def is_moe_layer(self, layer_id: int) -> bool:
        """Which layers have experts, by Hugging Face's rule for Qwen3-MoE."""
        return (
            self.is_moe
            and layer_id not in self.mlp_only_layers
            and (layer_id + 1) % self.decoder_sparse_step == 0
        )

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> ModelConfig:
        """From the dict of a ``config.json`` (transformers 4 or 5 layout)."""
        d = dict(raw)
        if isinstance(d.get("text_config"), Mapping):  # multimodal configs nest the LLM's
            d = {**d, **d["text_config"]}
        if not d.get("architectures"):
            raise ValueError("config has no 'architectures': cannot tell which model it is")
        _refuse_unsupported(d)
        model_type = d.get("model_type", "")
        num_qo_heads = d["num_attention_heads"]
        bias = d.get("attention_bias", False)
        qkv_bias, o_bias = _ATTENTION_BIAS.get(model_type, (bias, bias))
        rope_theta, rope_scaling = _rope(d)
        return cls(
            architecture=d["architectures"][0],
            model_type=model_type,
            vocab_size=d["vocab_size"],
            hidden_size=d["hidden_size"],
            intermediate_size=d["intermediate_size"],
            num_layers=d["num_hidden_layers"],
            num_qo_heads=num_qo_heads,
            num_kv_heads=d.get("num_key_value_heads") or num_qo_heads,
            head_dim=d.get("head_dim") or d["hidden_size"] // num_qo_heads,
            rms_norm_eps=d.get("rms_norm_eps", 1e-6),
            rope_theta=rope_theta,
            rope_scaling=rope_scaling,
            max_position_embeddings=d["max_position_embeddings"],
            tie_word_embeddings=d.get("tie_word_embeddings", False),
            attention_bias=qkv_bias,
            o_proj_bias=o_bias,
            qk_norm=model_type in _QK_NORM,
            hidden_act=d.get("hidden_act", "silu"),
            dtype=getattr(torch, d.get("dtype") or d.get("torch_dtype") or "float32"),
            # transformers 5 writes Qwen3-MoE's expert count as num_local_experts
            num_experts=d.get("num_experts") or d.get("num_local_experts") or 0,
            num_experts_per_tok=d.get("num_experts_per_tok", 0),
            moe_intermediate_size=d.get("moe_intermediate_size", 0),
            norm_topk_prob=d.get("norm_topk_prob", False),
            decoder_sparse_step=d.get("decoder_sparse_step") or 1,
            mlp_only_layers=list(d.get("mlp_only_layers") or []),
        )


def _refuse_unsupported(d: Mapping[str, Any]) -> None:
    """Features the decoder does not implement: better a clear error than wrong logits."""
    window = d.get("sliding_window")
    if window and d.get("use_sliding_window", True) and window < d["max_position_embeddings"]:
        raise ValueError(f"sliding-window attention (sliding_window={window}) is not supported")
    if d.get("partial_rotary_factor", 1.0) != 1.0:
        raise ValueError("partial rotary embeddings (partial_rotary_factor < 1) are not supported")
    if d.get("mlp_bias"):
        raise ValueError("biases in the MLP (mlp_bias) are not supported")


def _rope(d: Mapping[str, Any]) -> tuple[float, Dict[str, Any] | None]:
    """(rope_theta, rope_scaling). transformers 5 writes one ``rope_parameters`` dict (with
    ``rope_theta`` inside); older configs have ``rope_theta`` and ``rope_scaling`` side by side."""
    params = dict(d.get("rope_parameters") or d.get("rope_scaling") or {})
    theta = params.pop("rope_theta", d.get("rope_theta", 10000.0))
    rope_type = params.pop("rope_type", params.pop("type", "default"))
    if rope_type == "default":
        return theta, None
    params.setdefault("original_max_position_embeddings", d["max_position_embeddings"])
    return theta, {"rope_type": rope_type, **params}
