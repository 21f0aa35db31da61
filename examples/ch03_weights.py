"""Chapter 3: loading a checkpoint, and greedy generation by recomputation.

The weights stream out of the safetensors file one tensor at a time; q/k/v and gate/up are merged
on the way in, and Qwen3-MoE's experts are packed into two 3-D tensors per layer. Then we generate
greedily, running the whole sequence through the model at every step, and compare with
transformers' generate.
"""

from __future__ import annotations

import tempfile

import tiny_models
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers.utils import logging

from minisgl.models import ModelConfig, generate_greedy_recompute, load_model
from minisgl.models.weight import iter_checkpoint, load_weights
from minisgl.utils.hf import read_hf_config

torch.set_num_threads(1)
logging.set_verbosity_error()
logging.disable_progress_bar()

with tempfile.TemporaryDirectory() as tmp:
    models = tiny_models.make_all(tmp)
    path = models["llama3"]
    model = load_model(path)
    config = model.config
    stored = dict(iter_checkpoint(path))
    print(
        f"tiny llama3 checkpoint: {len(stored)} tensors in model.safetensors, "
        f"{len(model.state_dict())} weights in the model"
    )
    print("merged on the way in (layer 0):")
    pre = "model.layers.0"
    for merged, parts in [
        ("self_attn.qkv_proj.weight", ["q_proj", "k_proj", "v_proj"]),
        ("mlp.gate_up_proj.weight", ["gate_proj", "up_proj"]),
    ]:
        kind = merged.split(".")[0]
        shapes = " + ".join(f"{p} {list(stored[f'{pre}.{kind}.{p}.weight'].shape)}" for p in parts)
        print(f"  {merged:26s} {list(model.state_dict()[f'{pre}.{merged}'].shape)} <- {shapes}")
    ours = model.state_dict()
    q, kv = config.num_qo_heads * config.head_dim, config.num_kv_heads * config.head_dim
    inter = config.intermediate_size
    rows = {
        "q_proj": ("qkv_proj", 0, q),
        "k_proj": ("qkv_proj", q, q + kv),
        "v_proj": ("qkv_proj", q + kv, q + 2 * kv),
        "gate_proj": ("gate_up_proj", 0, inter),
        "up_proj": ("gate_up_proj", inter, 2 * inter),
    }

    def in_model(name: str) -> torch.Tensor:
        """The model's rows that hold checkpoint tensor ``name``."""
        part = name.split(".")[-2]
        if part not in rows:
            return ours[name]
        merged, start, end = rows[part]
        return ours[name.replace(part, merged)][start:end]

    print(
        "each checkpoint tensor equals its rows in the model:",
        all(torch.equal(in_model(k), v) for k, v in stored.items()),
    )

    qwen2 = load_model(models["qwen2"])
    has_head = "lm_head.weight" in dict(iter_checkpoint(models["qwen2"]))
    shared = qwen2.lm_head.weight is qwen2.model.embed_tokens.weight  # type: ignore[attr-defined]
    print(
        f"\nqwen2 ties its embeddings: lm_head.weight in the checkpoint: {has_head}; "
        f"the LM head reads the embedding's tensor: {shared}"
    )

    moe_stored = [k for k in iter_checkpoint(models["qwen3moe"]) if ".layers.0.mlp." in k[0]]
    moe_config = ModelConfig.from_dict(read_hf_config(models["qwen3moe"]))
    moe = {k: v for k, v in load_weights(models["qwen3moe"], moe_config) if ".layers.0.mlp." in k}
    print(
        f"qwen3moe layer 0: {len(moe_stored)} MLP tensors in the checkpoint "
        f"(experts.0.down_proj.weight ... experts.7.up_proj.weight, gate.weight), packed into "
        f"{len(moe)}:"
    )
    for name in ("experts.gate_up_proj", "experts.down_proj", "gate.weight"):
        print(f"  model.layers.0.mlp.{name:21s} {list(moe[f'model.layers.0.mlp.{name}'].shape)}")

    tok = AutoTokenizer.from_pretrained(path)
    prompt = "Once upon a time"
    ids = tok.encode(prompt)
    n = 20
    new = generate_greedy_recompute(model, ids, n)
    work = [len(ids) + i for i in range(n)]  # tokens run through the model at step i
    print(f"\ngreedy generation by recomputation, {prompt!r} ({len(ids)} tokens), {n} new tokens:")
    print(f"  new token ids: {new}")
    print(f"  text: {tok.decode(new)!r}")
    print(f"  tokens run per step: {work[:4]} ... {work[-2:]}, {sum(work)} in all")
    print(
        f"  a KV cache (chapter 5) would run {len(ids)} + {n - 1} = {len(ids) + n - 1}: the "
        "prompt once, then one token per step"
    )
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    with torch.no_grad():
        prompt_ids = torch.tensor([ids])
        ref = hf.generate(
            prompt_ids,
            attention_mask=torch.ones_like(prompt_ids),
            max_new_tokens=n,
            do_sample=False,
            eos_token_id=None,
        )
    print("  equal to transformers' generate:", new == ref[0, len(ids) :].tolist())
