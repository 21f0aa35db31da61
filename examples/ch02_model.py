"""Chapter 2: the decoder.

One generic decoder serves Llama 3, Qwen2, Qwen3, Mistral and Qwen3-MoE; what differs is a config
flag. We build it from a tiny random-weight model's config.json, copy the weights over from the
transformers model in memory (chapter 3 reads checkpoints), and compare the logits.
"""

from __future__ import annotations

import json
import re
import tempfile
from pathlib import Path

import tiny_models
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers.utils import logging

from minisgl.layers.rotary import rope_frequencies
from minisgl.models import ModelConfig, create_model, get_model_class, sequence_logits

torch.manual_seed(0)
torch.set_num_threads(1)
logging.set_verbosity_error()
logging.disable_progress_bar()


def to_minisgl(hf_state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """transformers' weights under minisgl's names: q/k/v -> qkv_proj, gate/up -> gate_up_proj."""
    out = {}
    for key, value in hf_state.items():
        if m := re.fullmatch(r"(.*)\.q_proj\.(weight|bias)", key):
            parts = [hf_state[f"{m[1]}.{p}_proj.{m[2]}"] for p in "qkv"]
            out[f"{m[1]}.qkv_proj.{m[2]}"] = torch.cat(parts)
        elif m := re.fullmatch(r"(.*)\.gate_proj\.weight", key):
            up = hf_state[f"{m[1]}.up_proj.weight"]
            out[f"{m[1]}.gate_up_proj.weight"] = torch.cat([value, up])
        elif not re.search(r"\.(k|v|up)_proj\.", key):
            out[key] = value
    return out


def load_both(path: Path):
    config = ModelConfig.from_dict(json.loads((path / "config.json").read_text()))
    model = create_model(config)  # torch.empty weights ...
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    model.load_state_dict(to_minisgl(hf.state_dict()))  # ... filled from transformers'
    return config, model, hf


with tempfile.TemporaryDirectory() as tmp:
    path = tiny_models.make_tiny_model("llama3", Path(tmp) / "llama3")
    config, model, hf = load_both(path)
    print(
        f"tiny {config.architecture}: {config.num_layers} layers, hidden {config.hidden_size}, "
        f"{config.num_qo_heads} query heads and {config.num_kv_heads} KV heads of "
        f"{config.head_dim}, vocab {config.vocab_size}"
    )
    print("its weights, under Hugging Face's names (layer 0 of 2):")
    for name, w in model.state_dict().items():
        if ".layers.1." not in name:
            print(f"  {name:47s} {list(w.shape)}")

    tok = AutoTokenizer.from_pretrained(path)
    ids = tok.encode("The quick brown fox")
    logits = sequence_logits(model, ids)
    with torch.no_grad():
        ref = hf(torch.tensor([ids])).logits[0]
    print(f"\n'The quick brown fox' -> {len(ids)} tokens {ids}: {[tok.decode([i]) for i in ids]}")
    print(
        f"logits {list(logits.shape)} against transformers, max |diff| < 1e-4:",
        bool((logits - ref).abs().max() < 1e-4),
    )
    nxt = int(logits[-1].argmax())
    print(
        f"most likely next token: {nxt} {tok.decode([nxt])!r}, transformers says",
        int(ref[-1].argmax()),
    )

    inv, _ = rope_frequencies(config.head_dim, config.rope_theta, config.rope_scaling)
    plain, _ = rope_frequencies(config.head_dim, config.rope_theta, None)
    kept = int(torch.isclose(inv, plain).sum())
    slowed = int(torch.isclose(inv, plain / config.rope_scaling["factor"]).sum())
    print(
        f"\nRoPE llama3 scaling over the {len(inv)} frequency pairs of a head: {kept} kept, "
        f"{slowed} divided by {config.rope_scaling['factor']:g}, {len(inv) - kept - slowed} "
        "blended"
    )

    print("\none decoder, the families differ by config flags:")
    print(f"  {'family':9s}{'QKV bias':10s}{'q/k norm':10s}{'rope':9s}{'tied':6s}logits match")
    for family in ("llama3", "qwen2", "qwen3", "mistral"):
        p = tiny_models.make_tiny_model(family, Path(tmp) / family)
        c, m, h = load_both(p)
        ids = tok.encode("Once upon a time there was a small robot who lived in a library.")
        with torch.no_grad():
            diff = (sequence_logits(m, ids) - h(torch.tensor([ids])).logits[0]).abs().max()
        rope = c.rope_scaling["rope_type"] if c.rope_scaling else "default"
        print(
            f"  {family:9s}{str(c.attention_bias):10s}{str(c.qk_norm):10s}{rope:9s}"
            f"{str(c.tie_word_embeddings):6s}{bool(diff < 1e-4)}"
        )

    p = tiny_models.make_tiny_model("qwen3moe", Path(tmp) / "qwen3moe")
    c = ModelConfig.from_dict(json.loads((p / "config.json").read_text()))
    print(
        f"\n{c.architecture} -> {get_model_class(c.architecture).__name__} too: "
        f"{c.num_experts} experts, top-{c.num_experts_per_tok}, norm_topk_prob "
        f"{c.norm_topk_prob}; its expert MLP arrives in chapter 20"
    )
