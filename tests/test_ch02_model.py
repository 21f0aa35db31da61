"""Chapter 2: rotary embeddings, SiLU-and-mul, ModelConfig, the registry and the generic decoder,
held against transformers (weights copied in memory; chapter 3 loads checkpoints)."""

from __future__ import annotations

import json

import pytest
import torch
from helpers import DENSE, copy_hf_weights, encode, hf_greedy, hf_logits, hf_model
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import (
    LlamaMLP,
    LlamaRotaryEmbedding,
    apply_rotary_pos_emb,
)

from minisgl.layers.activation import silu_and_mul
from minisgl.layers.rotary import RotaryEmbedding, rope_frequencies
from minisgl.models import ModelConfig, create_model, get_model_class, sequence_logits
from minisgl.models.utils import build_mlp

PROMPTS = [
    "hello world",
    "The quick brown fox jumps over the lazy dog.",
    "Once upon a time there was a small robot who lived in a library.",
]


def _config(path) -> ModelConfig:
    return ModelConfig.from_dict(json.loads((path / "config.json").read_text()))


# ---- SiLU and mul ---------------------------------------------------------------------------


def test_silu_and_mul_takes_gate_first():
    torch.manual_seed(0)
    gate, up = torch.randn(5, 24), torch.randn(5, 24)
    out = silu_and_mul(torch.cat([gate, up], dim=-1))
    assert out.shape == (5, 24)
    assert torch.allclose(out, torch.nn.functional.silu(gate) * up, atol=1e-6)
    assert not torch.allclose(out, torch.nn.functional.silu(up) * gate, atol=1e-2)


def test_gated_mlp_matches_transformers(tiny_models):
    path = tiny_models["llama3"]
    config = _config(path)
    ref: LlamaMLP = hf_model(path).model.layers[0].mlp
    mlp = build_mlp(config, 0)
    mlp.load_state_dict(
        {
            "gate_up_proj.weight": torch.cat([ref.gate_proj.weight, ref.up_proj.weight]),
            "down_proj.weight": ref.down_proj.weight,
        }
    )
    x = torch.randn(7, config.hidden_size)
    with torch.no_grad():
        assert torch.allclose(mlp.forward(x), ref(x), atol=1e-5)


# ---- rotary embeddings ----------------------------------------------------------------------

ROPES = {
    "default": None,
    "llama3": dict(
        rope_type="llama3",
        factor=8.0,
        low_freq_factor=1.0,
        high_freq_factor=4.0,
        original_max_position_embeddings=512,
    ),
    "yarn": dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=512),
    "yarn-untruncated": dict(
        rope_type="yarn",
        factor=4.0,
        original_max_position_embeddings=512,
        beta_fast=16,
        beta_slow=2,
        truncate=False,
        attention_factor=1.25,
    ),
}


def _hf_rope(head_dim: int, base: float, scaling: dict | None, max_pos: int):
    params = {"rope_type": "default", "rope_theta": base, **(scaling or {})}
    config = LlamaConfig(
        hidden_size=head_dim * 4,
        num_attention_heads=4,
        head_dim=head_dim,
        max_position_embeddings=max_pos,
        rope_parameters=params,
    )
    return LlamaRotaryEmbedding(config)


