"""Chapter 1: ops without nn.Module.

An op is a plain object whose tensor attributes are its weights. We build the pieces of one
attention block, find their weights by walking attributes, fill them from torch's own layers and
check that every op computes what its torch / transformers counterpart computes.
"""

from __future__ import annotations

import torch
from transformers.models.llama.modeling_llama import LlamaRMSNorm

from minisgl.layers.base import BaseOP
from minisgl.layers.embedding import ParallelLMHead, VocabParallelEmbedding
from minisgl.layers.linear import LinearColParallelMerged, LinearQKVMerged, LinearRowParallel
from minisgl.layers.norm import RMSNormFused

torch.manual_seed(0)
torch.set_num_threads(1)
H, D, HQ, HKV, FFN, V, T = 64, 16, 4, 2, 128, 300, 5


def close(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal up to float32 rounding: the printed verdict, never the machine-dependent float."""
    return bool((a - b).abs().max() < 1e-5)


class Block(BaseOP):
    """The ops of one decoder layer (no attention math yet: that is chapter 2)."""

    def __init__(self):
        self.input_layernorm = RMSNormFused(H, eps=1e-6)
        self.qkv_proj = LinearQKVMerged(H, D, HQ, HKV, has_bias=True)
        self.o_proj = LinearRowParallel(HQ * D, H)
        self.gate_up_proj = LinearColParallelMerged(H, [FFN, FFN])
        self._scratch = torch.empty(8)  # private: not a weight


class Tiny(BaseOP):
    def __init__(self):
        self.embed_tokens = VocabParallelEmbedding(V, H)
        self.layers = [Block(), Block()]
        self.lm_head = ParallelLMHead(V, H, tie_to=self.embed_tokens)


model = Tiny()
print("weights found by walking the attributes:")
for name, w in model.state_dict().items():
    if not name.startswith("layers.1."):
        print(f"  {name:32s} {list(w.shape)}")
print(
    f"  ... {len(model.state_dict())} in all; lm_head.weight is the embedding's own tensor:",
    model.lm_head.weight is model.embed_tokens.weight,
)

# fill every weight from torch layers, through load_state_dict
q, k, v = (torch.nn.Linear(H, n * D) for n in (HQ, HKV, HKV))
gate, up = torch.nn.Linear(H, FFN, bias=False), torch.nn.Linear(H, FFN, bias=False)
o_proj = torch.nn.Linear(HQ * D, H, bias=False)
ref_norm = LlamaRMSNorm(H, eps=1e-6)
ref_norm.weight.data.normal_(1.0, 0.1)
embed = torch.nn.Embedding(V, H)
state = {"embed_tokens.weight": embed.weight, "lm_head.weight": embed.weight}
for i in range(2):
    state.update(
        {
            f"layers.{i}.input_layernorm.weight": ref_norm.weight,
            f"layers.{i}.qkv_proj.weight": torch.cat([q.weight, k.weight, v.weight]),
            f"layers.{i}.qkv_proj.bias": torch.cat([q.bias, k.bias, v.bias]),
            f"layers.{i}.o_proj.weight": o_proj.weight,
            f"layers.{i}.gate_up_proj.weight": torch.cat([gate.weight, up.weight]),
        }
    )
model.load_state_dict(state)

print("\neach op against torch / transformers (True: max |diff| < 1e-5):")
with torch.no_grad():
    ids = torch.randint(0, V, (T,))
    x = model.embed_tokens.forward(ids)
    print(
        f"  embedding        ids {list(ids.shape)} -> x {list(x.shape)}:",
        torch.equal(x, embed(ids)),
    )
    block = model.layers[0]
    normed, residual = block.input_layernorm.forward(x)
    print("  RMSNorm          vs LlamaRMSNorm:", close(normed, ref_norm(x)))
    r = torch.randn(T, H)
    normed, residual = block.input_layernorm.forward(x, r)
    print(
        "  add + RMSNorm    norm(x + r):",
        close(normed, ref_norm(x + r)),
        "| new residual x + r:",
        torch.equal(residual, x + r),
    )
    oq, ok, ov = block.qkv_proj.split(block.qkv_proj.forward(normed))
    print(
        f"  one QKV matmul   q {list(oq.shape)} k {list(ok.shape)} v {list(ov.shape)}:",
        close(oq, q(normed)),
        close(ok, k(normed)),
        close(ov, v(normed)),
    )
    gu = block.gate_up_proj.forward(normed)
    print(
        f"  one gate_up      {list(gu.shape)}: gate",
        close(gu[:, :FFN], gate(normed)),
        "up",
        close(gu[:, FFN:], up(normed)),
    )
    o = block.o_proj.forward(oq)
    print(f"  o_proj           {list(oq.shape)} -> {list(o.shape)}:", close(o, o_proj(oq)))
    logits = model.lm_head.forward(x)
    print(
        f"  tied LM head     {list(x.shape)} -> logits {list(logits.shape)}:",
        close(logits, x @ embed.weight.T),
    )

try:
    model.load_state_dict({k: w for k, w in state.items() if k != "layers.1.o_proj.weight"})
except ValueError as e:
    print("\na checkpoint without one weight:", e)
try:
    model.load_state_dict({**state, "layers.0.o_proj.weight": torch.zeros(H, H + 1)})
except ValueError as e:
    print("a weight of the wrong shape:", e)
