"""Chapter 16: Triton kernels.

The KV store and paged attention for decode (split-K) and for extend (a cached prefix plus new
tokens, causal), each checked against the torch reference; the LM head run only on the rows that
are sampled; then the same tokens from the engine with either backend, or one for prefill and
another for decode. On a CPU the kernels run in Triton's interpreter, on a GPU compiled.
"""

from __future__ import annotations

import os
from pathlib import Path

if not Path("/dev/nvidia0").exists():  # no GPU: interpret; chosen before triton is imported
    os.environ.setdefault("TRITON_INTERPRET", "1")

import tempfile  # noqa: E402

import tiny_models  # noqa: E402
import torch  # noqa: E402

from minisgl.attention.utils import attend  # noqa: E402
from minisgl.core import SamplingParams  # noqa: E402
from minisgl.kernel import decode_attention, extend_attention, store_kv  # noqa: E402
from minisgl.llm import LLM  # noqa: E402

torch.set_num_threads(1)
gen = torch.Generator().manual_seed(0)
HQ, HKV, D, PAGE = 4, 2, 16, 3  # grouped-query attention: 2 query heads read each KV head

# A pool of 20 pages of 3 tokens; two requests own pages scattered through it.
pages = {0: [7, 2, 12, 5], 1: [0, 15, 9, 3, 18, 11]}
lens = {0: 11, 1: 17}
k_cache = torch.zeros(20 * PAGE, HKV, D)
v_cache = torch.zeros(20 * PAGE, HKV, D)
table = torch.zeros(2, 18, dtype=torch.int32)
for row, owned in pages.items():
    pos = torch.arange(lens[row])
    table[row, : lens[row]] = torch.tensor(owned)[pos // PAGE] * PAGE + pos % PAGE
print(f"page table (slot of each token, page size {PAGE}):")
for row in pages:
    print(f"  request {row}: {table[row, : lens[row]].tolist()}")

# Every token's K and V, stored by the kernel into the slots the table names.
slots = torch.cat([table[r, : lens[r]] for r in pages])
k = torch.randn(len(slots), HKV, D, generator=gen)
v = torch.randn(len(slots), HKV, D, generator=gen)
store_kv(k_cache, v_cache, slots, k, v)
written = (k_cache.abs().sum((1, 2)) > 0).sum().item()
exact = torch.equal(k_cache[slots.long()], k) and torch.equal(v_cache[slots.long()], v)
print(f"store_kv: {len(slots)} tokens into {written} of {len(k_cache)} slots, exactly: {exact}")


def check(name: str, out: torch.Tensor, ref: torch.Tensor) -> None:
    close = torch.allclose(out, ref, atol=1e-5, rtol=1e-5)
    print(f"{name}: out {list(out.shape)}, equal to the reference within 1e-5: {close}")


# Decode: each request's last token attends over all of its tokens, in 4 splits.
rows = torch.tensor([0, 1], dtype=torch.int32)
seq_lens = torch.tensor([lens[0], lens[1]], dtype=torch.int32)
q = torch.randn(2, HQ, D, generator=gen)
out = decode_attention(q, k_cache, v_cache, table, rows, seq_lens, D**-0.5, num_kv_splits=4)
ref = torch.cat(
    [
        attend(q[i : i + 1], k_cache[table[i, :n].long()], v_cache[table[i, :n].long()], n - 1)
        for i, n in enumerate(lens.values())
    ]
)
check("decode_attention (split-K, 4 splits)", out, ref)

# Extend: request 0 has 8 tokens cached and brings 3; request 1 is a prefill of all 17.
cached, extend = [8, 0], [3, 17]
q = torch.randn(sum(extend), HQ, D, generator=gen)
i32 = lambda xs: torch.tensor(xs, dtype=torch.int32)  # noqa: E731
out = extend_attention(
    q, k_cache, v_cache, table, rows, i32(cached), i32(extend), i32([0, 3]), max(extend), D**-0.5
)
ref = torch.cat(
    [
        attend(qr, k_cache[table[i, : c + e].long()], v_cache[table[i, : c + e].long()], c)
        for i, (qr, c, e) in enumerate(zip(q.split(extend), cached, extend))
    ]
)
check("extend_attention (prefix hit + prefill)", out, ref)

# The LM head on the sampled rows only: at Qwen3-0.6B's shape, a prefill of 1,000 tokens.
hidden, vocab, tokens, body = 1024, 151_936, 1_000, 440_000_000
head_all, head_last = 2 * tokens * hidden * vocab, 2 * hidden * vocab
print(
    f"LM head, a 1,000-token prefill at Qwen3-0.6B's shape: {head_all / 1e9:.0f} GFLOP on "
    f"every row, {head_last / 1e9:.1f} on the last\n  (its 28 layers: "
    f"{2 * tokens * body / 1e9:.0f} GFLOP)"
)

with tempfile.TemporaryDirectory() as tmp:
    path = str(tiny_models.make_tiny_model("qwen3", f"{tmp}/qwen3"))
    prompts = [[5, 9, 200, 17, 3, 8, 44], [4, 4, 4], list(range(30, 62))]
    greedy = SamplingParams(max_tokens=5, ignore_eos=True)
    results = {}
    for backend in ["torch", "triton", "triton,torch"]:
        llm = LLM(path, device="cpu", page_size=PAGE, attention_backend=backend)
        results[backend] = [out["token_ids"] for out in llm.generate(prompts, greedy)]
        print(f"{backend:>12}: {results[backend]}")
    print(f"same tokens with every backend: {len({str(r) for r in results.values()}) == 1}")