@pytest.mark.parametrize("head_dim,base", [(64, 10000.0), (128, 500000.0)])
@pytest.mark.parametrize("kind", list(ROPES))
def test_rope_matches_transformers(kind, head_dim, base):
    """float32 inputs whatever the default dtype (transformers casts cos / sin to the input's
    dtype: under a bfloat16 default every row but position 0's would differ). The frequencies
    are compared first, and a failure names the process-wide state it ran under."""
    scaling, max_pos = ROPES[kind], 4096
    torch.manual_seed(1)
    positions = torch.cat([torch.arange(8), torch.randint(0, max_pos, (40,))])
    q = torch.randn(48, 4, head_dim, dtype=torch.float32)
    k = torch.randn(48, 2, head_dim, dtype=torch.float32)
    rope = RotaryEmbedding(head_dim, max_pos, base, scaling)
    oq, ok = rope.forward(positions, q, k)
    hf = _hf_rope(head_dim, base, scaling, max_pos)
    state = (
        f"default dtype {torch.get_default_dtype()}, default device "
        f"{torch.empty(0).device}, rope_parameters {hf.config.rope_parameters}"
    )
    freqs = rope_frequencies(head_dim, base, scaling)
    assert torch.allclose(hf.inv_freq, freqs[0], rtol=1e-5), f"inv_freq differs; {state}"
    assert hf.attention_scaling == pytest.approx(freqs[1]), state
    cos, sin = hf(q, positions[None])
    # transformers wants [batch, heads, T, D]
    hq, hk = apply_rotary_pos_emb(q.transpose(0, 1)[None], k.transpose(0, 1)[None], cos, sin)
    # a float32 angle of p radians is itself only known to about p * 2**-24: allow a few of
    # those (with |q| up to ~4), on top of 1e-5, so that two correct float32 evaluations of cos
    # at position 4,000 cannot fail the test, and a wrong frequency or position still does
    tolerance = 1e-5 + 8 * 2.0**-24 * positions.float()
    for ours, theirs in ((oq, hq[0].transpose(0, 1)), (ok, hk[0].transpose(0, 1))):
        err = (ours - theirs).abs().flatten(1).amax(1)
        rows = (err > tolerance).nonzero().flatten().tolist()
        assert rows == [], (
            f"rows {rows} differ by {err[rows].tolist()} (positions "
            f"{positions[rows].tolist()}); {state}, {torch.get_num_threads()} "
            f"threads, CPU capability {torch.backends.cpu.get_cpu_capability()}"
        )
    if scaling is not None:  # the inputs reach the scaled frequencies: a scaling bug would show
        plain_q, _ = RotaryEmbedding(head_dim, max_pos, base).forward(positions, q, k)
        assert (plain_q - oq).abs().max() > 0.1


def test_rope_keeps_norms_and_position_zero():
    """A rotation: position 0 is the identity, and each pair (i, i + D/2) keeps its length."""
    rope = RotaryEmbedding(16, 64, 10000.0)
    q, k = torch.randn(5, 2, 16), torch.randn(5, 1, 16)
    positions = torch.tensor([0, 1, 7, 30, 63])
    oq, ok = rope.forward(positions, q, k)
    assert torch.allclose(oq[0], q[0]) and torch.allclose(ok[0], k[0])

    def pair_norms(x: torch.Tensor) -> torch.Tensor:
        return x[..., :8] ** 2 + x[..., 8:] ** 2

    assert torch.allclose(pair_norms(oq), pair_norms(q), atol=1e-5)


def test_unknown_rope_type_is_refused():
    with pytest.raises(ValueError, match="'dynamic'.*default, llama3, yarn"):
        rope_frequencies(64, 10000.0, {"rope_type": "dynamic", "factor": 2.0})


# ---- ModelConfig ----------------------------------------------------------------------------


def test_config_of_every_tiny_model(tiny_models):
    llama = _config(tiny_models["llama3"])
    assert (llama.architecture, llama.num_layers, llama.hidden_size) == ("LlamaForCausalLM", 2, 64)
    assert (llama.num_qo_heads, llama.num_kv_heads, llama.head_dim) == (4, 2, 16)
    assert llama.rope_theta == 500000.0 and llama.rope_scaling["rope_type"] == "llama3"
    assert llama.rope_scaling["factor"] == 8.0 and llama.dtype == torch.float32
    assert not (llama.attention_bias or llama.qk_norm or llama.tie_word_embeddings or llama.is_moe)
    qwen2 = _config(tiny_models["qwen2"])
    assert qwen2.attention_bias and not qwen2.o_proj_bias and qwen2.tie_word_embeddings
    assert qwen2.rope_scaling is None and qwen2.rope_theta == 1000000.0
    qwen3 = _config(tiny_models["qwen3"])
    assert qwen3.qk_norm and not qwen3.attention_bias and qwen3.rope_scaling["rope_type"] == "yarn"
    assert not _config(tiny_models["mistral"]).attention_bias
    moe = _config(tiny_models["qwen3moe"])
    assert moe.architecture == "Qwen3MoeForCausalLM" and moe.is_moe and moe.qk_norm
    assert (moe.num_experts, moe.num_experts_per_tok, moe.moe_intermediate_size) == (8, 2, 32)
    assert moe.norm_topk_prob is True and moe.decoder_sparse_step == 1 and moe.mlp_only_layers == []
    assert moe.is_moe_layer(0) and moe.is_moe_layer(1)


def test_config_older_layout_and_nesting():
    """transformers 4 wrote rope_theta and rope_scaling apart ("type" in older files); multimodal
    configs nest the language model under text_config."""
    old = {
        "architectures": ["Qwen3MoeForCausalLM"],
        "model_type": "qwen3_moe",
        "vocab_size": 1000,
        "hidden_size": 256,
        "intermediate_size": 512,
        "num_hidden_layers": 6,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
        "rms_norm_eps": 1e-5,
        "max_position_embeddings": 40960,
        "rope_theta": 1000000.0,
        "torch_dtype": "bfloat16",
        "rope_scaling": {"type": "yarn", "factor": 4.0},
        "num_experts": 16,
        "num_experts_per_tok": 4,
        "moe_intermediate_size": 64,
        "decoder_sparse_step": 2,
        "mlp_only_layers": [3],
    }
    c = ModelConfig.from_dict(old)
    assert c.head_dim == 32 and c.dtype == torch.bfloat16 and c.rope_theta == 1000000.0
    assert c.rope_scaling == {
        "rope_type": "yarn",
        "factor": 4.0,
        "original_max_position_embeddings": 40960,
    }
    assert c.num_experts == 16 and c.norm_topk_prob is False  # the HF default
    assert [c.is_moe_layer(i) for i in range(6)] == [False, True, False, False, False, True]
    nested = ModelConfig.from_dict(
        {
            "architectures": ["LlamaForCausalLM"],
            "text_config": {
                k: v for k, v in old.items() if k not in ("architectures", "model_type")
            },
        }
    )
    assert nested.num_layers == 6 and nested.architecture == "LlamaForCausalLM"
    with pytest.raises(ValueError, match="architectures"):
        ModelConfig.from_dict({k: v for k, v in old.items() if k != "architectures"})


@pytest.mark.parametrize(
    "extra, message",
    [
        ({"sliding_window": 4096}, "sliding-window attention"),
        ({"partial_rotary_factor": 0.5}, "partial rotary"),
        ({"mlp_bias": True}, "mlp_bias"),
    ],
)
def test_config_refuses_what_the_decoder_does_not_implement(tiny_models, extra, message):
    raw = json.loads((tiny_models["mistral"] / "config.json").read_text())
    with pytest.raises(ValueError, match=message):
        ModelConfig.from_dict({**raw, **extra, "max_position_embeddings": 32768})
    # a window no shorter than the context, or one switched off (Qwen2), changes nothing
    ModelConfig.from_dict({**raw, "sliding_window": 32768, "max_position_embeddings": 32768})
    ModelConfig.from_dict({**raw, "sliding_window": 4096, "use_sliding_window": False})


# ---- registry and model ---------------------------------------------------------------------


def test_registry_maps_the_five_architectures_to_one_decoder(tiny_models):
    names = [
        "LlamaForCausalLM",
        "Qwen2ForCausalLM",
        "Qwen3ForCausalLM",
        "MistralForCausalLM",
        "Qwen3MoeForCausalLM",
    ]
    assert len({get_model_class(n) for n in names}) == 1
    config = _config(tiny_models["llama3"])
    config.architecture = "GPT2LMHeadModel"
    known = r"LlamaForCausalLM.*Qwen3MoeForCausalLM"
    with pytest.raises(ValueError, match=r"unknown model architecture 'GPT2LMHeadModel'.*" + known):
        create_model(config)


def test_weight_names_mirror_transformers(tiny_models):
    names = set(create_model(_config(tiny_models["qwen3"])).state_dict())
    for name in [
        "model.embed_tokens.weight",
        "model.layers.0.self_attn.qkv_proj.weight",
        "model.layers.1.self_attn.q_norm.weight",
        "model.layers.0.self_attn.o_proj.weight",
        "model.layers.0.mlp.gate_up_proj.weight",
        "model.layers.1.mlp.down_proj.weight",
        "model.layers.0.input_layernorm.weight",
        "model.norm.weight",
        "lm_head.weight",
        "model.layers.1.post_attention_layernorm.weight",
    ]:
        assert name in names
    qwen2 = create_model(_config(tiny_models["qwen2"]))
    sd = qwen2.state_dict()
    assert sd["model.layers.0.self_attn.qkv_proj.bias"].shape == ((4 + 2 + 2) * 16,)
    assert "model.layers.0.self_attn.o_proj.bias" not in sd
    assert sd["lm_head.weight"] is sd["model.embed_tokens.weight"]  # tied: one tensor


def test_weights_take_the_default_dtype():
    config = ModelConfig.from_dict(
        {
            "architectures": ["LlamaForCausalLM"],
            "vocab_size": 32,
            "hidden_size": 16,
            "intermediate_size": 32,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "max_position_embeddings": 64,
        }
    )
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        model = create_model(config)
    finally:
        torch.set_default_dtype(old)
    assert {t.dtype for t in model.state_dict().values()} == {torch.bfloat16}


@pytest.mark.parametrize("family", DENSE)
def test_logits_match_transformers(tiny_models, family):
    path = tiny_models[family]
    model = create_model(_config(path))
    copy_hf_weights(hf_model(path), model)
    long = encode(path, " ".join(PROMPTS)) * 6
    assert len(long) > 128  # past the original context of llama3 (64) and yarn (128)
    for ids in [encode(path, p) for p in PROMPTS] + [long, [7]]:
        ours, ref = sequence_logits(model, ids), hf_logits(path, ids)
        assert ours.shape == (len(ids), _config(path).vocab_size) and ours.dtype == torch.float32
        assert (ours - ref).abs().max() < 1e-4, family


def test_llama3_greedy_tokens_past_the_original_context_match_transformers(tiny_models):
    """Llama 3's rope scaling, token by token: eight greedy tokens after a prompt longer than
    the tiny model's original 64 positions, each the argmax of the whole sequence's last row."""
    path = tiny_models["llama3"]
    model = create_model(_config(path))
    copy_hf_weights(hf_model(path), model)
    prompt = encode(path, "The quick brown fox jumps over the lazy dog. " * 8)
    assert len(prompt) > 64
    ids = list(prompt)
    for _ in range(8):
        ids.append(int(sequence_logits(model, ids)[-1].argmax()))
    assert ids[len(prompt) :] == hf_greedy(path, [prompt], 8)[0]


def test_position_t_sees_only_tokens_up_to_t(tiny_models):
    path = tiny_models["mistral"]
    model = create_model(_config(path))
    copy_hf_weights(hf_model(path), model)
    ids = encode(path, PROMPTS[2])
    full, prefix = sequence_logits(model, ids), sequence_logits(model, ids[:6])
    assert torch.allclose(full[:6], prefix, atol=1e-5)
    changed = sequence_logits(model, ids[:6] + [ids[6] + 1] + ids[7:])
    assert torch.allclose(full[:6], changed[:6], atol=1e-5)  # before the change: untouched
    assert all((full[t] - changed[t]).abs().max() > 1e-2 for t in range(6, len(ids)))


@pytest.mark.parametrize(
    "scaling",
    [
        # a low_freq_factor other than 1: the long-wavelength bound old_len / low differs from
        # old_len * low, and wavelengths between the two are scaled, not blended
        dict(
            rope_type="llama3",
            factor=8.0,
            low_freq_factor=2.0,
            high_freq_factor=8.0,
            original_max_position_embeddings=8192,
        ),
        # beta_fast and beta_slow left to their defaults (32, 1) at original lengths where the
        # truncated correction bound of a beta of 33 or 2 would fall on another pair
        dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=2048),
        dict(rope_type="yarn", factor=16.0, original_max_position_embeddings=32768),
    ],
    ids=["llama3-low2", "yarn-2048", "yarn-32768"],
)
def test_rope_frequencies_match_transformers_at_more_settings(scaling):
    """The scaled frequencies alone (no rotation: fast), over head sizes and bases, against
    transformers' own, for settings the tiny models and the test above leave out."""
    for head_dim, base in ((64, 10000.0), (128, 10000.0), (128, 1000000.0)):
        hf = _hf_rope(head_dim, base, scaling, 4 * scaling["original_max_position_embeddings"])
        inv_freq, attention = rope_frequencies(head_dim, base, scaling)
        assert torch.allclose(hf.inv_freq, inv_freq, rtol=1e-5), (head_dim, base)
        assert hf.attention_scaling == pytest.approx(attention), (head_dim, base)
